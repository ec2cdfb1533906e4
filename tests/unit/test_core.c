/* Unit tests for the VMM core that need no KVM: options, memory layout, buses, loader, legacy devices. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <elf.h>

#include "vmm/bus.h"
#include "vmm/guest_mem.h"
#include "devices/i8042.h"
#include "vmm/loader.h"
#include "vmm/mptable.h"
#include "sandbox/options.h"
#include "vmm/x86_boot.h"
#include "devices/serial.h"

/* ---- options ---- */

static int parse(struct run_opts *o, char *err, size_t errlen, int argc, ...)
{
	char *argv[32];
	va_list ap;
	va_start(ap, argc);
	argv[0] = "run";
	for (int i = 1; i < argc; i++)
		argv[i] = va_arg(ap, char *);
	va_end(ap);
	argv[argc] = NULL;
	return run_opts_parse(argc, argv, o, err, errlen);
}

static void test_options_defaults(void **state)
{
	(void)state;
	struct run_opts o;
	char err[256] = "";
	assert_int_equal(parse(&o, err, sizeof(err), 3, "--kernel", "k"), 0);
	assert_string_equal(o.kernel, "k");
	assert_int_equal(o.mem_size, 256ULL << 20);
	assert_int_equal(o.vcpus, 1);
	assert_string_equal(o.cmdline, "");
	assert_null(o.api_sock);
	assert_null(o.console);
	assert_int_equal(o.log_level, LOG_WARN);
	assert_false(o.track_dirty);
	assert_int_equal(parse(&o, err, sizeof(err), 4, "--kernel", "k", "--track-dirty-pages"), 0);
	assert_true(o.track_dirty);
}

static void test_options_all(void **state)
{
	(void)state;
	struct run_opts o;
	char err[256] = "";
	assert_int_equal(parse(&o, err, sizeof(err), 17, "--kernel", "k", "--initrd", "i",
			       "--cmdline", "console=ttyS0", "--mem", "4G", "--vcpus", "4",
			       "--api-sock", "/tmp/s", "--console", "/tmp/c", "--log-level",
			       "debug"),
			 0);
	assert_string_equal(o.initrd, "i");
	assert_string_equal(o.cmdline, "console=ttyS0");
	assert_int_equal(o.mem_size, 4ULL << 30);
	assert_int_equal(o.vcpus, 4);
	assert_string_equal(o.api_sock, "/tmp/s");
	assert_string_equal(o.console, "/tmp/c");
	assert_int_equal(o.log_level, LOG_DEBUG);
	/* Parsing twice gives the same result: getopt state is reset. */
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k2", "--vcpus", "2"), 0);
	assert_string_equal(o.kernel, "k2");
	assert_int_equal(o.vcpus, 2);
}

static void test_options_errors(void **state)
{
	(void)state;
	struct run_opts o;
	char err[256];
	assert_int_equal(parse(&o, err, sizeof(err), 1), -EINVAL);
	assert_non_null(strstr(err, "--kernel"));
	assert_int_equal(parse(&o, err, sizeof(err), 4, "--kernel", "k", "--what"), -EINVAL);
	assert_non_null(strstr(err, "--what"));
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--mem", "12Q"), -EINVAL);
	assert_non_null(strstr(err, "12Q"));
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--mem", "1M"), -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--vcpus", "65"), -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--vcpus", "-1"), -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--vcpus", "2x"), -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--log-level", "x"), -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 2, "--kernel"), -EINVAL);
	assert_non_null(strstr(err, "needs a value"));
	assert_int_equal(parse(&o, err, sizeof(err), 4, "--kernel", "k", "extra"), -EINVAL);
	assert_non_null(strstr(err, "extra"));
	assert_int_equal(parse(&o, err, sizeof(err), 2, "--help"), 1);
	char *longline = malloc(5000);
	memset(longline, 'a', 4999);
	longline[4999] = 0;
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--cmdline", longline),
			 -EINVAL);
	free(longline);
}

static void test_options_disks(void **state)
{
	(void)state;
	struct run_opts o;
	char err[256];
	assert_int_equal(parse(&o, err, sizeof(err), 7, "--kernel", "k", "--disk", "/a/root.ext4",
			       "--disk", "b.img,ro"),
			 0);
	assert_int_equal(o.nr_disks, 2);
	assert_string_equal(o.disks[0].path, "/a/root.ext4");
	assert_false(o.disks[0].read_only);
	assert_string_equal(o.disks[1].path, "b.img");
	assert_true(o.disks[1].read_only);

	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", ",ro"), -EINVAL);
	assert_non_null(strstr(err, "no path"));
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", ""), -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", "a,rw"), -EINVAL);
	assert_non_null(strstr(err, "unknown option 'rw'"));
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", "a,ro,"), -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", "a,roo"), -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", "a,overlay=b"), 0);
	assert_string_equal(o.disks[0].path, "a");
	assert_string_equal(o.disks[0].overlay, "b");
	assert_false(o.disks[0].read_only);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", "a,overlay="),
			 -EINVAL);
	assert_non_null(strstr(err, "needs a path"));
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", "a,ro,overlay=b"),
			 -EINVAL);
	assert_non_null(strstr(err, "do not go together"));
	assert_null(strchr(err, '\n'));

	/* At most 8. */
	char *argv[32] = { "run", "--kernel", "k" };
	int argc = 3;
	for (int i = 0; i < 9; i++) {
		argv[argc++] = "--disk";
		argv[argc++] = "d.img";
	}
	argv[argc] = NULL;
	assert_int_equal(run_opts_parse(argc, argv, &o, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "at most 8"));
	assert_int_equal(run_opts_parse(argc - 2, argv, &o, err, sizeof(err)), 0);
	assert_int_equal(o.nr_disks, 8);

	struct disk_opt d;
	char *longpath = malloc(RUN_DISK_PATH_MAX + 10);
	memset(longpath, 'p', RUN_DISK_PATH_MAX + 9);
	longpath[RUN_DISK_PATH_MAX + 9] = 0;
	assert_int_equal(parse_disk_opt(longpath, &d, err, sizeof(err)), -EINVAL);
	free(longpath);
	assert_int_equal(parse_disk_opt("x,overlay=y", &d, err, sizeof(err)), 0);
	assert_string_equal(d.overlay, "y");
	assert_int_equal(parse_disk_opt("x", &d, err, sizeof(err)), 0);
	assert_string_equal(d.overlay, "");
}

static void test_mem_size(void **state)
{
	(void)state;
	uint64_t v;
	assert_int_equal(parse_mem_size("256", &v), 0);
	assert_int_equal(v, 256ULL << 20);
	assert_int_equal(parse_mem_size("256M", &v), 0);
	assert_int_equal(v, 256ULL << 20);
	assert_int_equal(parse_mem_size("2G", &v), 0);
	assert_int_equal(v, 2ULL << 30);
	assert_int_equal(parse_mem_size("2GiB", &v), 0);
	assert_int_equal(v, 2ULL << 30);
	assert_int_equal(parse_mem_size("4096K", &v), 0);
	assert_int_equal(v, 4ULL << 20);
	assert_int_equal(parse_mem_size("8192B", &v), 0);
	assert_int_equal(v, 8192);
	assert_int_equal(parse_mem_size("", &v), -EINVAL);
	assert_int_equal(parse_mem_size("-1G", &v), -EINVAL);
	assert_int_equal(parse_mem_size("G", &v), -EINVAL);
	assert_int_equal(parse_mem_size("1GG", &v), -EINVAL);
	assert_int_equal(parse_mem_size("99999999999999999999G", &v), -EINVAL);
	assert_int_equal(parse_mem_size("99999999999G", &v), -ERANGE);
}

/* ---- guest memory layout ---- */

static void test_mem_layout_small(void **state)
{
	(void)state;
	struct mem_slot s[MEM_MAX_SLOTS];
	uint32_t n;
	assert_int_equal(guest_mem_layout(256ULL << 20, s, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(s[0].gpa, 0);
	assert_int_equal(s[0].size, 256ULL << 20);
	assert_int_equal(guest_mem_layout(MMIO_HOLE_START, s, &n), 0);
	assert_int_equal(n, 1);
}

static void test_mem_layout_hole(void **state)
{
	(void)state;
	struct mem_slot s[MEM_MAX_SLOTS];
	uint32_t n;
	assert_int_equal(guest_mem_layout(4ULL << 30, s, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(s[0].gpa, 0);
	assert_int_equal(s[0].size, MMIO_HOLE_START);
	assert_int_equal(s[1].gpa, 1ULL << 32);
	assert_int_equal(s[1].size, (4ULL << 30) - MMIO_HOLE_START);
	assert_int_equal(s[1].file_off, MMIO_HOLE_START);
	assert_int_equal(guest_mem_layout(0, s, &n), -EINVAL);
	assert_int_equal(guest_mem_layout((256ULL << 20) + 1, s, &n), -EINVAL);
	assert_int_equal(guest_mem_layout(MEM_MAX_SIZE + PAGE_SIZE, s, &n), -EINVAL);
}

static void test_mem_ptr_checks(void **state)
{
	(void)state;
	struct guest_mem m;
	assert_int_equal(guest_mem_create(&m, 4ULL << 30), 0);
	assert_non_null(guest_mem_ptr(&m, 0, 4096));
	assert_ptr_equal(guest_mem_ptr(&m, 0x1000, 1), m.host + 0x1000);
	/* Last byte below the hole is RAM; the hole is not; straddling the hole is not. */
	assert_non_null(guest_mem_ptr(&m, MMIO_HOLE_START - 1, 1));
	assert_null(guest_mem_ptr(&m, MMIO_HOLE_START - 1, 2));
	assert_null(guest_mem_ptr(&m, MMIO_HOLE_START, 1));
	assert_null(guest_mem_ptr(&m, 0xfee00000, 4));
	/* Above 4 GiB maps to the memfd right after low RAM. */
	assert_ptr_equal(guest_mem_ptr(&m, 1ULL << 32, 8), m.host + MMIO_HOLE_START);
	assert_non_null(guest_mem_ptr(&m, guest_mem_end(&m) - 8, 8));
	assert_null(guest_mem_ptr(&m, guest_mem_end(&m) - 8, 9));
	/* Lengths and addresses chosen to wrap 64-bit arithmetic. */
	assert_null(guest_mem_ptr(&m, 0x1000, UINT64_MAX));
	assert_null(guest_mem_ptr(&m, UINT64_MAX, 2));
	assert_null(guest_mem_ptr(&m, UINT64_MAX - 0xfff, 0x2000));
	assert_int_equal(guest_mem_page_index(&m, 1ULL << 32), (int64_t)(MMIO_HOLE_START >> 12));
	assert_int_equal(guest_mem_page_index(&m, MMIO_HOLE_START), -1);
	guest_mem_destroy(&m);
}

/* ---- buses ---- */

struct fake_dev {
	uint64_t last_off;
	uint8_t last_val;
	int reads, writes;
};

static void fake_read(void *opaque, uint64_t off, uint8_t *data, uint32_t len)
{
	struct fake_dev *d = opaque;
	d->reads++;
	d->last_off = off;
	memset(data, 0xab, len);
}

static void fake_write(void *opaque, uint64_t off, const uint8_t *data, uint32_t len)
{
	struct fake_dev *d = opaque;
	(void)len;
	d->writes++;
	d->last_off = off;
	d->last_val = data[0];
}

static const struct io_ops fake_ops = { .name = "fake", .read = fake_read, .write = fake_write };

static void test_bus_dispatch(void **state)
{
	(void)state;
	struct bus b;
	struct fake_dev d1 = { 0 }, d2 = { 0 };
	bus_init(&b, "test");
	assert_int_equal(bus_register(&b, 0x3f8, 8, &fake_ops, &d1), 0);
	assert_int_equal(bus_register(&b, 0x60, 5, &fake_ops, &d2), 0);
	uint8_t v = 0x42, out[8];
	assert_int_equal(bus_write(&b, 0x3fb, &v, 1), 0);
	assert_int_equal(d1.writes, 1);
	assert_int_equal(d1.last_off, 3);
	assert_int_equal(d1.last_val, 0x42);
	assert_int_equal(bus_read(&b, 0x64, out, 1), 0);
	assert_int_equal(d2.reads, 1);
	assert_int_equal(d2.last_off, 4);
	assert_int_equal(out[0], 0xab);
	/* Unassigned: reads see all-ones, writes go nowhere. */
	memset(out, 0, sizeof(out));
	assert_int_equal(bus_read(&b, 0x510, out, 4), -ENOENT);
	assert_int_equal(out[0], 0xff);
	assert_int_equal(out[3], 0xff);
	assert_int_equal(bus_write(&b, 0x510, &v, 1), -ENOENT);
	/* An access straddling a range end belongs to nobody. */
	assert_int_equal(bus_read(&b, 0x3fe, out, 4), -ENOENT);
	assert_int_equal(d1.reads, 0);
	/* Bad lengths. */
	assert_int_equal(bus_read(&b, 0x3f8, out, 3), -EINVAL);
	assert_int_equal(bus_read(&b, 0x3f8, out, 0), -EINVAL);
}

static void test_bus_register_rules(void **state)
{
	(void)state;
	struct bus b;
	struct fake_dev d = { 0 };
	bus_init(&b, "test");
	assert_int_equal(bus_register(&b, 0x1000, 0x100, &fake_ops, &d), 0);
	assert_int_equal(bus_register(&b, 0x10ff, 1, &fake_ops, &d), -EEXIST);
	assert_int_equal(bus_register(&b, 0xf00, 0x101, &fake_ops, &d), -EEXIST);
	assert_int_equal(bus_register(&b, 0x0, 0x10000, &fake_ops, &d), -EEXIST);
	assert_int_equal(bus_register(&b, 0xf00, 0x100, &fake_ops, &d), 0);
	assert_int_equal(bus_register(&b, 0x1100, 0x100, &fake_ops, &d), 0);
	assert_int_equal(bus_register(&b, 0x5000, 0, &fake_ops, &d), -EINVAL);
	assert_int_equal(bus_register(&b, UINT64_MAX, 2, &fake_ops, &d), -EINVAL);
	assert_int_equal(bus_register(&b, 0x5000, 1, NULL, &d), -EINVAL);
	/* Sorted order is kept whatever the registration order. */
	for (size_t i = 1; i < b.nr; i++)
		assert_true(b.ranges[i - 1].base < b.ranges[i].base);
	for (uint64_t i = 0; b.nr < BUS_MAX_RANGES; i++)
		assert_int_equal(bus_register(&b, 0x100000 + i * 0x10, 0x10, &fake_ops, &d), 0);
	assert_int_equal(bus_register(&b, 0x900000, 1, &fake_ops, &d), -ENOSPC);
	assert_non_null(bus_find(&b, 0x100005, 1));
	assert_null(bus_find(&b, 0x50, 1));
}

/* ---- loader ---- */

struct elf_img {
	Elf64_Ehdr eh;
	Elf64_Phdr ph[2];
	uint8_t code[64];
};

static void make_elf(struct elf_img *img)
{
	memset(img, 0, sizeof(*img));
	memcpy(img->eh.e_ident, ELFMAG, SELFMAG);
	img->eh.e_ident[EI_CLASS] = ELFCLASS64;
	img->eh.e_ident[EI_DATA] = ELFDATA2LSB;
	img->eh.e_type = ET_EXEC;
	img->eh.e_machine = EM_X86_64;
	img->eh.e_entry = 0x100010;
	img->eh.e_phoff = offsetof(struct elf_img, ph);
	img->eh.e_phentsize = sizeof(Elf64_Phdr);
	img->eh.e_phnum = 2;
	img->ph[0] = (Elf64_Phdr){ .p_type = PT_LOAD,
				   .p_offset = offsetof(struct elf_img, code),
				   .p_paddr = 0x100000,
				   .p_filesz = sizeof(img->code),
				   .p_memsz = 0x2000 };
	img->ph[1] = (Elf64_Phdr){ .p_type = PT_NOTE, .p_offset = 0, .p_filesz = 4 };
	memset(img->code, 0x90, sizeof(img->code));
}

static void test_loader_elf(void **state)
{
	(void)state;
	struct guest_mem m;
	struct elf_img img;
	char err[256];
	struct kernel_image k;
	assert_int_equal(guest_mem_create(&m, 16ULL << 20), 0);
	make_elf(&img);
	memset(m.host + 0x100000 + 64, 0x55, 64); /* bss must come out zeroed */
	assert_int_equal(loader_load_image(&m, (uint8_t *)&img, sizeof(img), &k, err, sizeof(err)),
			 0);
	assert_int_equal(k.kind, KERNEL_ELF);
	assert_int_equal(k.entry, 0x100010);
	assert_int_equal(k.pvh_entry, 0);
	assert_int_equal(k.load_end, 0x102000);
	assert_int_equal(m.host[0x100000], 0x90);
	assert_int_equal(m.host[0x100000 + 64], 0);
	guest_mem_destroy(&m);
}

static void test_loader_rejects(void **state)
{
	(void)state;
	struct guest_mem m;
	struct elf_img img;
	char err[256];
	struct kernel_image k;
	assert_int_equal(guest_mem_create(&m, 16ULL << 20), 0);
#define EXPECT_REJECT(mutate, word)                                                          \
	do {                                                                                 \
		make_elf(&img);                                                              \
		mutate;                                                                      \
		err[0] = 0;                                                                  \
		assert_int_equal(loader_load_image(&m, (uint8_t *)&img, sizeof(img), &k, \
						   err, sizeof(err)),                        \
				 -ENOEXEC);                                                  \
		assert_non_null(strstr(err, word));                                          \
	} while (0)
	EXPECT_REJECT(img.eh.e_machine = EM_386, "x86-64");
	EXPECT_REJECT(img.eh.e_ident[EI_CLASS] = ELFCLASS32, "64-bit");
	EXPECT_REJECT(img.eh.e_type = ET_DYN, "executable");
	EXPECT_REJECT(img.eh.e_phnum = 1000, "program header");
	EXPECT_REJECT(img.eh.e_phoff = UINT64_MAX - 8, "outside the file");
	EXPECT_REJECT(img.ph[0].p_offset = UINT64_MAX - 10, "outside the file");
	EXPECT_REJECT(img.ph[0].p_filesz = 0x3000, "exceeds");
	EXPECT_REJECT(img.ph[0].p_paddr = 0x1000, "not in guest RAM");
	EXPECT_REJECT(img.ph[0].p_paddr = (16ULL << 20) - 0x1000, "not in guest RAM");
	EXPECT_REJECT(img.ph[0].p_paddr = UINT64_MAX - 0x10, "not in guest RAM");
	EXPECT_REJECT(img.eh.e_entry = 0x900000, "entry");
	EXPECT_REJECT(img.ph[0].p_type = PT_NULL, "no loadable");
	assert_int_equal(loader_load_image(&m, (uint8_t *)&img, 20, &k, err, sizeof(err)),
			 -ENOEXEC);
	assert_non_null(strstr(err, "truncated"));
	assert_int_equal(loader_load_image(&m, (uint8_t *)&img, 0, &k, err, sizeof(err)), -ENOEXEC);
	/* Not ELF: loaded flat at 1 MiB. */
	uint8_t flat[16] = { 0xf4 };
	assert_int_equal(loader_load_image(&m, flat, sizeof(flat), &k, err, sizeof(err)), 0);
	assert_int_equal(k.kind, KERNEL_FLAT);
	assert_int_equal(k.entry, 0x100000);
	assert_int_equal(m.host[0x100000], 0xf4);
	guest_mem_destroy(&m);
}

/* A minimal bzImage: setup sectors plus `payload` bytes of protected-mode code. */
static uint8_t *make_bzimage(size_t payload, size_t *len)
{
	const unsigned setup_sects = 4;
	*len = (setup_sects + 1) * 512 + payload;
	uint8_t *b = calloc(1, *len);
	b[0x1f1] = setup_sects;
	uint32_t syssize = (uint32_t)(payload / 16);
	memcpy(b + 0x1f4, &syssize, 4);
	b[0x1fe] = 0x55;
	b[0x1ff] = 0xaa;
	b[0x201] = 0x66; /* header runs to 0x268 */
	memcpy(b + 0x202, "HdrS", 4);
	uint16_t version = 0x020f, xlf = 1;
	memcpy(b + 0x206, &version, 2);
	memcpy(b + 0x236, &xlf, 2);
	uint64_t pref = 0x1000000;
	uint32_t init_size = 0x200000;
	memcpy(b + 0x258, &pref, 8);
	memcpy(b + 0x260, &init_size, 4);
	memset(b + (setup_sects + 1) * 512, 0xcc, payload);
	return b;
}

static void test_loader_bzimage(void **state)
{
	(void)state;
	struct guest_mem m;
	struct kernel_image k;
	char err[256];
	size_t len;
	assert_int_equal(guest_mem_create(&m, 64ULL << 20), 0);
	uint8_t *b = make_bzimage(4096, &len);
	assert_int_equal(loader_load_image(&m, b, len, &k, err, sizeof(err)), 0);
	assert_int_equal(k.kind, KERNEL_BZIMAGE);
	assert_int_equal(k.entry, 0x100200);
	assert_int_equal(k.load_end, 0x1200000);
	assert_int_equal(k.setup_hdr_len, 0x268 - 0x1f1);
	assert_int_equal(m.host[0x100000], 0xcc);
	/* The zero page carries the kernel's own header plus what the loader sets. */
	assert_int_equal(x86_boot_write_zero_page(&m, "console=ttyS0", &k), 0);
	const uint8_t *zp = m.host + BOOT_ZERO_PAGE_ADDR;
	assert_memory_equal(zp + 0x202, "HdrS", 4);
	assert_int_equal(zp[0x210], 0xff); /* type_of_loader */
	uint32_t cl;
	memcpy(&cl, zp + 0x228, 4);
	assert_int_equal(cl, BOOT_CMDLINE_ADDR);
	assert_string_equal((const char *)m.host + BOOT_CMDLINE_ADDR, "console=ttyS0");
	/* Truncated payload, old protocol, no 64-bit entry, no room to decompress. */
	assert_int_equal(loader_load_image(&m, b, len - 64, &k, err, sizeof(err)), -ENOEXEC);
	assert_non_null(strstr(err, "truncated"));
	uint16_t old = 0x0206;
	memcpy(b + 0x206, &old, 2);
	assert_int_equal(loader_load_image(&m, b, len, &k, err, sizeof(err)), -ENOEXEC);
	assert_non_null(strstr(err, "2.12"));
	free(b);
	b = make_bzimage(4096, &len);
	b[0x236] = 0;
	assert_int_equal(loader_load_image(&m, b, len, &k, err, sizeof(err)), -ENOEXEC);
	assert_non_null(strstr(err, "64-bit"));
	free(b);
	b = make_bzimage(4096, &len);
	uint32_t huge = 0x7000000;
	memcpy(b + 0x260, &huge, 4);
	assert_int_equal(loader_load_image(&m, b, len, &k, err, sizeof(err)), -EFBIG);
	free(b);
	guest_mem_destroy(&m);
}

static void test_loader_pvh_note(void **state)
{
	(void)state;
	struct guest_mem m;
	struct kernel_image k;
	char err[256];
	struct {
		struct elf_img img;
		uint32_t note[6];
	} e;
	assert_int_equal(guest_mem_create(&m, 16ULL << 20), 0);
	make_elf(&e.img);
	/* namesz 4, descsz 8, type 18 (PHYS32_ENTRY), "Xen\0", 8-byte entry */
	uint32_t note[6] = { 4, 8, 18, 0x006e6558, 0x100004, 0 };
	memcpy(e.note, note, sizeof(note));
	e.img.ph[1] = (Elf64_Phdr){ .p_type = PT_NOTE,
				    .p_offset = offsetof(__typeof__(e), note),
				    .p_filesz = sizeof(note) };
	assert_int_equal(loader_load_image(&m, (uint8_t *)&e, sizeof(e), &k, err, sizeof(err)), 0);
	assert_int_equal(k.pvh_entry, 0x100004);
	/* A note whose descriptor runs past its segment is ignored, not read out of bounds. */
	e.note[1] = 4096;
	assert_int_equal(loader_load_image(&m, (uint8_t *)&e, sizeof(e), &k, err, sizeof(err)), 0);
	assert_int_equal(k.pvh_entry, 0);
	/* A PVH entry outside RAM is refused. */
	e.note[1] = 8;
	e.note[4] = 0x40000000;
	assert_int_equal(loader_load_image(&m, (uint8_t *)&e, sizeof(e), &k, err, sizeof(err)),
			 -ENOEXEC);
	assert_non_null(strstr(err, "PVH"));
	guest_mem_destroy(&m);
}

/* Sum of every byte of an MP structure is zero. */
static uint8_t sum8(const uint8_t *p, size_t n)
{
	uint8_t s = 0;
	for (size_t i = 0; i < n; i++)
		s += p[i];
	return s;
}

static void test_mptable(void **state)
{
	(void)state;
	struct guest_mem m;
	assert_int_equal(guest_mem_create(&m, 16ULL << 20), 0);
	assert_int_equal(mptable_write(&m, 4), 0);
	const uint8_t *mpf = m.host + BOOT_MPTABLE_ADDR;
	assert_memory_equal(mpf, "_MP_", 4);
	assert_int_equal(sum8(mpf, 16), 0);
	uint32_t phys;
	memcpy(&phys, mpf + 4, 4);
	const uint8_t *tbl = m.host + phys;
	assert_memory_equal(tbl, "PCMP", 4);
	uint16_t tlen;
	memcpy(&tlen, tbl + 4, 2);
	assert_int_equal(sum8(tbl, tlen), 0);
	/* Entries: 4 CPUs (first is the BSP), then bus, IOAPIC, 16 IRQs, 2 local interrupts. */
	const uint8_t *p = tbl + 44;
	for (int i = 0; i < 4; i++, p += 20) {
		assert_int_equal(p[0], 0);
		assert_int_equal(p[1], i);
		assert_int_equal(p[3], i == 0 ? 3 : 1);
	}
	assert_int_equal(p[0], 1);
	p += 8;
	assert_int_equal(p[0], 2);
	assert_int_equal(p[1], 4); /* IOAPIC ID after the CPUs' */
	p += 8;
	assert_int_equal(p[0], 3);
	assert_int_equal(p[7], 2); /* ISA IRQ 0 (PIT) -> IOAPIC pin 2, as KVM routes it */
	assert_int_equal(tbl + tlen, p + 16 * 8 + 2 * 8);
	assert_int_equal(mptable_write(&m, 0), -EINVAL);
	assert_int_equal(mptable_write(&m, 255), -EINVAL);
	guest_mem_destroy(&m);
}

/* ---- serial and i8042 register models ---- */

static uint8_t sread(struct serial *s, uint64_t off)
{
	uint8_t v;
	serial_io_read(s, off, &v, 1);
	return v;
}

static void swrite(struct serial *s, uint64_t off, uint8_t v)
{
	serial_io_write(s, off, &v, 1);
}

static void test_serial_regs(void **state)
{
	(void)state;
	struct serial s;
	assert_int_equal(serial_create(&s, NULL, -1), 0);
	assert_int_equal(sread(&s, 5) & 0x60, 0x60); /* THRE|TEMT */
	assert_int_equal(sread(&s, 5) & 0x01, 0);    /* no data */
	swrite(&s, 7, 0x5a);
	assert_int_equal(sread(&s, 7), 0x5a);
	/* Divisor latch through DLAB. */
	swrite(&s, 3, 0x80);
	swrite(&s, 0, 0x01);
	swrite(&s, 1, 0x02);
	assert_int_equal(sread(&s, 0), 0x01);
	assert_int_equal(sread(&s, 1), 0x02);
	swrite(&s, 3, 0x03);
	assert_int_equal(sread(&s, 1), 0); /* IER, not DLM */
	/* Input shows up in LSR.DR and RBR, in order. */
	assert_int_equal(serial_push_input(&s, (const uint8_t *)"hi", 2), 2);
	assert_int_equal(sread(&s, 5) & 0x01, 1);
	swrite(&s, 1, 0x01); /* RX interrupt enabled */
	assert_int_equal(sread(&s, 2) & 0x0f, 0x04);
	assert_int_equal(sread(&s, 0), 'h');
	assert_int_equal(sread(&s, 0), 'i');
	assert_int_equal(sread(&s, 5) & 0x01, 0);
	assert_int_equal(sread(&s, 2) & 0x0f, 0x01);
	/* THRE interrupt: raised on enable, acknowledged by reading IIR. */
	swrite(&s, 1, 0x02);
	assert_int_equal(sread(&s, 2) & 0x0f, 0x02);
	assert_int_equal(sread(&s, 2) & 0x0f, 0x01);
	/* Loopback: transmitted bytes come back as input; MSR mirrors MCR. */
	swrite(&s, 4, 0x10 | 0x0f);
	assert_int_equal(sread(&s, 6), 0xf0);
	swrite(&s, 0, 'x');
	assert_int_equal(sread(&s, 0), 'x');
	assert_int_equal(s.tx_bytes, 0);
	/* The receive FIFO is bounded. */
	uint8_t big[SERIAL_RX_FIFO + 10];
	memset(big, 'a', sizeof(big));
	assert_int_equal(serial_push_input(&s, big, sizeof(big)), SERIAL_RX_FIFO);
	assert_int_equal(serial_rx_space(&s), 0);
	swrite(&s, 2, 0x02); /* FCR: clear receive FIFO */
	assert_int_equal(serial_rx_space(&s), SERIAL_RX_FIFO);
	serial_destroy(&s);
}

static uint8_t kread(struct i8042 *k, uint64_t off)
{
	uint8_t v;
	i8042_io_read(k, off, &v, 1);
	return v;
}

static void kwrite(struct i8042 *k, uint64_t off, uint8_t v)
{
	i8042_io_write(k, off, &v, 1);
}

static void test_i8042(void **state)
{
	(void)state;
	struct i8042 k;
	assert_int_equal(i8042_create(&k, NULL), 0);
	assert_int_equal(kread(&k, 4) & 0x01, 0);
	kwrite(&k, 4, 0xaa); /* self test */
	assert_int_equal(kread(&k, 4) & 0x01, 1);
	assert_int_equal(kread(&k, 0), 0x55);
	kwrite(&k, 4, 0x60); /* write CTR */
	kwrite(&k, 0, 0x05); /* no translation */
	kwrite(&k, 4, 0x20);
	assert_int_equal(kread(&k, 0), 0x05);
	assert_int_equal(i8042_send_ctrl_alt_del(&k), 0);
	assert_int_equal(kread(&k, 0), 0x14);
	assert_int_equal(kread(&k, 0), 0x11);
	assert_int_equal(kread(&k, 0), 0x71);
	kwrite(&k, 0, 0xff); /* keyboard reset: ACK + BAT ok */
	assert_int_equal(kread(&k, 0), 0xfa);
	assert_int_equal(kread(&k, 0), 0xaa);
	/* A full buffer refuses more key presses instead of overflowing. */
	for (int i = 0; i < 20; i++)
		kwrite(&k, 0, 0xf4);
	assert_int_equal(i8042_send_ctrl_alt_del(&k), -ENOSPC);
	assert_int_equal(k.reset_requested, 0);
	kwrite(&k, 4, 0xd1); /* write output port with the reset line low */
	kwrite(&k, 0, 0x00);
	assert_int_equal(k.reset_requested, 1);
	k.reset_requested = 0;
	kwrite(&k, 4, 0xfe);
	assert_int_equal(k.reset_requested, 1);
	i8042_destroy(&k);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_options_defaults),  cmocka_unit_test(test_options_all),
		cmocka_unit_test(test_options_errors),	  cmocka_unit_test(test_mem_size),
		cmocka_unit_test(test_mem_layout_small),  cmocka_unit_test(test_mem_layout_hole),
		cmocka_unit_test(test_mem_ptr_checks),	  cmocka_unit_test(test_bus_dispatch),
		cmocka_unit_test(test_bus_register_rules), cmocka_unit_test(test_loader_elf),
		cmocka_unit_test(test_loader_rejects),	  cmocka_unit_test(test_loader_bzimage),
		cmocka_unit_test(test_loader_pvh_note),	  cmocka_unit_test(test_mptable),
		cmocka_unit_test(test_serial_regs),
		cmocka_unit_test(test_i8042),
		cmocka_unit_test(test_options_disks),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
