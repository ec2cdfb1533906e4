/* Unit tests for vmm/loader and the x86 zero page: ELF, bzImage and PVH-note kernels. */
#include <elf.h>

#include "helpers.h"
#include "file_helpers.h"
#include "vmm/guest_mem.h"
#include "vmm/loader.h"
#include "vmm/x86_boot.h"

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
	img->ph[0] = (Elf64_Phdr){.p_type = PT_LOAD,
				  .p_offset = offsetof(struct elf_img, code),
				  .p_paddr = 0x100000,
				  .p_filesz = sizeof(img->code),
				  .p_memsz = 0x2000};
	img->ph[1] = (Elf64_Phdr){.p_type = PT_NOTE, .p_offset = 0, .p_filesz = 4};
	memset(img->code, 0x90, sizeof(img->code));
}

/* Each test's guest RAM (16 MiB, or 64 MiB for a bzImage's room to decompress) and results. */
struct loader_fx {
	struct guest_mem m;
	struct kernel_image k;
	char err[256];
};

/* The cmocka prestate is the RAM size. */
static int setup(void **state)
{
	uint64_t size = *(const uint64_t *)*state;
	struct loader_fx *f = calloc(1, sizeof(*f));
	if (!f || guest_mem_create(&f->m, size)) {
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct loader_fx *f = *state;
	guest_mem_destroy(&f->m);
	free(f);
	return 0;
}

static void test_loader_elf(void **state)
{
	struct loader_fx *f = *state;
	struct elf_img img;
	make_elf(&img);
	memset(f->m.host + 0x100000 + 64, 0x55, 64); /* bss must come out zeroed */
	assert_int_equal(
	    loader_load_image(&f->m, (uint8_t *)&img, sizeof(img), &f->k, f->err, sizeof(f->err)),
	    0);
	assert_int_equal(f->k.kind, KERNEL_ELF);
	assert_int_equal(f->k.entry, 0x100010);
	assert_int_equal(f->k.pvh_entry, 0);
	assert_int_equal(f->k.load_end, 0x102000);
	assert_int_equal(f->m.host[0x100000], 0x90);
	assert_int_equal(f->m.host[0x100000 + 64], 0);
}

static void test_loader_rejects(void **state)
{
	struct loader_fx *f = *state;
	struct elf_img img;
#define EXPECT_REJECT(mutate, word)                                                                \
	do {                                                                                       \
		make_elf(&img);                                                                    \
		mutate;                                                                            \
		f->err[0] = 0;                                                                     \
		assert_int_equal(loader_load_image(&f->m, (uint8_t *)&img, sizeof(img), &f->k,     \
						   f->err, sizeof(f->err)),                        \
				 -ENOEXEC);                                                        \
		assert_non_null(strstr(f->err, word));                                             \
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
	assert_int_equal(
	    loader_load_image(&f->m, (uint8_t *)&img, 20, &f->k, f->err, sizeof(f->err)), -ENOEXEC);
	assert_non_null(strstr(f->err, "truncated"));
	assert_int_equal(
	    loader_load_image(&f->m, (uint8_t *)&img, 0, &f->k, f->err, sizeof(f->err)), -ENOEXEC);
	/* Not ELF: loaded flat at 1 MiB. */
	uint8_t flat[16] = {0xf4};
	assert_int_equal(
	    loader_load_image(&f->m, flat, sizeof(flat), &f->k, f->err, sizeof(f->err)), 0);
	assert_int_equal(f->k.kind, KERNEL_FLAT);
	assert_int_equal(f->k.entry, 0x100000);
	assert_int_equal(f->m.host[0x100000], 0xf4);
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
	struct loader_fx *f = *state;
	size_t len;
	uint8_t *b = make_bzimage(4096, &len);
	assert_int_equal(loader_load_image(&f->m, b, len, &f->k, f->err, sizeof(f->err)), 0);
	assert_int_equal(f->k.kind, KERNEL_BZIMAGE);
	assert_int_equal(f->k.entry, 0x100200);
	assert_int_equal(f->k.load_end, 0x1200000);
	assert_int_equal(f->k.setup_hdr_len, 0x268 - 0x1f1);
	assert_int_equal(f->m.host[0x100000], 0xcc);
	/* The zero page carries the kernel's own header plus what the loader sets. */
	assert_int_equal(x86_boot_write_zero_page(&f->m, "console=ttyS0", &f->k), 0);
	const uint8_t *zp = f->m.host + BOOT_ZERO_PAGE_ADDR;
	assert_memory_equal(zp + 0x202, "HdrS", 4);
	assert_int_equal(zp[0x210], 0xff); /* type_of_loader */
	uint32_t cl;
	memcpy(&cl, zp + 0x228, 4);
	assert_int_equal(cl, BOOT_CMDLINE_ADDR);
	assert_string_equal((const char *)f->m.host + BOOT_CMDLINE_ADDR, "console=ttyS0");
	/* Truncated payload, old protocol, no 64-bit entry, no room to decompress. */
	assert_int_equal(loader_load_image(&f->m, b, len - 64, &f->k, f->err, sizeof(f->err)),
			 -ENOEXEC);
	assert_non_null(strstr(f->err, "truncated"));
	uint16_t old = 0x0206;
	memcpy(b + 0x206, &old, 2);
	assert_int_equal(loader_load_image(&f->m, b, len, &f->k, f->err, sizeof(f->err)), -ENOEXEC);
	assert_non_null(strstr(f->err, "2.12"));
	free(b);
	b = make_bzimage(4096, &len);
	b[0x236] = 0;
	assert_int_equal(loader_load_image(&f->m, b, len, &f->k, f->err, sizeof(f->err)), -ENOEXEC);
	assert_non_null(strstr(f->err, "64-bit"));
	free(b);
	b = make_bzimage(4096, &len);
	uint32_t huge = 0x7000000;
	memcpy(b + 0x260, &huge, 4);
	assert_int_equal(loader_load_image(&f->m, b, len, &f->k, f->err, sizeof(f->err)), -EFBIG);
	free(b);
}

static void test_loader_pvh_note(void **state)
{
	struct loader_fx *f = *state;
	struct {
		struct elf_img img;
		uint32_t note[6];
	} e;
	make_elf(&e.img);
	/* namesz 4, descsz 8, type 18 (PHYS32_ENTRY), "Xen\0", 8-byte entry */
	uint32_t note[6] = {4, 8, 18, 0x006e6558, 0x100004, 0};
	memcpy(e.note, note, sizeof(note));
	e.img.ph[1] = (Elf64_Phdr){
	    .p_type = PT_NOTE, .p_offset = offsetof(__typeof__(e), note), .p_filesz = sizeof(note)};
	assert_int_equal(
	    loader_load_image(&f->m, (uint8_t *)&e, sizeof(e), &f->k, f->err, sizeof(f->err)), 0);
	assert_int_equal(f->k.pvh_entry, 0x100004);
	/* A note whose descriptor runs past its segment is ignored, not read out of bounds. */
	e.note[1] = 4096;
	assert_int_equal(
	    loader_load_image(&f->m, (uint8_t *)&e, sizeof(e), &f->k, f->err, sizeof(f->err)), 0);
	assert_int_equal(f->k.pvh_entry, 0);
	/* A PVH entry outside RAM is refused. */
	e.note[1] = 8;
	e.note[4] = 0x40000000;
	assert_int_equal(
	    loader_load_image(&f->m, (uint8_t *)&e, sizeof(e), &f->k, f->err, sizeof(f->err)),
	    -ENOEXEC);
	assert_non_null(strstr(f->err, "PVH"));
}

/*
 * loader_load_file reads an ELF segment by segment from the file: the same image, PVH note and
 * zeroed bss as from a buffer; a file cut short inside a segment is refused before RAM is
 * touched; a bzImage still loads through the whole-file path.
 */
static void test_loader_file(void **state)
{
	struct loader_fx *f = *state;
	char path[] = "/tmp/cove-test-loader-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);
	struct {
		struct elf_img img;
		uint32_t note[6];
	} e;
	make_elf(&e.img);
	uint32_t note[6] = {4, 8, 18, 0x006e6558, 0x100004, 0};
	memcpy(e.note, note, sizeof(note));
	e.img.ph[1] = (Elf64_Phdr){
	    .p_type = PT_NOTE, .p_offset = offsetof(__typeof__(e), note), .p_filesz = sizeof(note)};
	write_file(path, &e, sizeof(e));
	memset(f->m.host + 0x100000, 0x55, 0x2000);
	assert_int_equal(loader_load_file(&f->m, path, &f->k, f->err, sizeof(f->err)), 0);
	assert_int_equal(f->k.kind, KERNEL_ELF);
	assert_int_equal(f->k.entry, 0x100010);
	assert_int_equal(f->k.pvh_entry, 0x100004);
	assert_int_equal(f->k.load_end, 0x102000);
	assert_memory_equal(f->m.host + 0x100000, e.img.code, sizeof(e.img.code));
	for (size_t i = sizeof(e.img.code); i < 0x2000; i++)
		assert_int_equal(f->m.host[0x100000 + i], 0);
	/* Cut inside the loadable segment: refused, RAM untouched. */
	memset(f->m.host + 0x100000, 0x55, 0x2000);
	write_file(path, &e, offsetof(struct elf_img, code) + 8);
	assert_int_equal(loader_load_file(&f->m, path, &f->k, f->err, sizeof(f->err)), -ENOEXEC);
	assert_non_null(strstr(f->err, "outside the file"));
	assert_int_equal(f->m.host[0x100000], 0x55);
	/* A flat image goes through the whole-file path. */
	uint8_t flat[32];
	memset(flat, 0xf4, sizeof(flat));
	write_file(path, flat, sizeof(flat));
	assert_int_equal(loader_load_file(&f->m, path, &f->k, f->err, sizeof(f->err)), 0);
	assert_int_equal(f->k.kind, KERNEL_FLAT);
	assert_int_equal(f->m.host[0x100000], 0xf4);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(loader_load_file(&f->m, path, &f->k, f->err, sizeof(f->err)), -ENOENT);
}

int main(void)
{
	uint64_t ram = 16ULL << 20, bz_ram = 64ULL << 20;
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_prestate_setup_teardown(test_loader_elf, setup, teardown, &ram),
	    cmocka_unit_test_prestate_setup_teardown(test_loader_rejects, setup, teardown, &ram),
	    cmocka_unit_test_prestate_setup_teardown(test_loader_bzimage, setup, teardown, &bz_ram),
	    cmocka_unit_test_prestate_setup_teardown(test_loader_pvh_note, setup, teardown, &ram),
	    cmocka_unit_test_prestate_setup_teardown(test_loader_file, setup, teardown, &ram),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
