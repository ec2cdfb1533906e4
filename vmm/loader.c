/* Kernel image loading: validate ELF64 headers and segments before a single byte reaches guest RAM. */
#include "vmm/loader.h"

#include <elf.h>
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/byteorder.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "vmm/x86_boot.h"

#define LOADER_MAX_PHDRS 64

static int load_flat(struct guest_mem *mem, const uint8_t *buf, size_t len,
		     struct kernel_image *img, char *err, size_t errlen)
{
	void *dst = guest_mem_ptr(mem, HIMEM_START, len);
	if (!dst)
		return errmsg(err, errlen, -EFBIG, "flat image of %zu bytes does not fit in guest RAM",
			    len);
	memcpy(dst, buf, len);
	img->kind = KERNEL_FLAT;
	img->entry = HIMEM_START;
	img->load_end = HIMEM_START + len;
	return 0;
}

/* Looks for XEN_ELFNOTE_PHYS32_ENTRY in one PT_NOTE segment; every length is checked. */
static uint64_t find_pvh_entry(const uint8_t *notes, uint64_t size)
{
	uint64_t off = 0;
	while (size - off >= 12) {
		uint32_t namesz = get_le32(notes + off), descsz = get_le32(notes + off + 4);
		uint32_t type = get_le32(notes + off + 8);
		uint64_t name_off = off + 12;
		uint64_t desc_off = name_off + (((uint64_t)namesz + 3) & ~3ULL);
		uint64_t next = desc_off + (((uint64_t)descsz + 3) & ~3ULL);
		if (desc_off > size || next > size)
			return 0;
		if (type == 18 && namesz == 4 && memcmp(notes + name_off, "Xen", 4) == 0 &&
		    (descsz == 4 || descsz == 8)) {
			uint64_t v = 0;
			memcpy(&v, notes + desc_off, descsz);
			return v;
		}
		off = next;
	}
	return 0;
}

/*
 * Where an ELF's bytes come from: a buffer, or the file itself, so a vmlinux's segments go
 * straight from the page cache into guest RAM (one copy) instead of through a whole-file
 * buffer. read() fills exactly len bytes at off, already checked to lie within len_total.
 */
struct elf_src {
	uint64_t len;
	int (*read)(const struct elf_src *src, uint64_t off, void *dst, size_t len);
	const uint8_t *buf;
	int fd;
};

static int src_read_buf(const struct elf_src *src, uint64_t off, void *dst, size_t len)
{
	memcpy(dst, src->buf + off, len);
	return 0;
}

static int src_read_fd(const struct elf_src *src, uint64_t off, void *dst, size_t len)
{
	return pread_full(src->fd, dst, len, (off_t)off);
}

/* Largest PT_NOTE segment read for the PVH entry (vmlinux's is ~100 bytes). */
#define LOADER_MAX_NOTES (64u << 10)

static int load_elf(struct guest_mem *mem, const struct elf_src *src, struct kernel_image *img,
		    char *err, size_t errlen)
{
	uint64_t len = src->len;
	Elf64_Ehdr ehdr;
	if (len < sizeof(ehdr))
		return errmsg(err, errlen, -ENOEXEC, "truncated ELF header");
	if (src->read(src, 0, &ehdr, sizeof(ehdr)))
		return errmsg(err, errlen, -EIO, "cannot read the ELF header");
	const Elf64_Ehdr *eh = &ehdr;
	if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_ident[EI_DATA] != ELFDATA2LSB)
		return errmsg(err, errlen, -ENOEXEC, "not a 64-bit little-endian ELF");
	if (eh->e_machine != EM_X86_64)
		return errmsg(err, errlen, -ENOEXEC, "ELF machine %u is not x86-64", eh->e_machine);
	if (eh->e_type != ET_EXEC)
		return errmsg(err, errlen, -ENOEXEC, "ELF type %u is not an executable", eh->e_type);
	if (eh->e_phentsize != sizeof(Elf64_Phdr) || eh->e_phnum == 0 ||
	    eh->e_phnum > LOADER_MAX_PHDRS)
		return errmsg(err, errlen, -ENOEXEC, "bad ELF program header table (%u entries of %u)",
			    eh->e_phnum, eh->e_phentsize);
	if (eh->e_phoff > len || (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr) > len - eh->e_phoff)
		return errmsg(err, errlen, -ENOEXEC, "ELF program headers lie outside the file");
	Elf64_Phdr phs[LOADER_MAX_PHDRS];
	if (src->read(src, eh->e_phoff, phs, eh->e_phnum * sizeof(Elf64_Phdr)))
		return errmsg(err, errlen, -EIO, "cannot read the ELF program headers");

	bool entry_ok = false;
	int nr_load = 0;
	uint64_t end = 0, pvh = 0;
	/* Check every segment before copying any, so a bad image leaves RAM untouched. */
	for (int pass = 0; pass < 2; pass++) {
		for (unsigned i = 0; i < eh->e_phnum; i++) {
			const Elf64_Phdr ph = phs[i];
			if (pass == 0 && ph.p_type == PT_NOTE && ph.p_offset <= len &&
			    ph.p_filesz <= len - ph.p_offset && ph.p_filesz <= LOADER_MAX_NOTES &&
			    !pvh) {
				uint8_t *notes = malloc(ph.p_filesz ? ph.p_filesz : 1);
				if (!notes)
					return errmsg(err, errlen, -ENOMEM,
						      "out of memory for ELF notes");
				if (src->read(src, ph.p_offset, notes, ph.p_filesz)) {
					free(notes);
					return errmsg(err, errlen, -EIO, "cannot read ELF notes");
				}
				pvh = find_pvh_entry(notes, ph.p_filesz);
				free(notes);
			}
			if (ph.p_type != PT_LOAD || ph.p_memsz == 0)
				continue;
			if (pass == 0) {
				if (ph.p_filesz > ph.p_memsz)
					return errmsg(err, errlen, -ENOEXEC,
						    "segment %u: file size exceeds memory size", i);
				if (ph.p_offset > len || ph.p_filesz > len - ph.p_offset)
					return errmsg(err, errlen, -ENOEXEC,
						    "segment %u lies outside the file", i);
				if (ph.p_paddr < HIMEM_START ||
				    !guest_mem_ptr(mem, ph.p_paddr, ph.p_memsz))
					return errmsg(err, errlen, -ENOEXEC,
						    "segment %u at 0x%llx+0x%llx is not in guest RAM above 1 MiB",
						    i, (unsigned long long)ph.p_paddr,
						    (unsigned long long)ph.p_memsz);
				if (eh->e_entry >= ph.p_paddr && eh->e_entry - ph.p_paddr < ph.p_memsz)
					entry_ok = true;
				if (ph.p_paddr + ph.p_memsz > end)
					end = ph.p_paddr + ph.p_memsz;
				nr_load++;
				continue;
			}
			uint8_t *dst = guest_mem_ptr(mem, ph.p_paddr, ph.p_memsz);
			if (src->read(src, ph.p_offset, dst, ph.p_filesz))
				return errmsg(
				    err, errlen, -EIO,
				    "segment %u: short read (the file changed while loading?)", i);
			memset(dst + ph.p_filesz, 0, ph.p_memsz - ph.p_filesz);
		}
		if (pass == 0 && nr_load == 0)
			return errmsg(err, errlen, -ENOEXEC, "ELF has no loadable segment");
		if (pass == 0 && !entry_ok)
			return errmsg(err, errlen, -ENOEXEC,
				    "ELF entry 0x%llx is outside every loadable segment",
				    (unsigned long long)eh->e_entry);
		if (pass == 0 && pvh && (pvh < HIMEM_START || !guest_mem_ptr(mem, pvh, 1)))
			return errmsg(err, errlen, -ENOEXEC, "PVH entry 0x%llx is not in guest RAM",
				    (unsigned long long)pvh);
	}
	img->kind = KERNEL_ELF;
	img->entry = eh->e_entry;
	img->pvh_entry = pvh;
	img->load_end = end;
	return 0;
}

#define BZ_MIN_VERSION 0x020c /* boot protocol 2.12: xloadflags, 64-bit entry */
#define XLF_KERNEL_64 0x1

static bool is_bzimage(const uint8_t *buf, size_t len)
{
	return len >= 0x270 && buf[0x1fe] == 0x55 && buf[0x1ff] == 0xaa &&
	       memcmp(buf + 0x202, "HdrS", 4) == 0;
}

static int load_bzimage(struct guest_mem *mem, const uint8_t *buf, size_t len,
			struct kernel_image *img, char *err, size_t errlen)
{
	uint16_t version;
	memcpy(&version, buf + 0x206, sizeof(version));
	if (version < BZ_MIN_VERSION)
		return errmsg(err, errlen, -ENOEXEC,
			    "bzImage boot protocol %u.%02u is older than 2.12 (no 64-bit entry)",
			    version >> 8, version & 0xff);
	uint16_t xloadflags;
	memcpy(&xloadflags, buf + 0x236, sizeof(xloadflags));
	if (!(xloadflags & XLF_KERNEL_64))
		return errmsg(err, errlen, -ENOEXEC, "bzImage has no 64-bit entry point");
	unsigned setup_sects = buf[0x1f1] ? buf[0x1f1] : 4;
	size_t setup_size = (size_t)(setup_sects + 1) * 512;
	if (setup_size >= len)
		return errmsg(err, errlen, -ENOEXEC, "bzImage is truncated (%zu bytes, setup is %zu)",
			    len, setup_size);
	/* The header ends at 0x202 + the jump offset stored at 0x201. */
	size_t hdr_end = 0x202 + buf[0x201];
	if (hdr_end > SETUP_HDR_OFF + SETUP_HDR_MAX || hdr_end > len)
		return errmsg(err, errlen, -ENOEXEC, "bzImage setup header is malformed");
	size_t kernel_len = len - setup_size;
	uint32_t syssize;
	memcpy(&syssize, buf + 0x1f4, sizeof(syssize));
	/* syssize counts 16-byte paragraphs of protected-mode code: a cut file falls short. */
	if ((uint64_t)syssize * 16 > kernel_len)
		return errmsg(err, errlen, -ENOEXEC,
			    "bzImage is truncated: header says %llu bytes of kernel, file has %zu",
			    (unsigned long long)syssize * 16, kernel_len);
	uint32_t init_size;
	uint64_t pref_address;
	memcpy(&init_size, buf + 0x260, sizeof(init_size));
	memcpy(&pref_address, buf + 0x258, sizeof(pref_address));
	void *dst = guest_mem_ptr(mem, HIMEM_START, kernel_len);
	if (!dst)
		return errmsg(err, errlen, -EFBIG, "bzImage of %zu bytes does not fit in guest RAM",
			    len);
	/* The kernel decompresses itself to pref_address (or above): that must be RAM too. */
	if (pref_address < HIMEM_START || !guest_mem_ptr(mem, pref_address, init_size))
		return errmsg(err, errlen, -EFBIG,
			    "bzImage needs 0x%x bytes of RAM at 0x%llx; give the guest more memory",
			    init_size, (unsigned long long)pref_address);
	memcpy(dst, buf + setup_size, kernel_len);
	img->kind = KERNEL_BZIMAGE;
	img->entry = HIMEM_START + 0x200;
	img->load_end = pref_address + init_size;
	if (HIMEM_START + kernel_len > img->load_end)
		img->load_end = HIMEM_START + kernel_len;
	img->setup_hdr_len = hdr_end - SETUP_HDR_OFF;
	memcpy(img->setup_hdr, buf + SETUP_HDR_OFF, img->setup_hdr_len);
	return 0;
}

int loader_load_image(struct guest_mem *mem, const uint8_t *buf, size_t len,
		      struct kernel_image *img, char *err, size_t errlen)
{
	memset(img, 0, sizeof(*img));
	if (len == 0)
		return errmsg(err, errlen, -ENOEXEC, "kernel image is empty");
	if (len >= SELFMAG && memcmp(buf, ELFMAG, SELFMAG) == 0) {
		struct elf_src src = {.len = len, .read = src_read_buf, .buf = buf, .fd = -1};
		return load_elf(mem, &src, img, err, errlen);
	}
	if (is_bzimage(buf, len))
		return load_bzimage(mem, buf, len, img, err, errlen);
	return load_flat(mem, buf, len, img, err, errlen);
}

/* Opens `path` for reading: a regular file of at most LOADER_MAX_FILE. The fd, or -errno. */
static int open_image(const char *path, struct stat *st, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), r;
	if (fd < 0)
		return errmsg(err, errlen, -errno, "cannot open %s: %s", path, strerror(errno));
	if (fstat(fd, st) < 0)
		r = errmsg(err, errlen, -errno, "cannot stat %s: %s", path, strerror(errno));
	else if (!S_ISREG(st->st_mode))
		r = errmsg(err, errlen, -EINVAL, "%s is not a regular file", path);
	else if ((uint64_t)st->st_size > LOADER_MAX_FILE)
		r = errmsg(err, errlen, -EFBIG, "%s is larger than %llu MiB", path,
			   LOADER_MAX_FILE >> 20);
	else
		return fd;
	close(fd);
	return r;
}

int loader_read_file(const char *path, uint8_t **out, size_t *out_len, char *err, size_t errlen)
{
	struct stat st;
	int r, fd = open_image(path, &st, err, errlen);
	if (fd < 0)
		return fd;
	size_t len = (size_t)st.st_size;
	uint8_t *buf = malloc(len ? len : 1);
	if (!buf) {
		r = errmsg(err, errlen, -ENOMEM, "out of memory reading %s", path);
		goto out_close;
	}
	r = pread_full(fd, buf, len, 0);
	if (r) {
		r = errmsg(err, errlen, r, "short read of %s", path);
		free(buf);
		goto out_close;
	}
	*out = buf;
	*out_len = len;
	r = 0;
out_close:
	close(fd);
	return r;
}

int loader_load_file(struct guest_mem *mem, const char *path, struct kernel_image *img, char *err,
		     size_t errlen)
{
	memset(img, 0, sizeof(*img));
	struct stat st;
	uint8_t magic[SELFMAG];
	int r, fd = open_image(path, &st, err, errlen);
	if (fd < 0)
		return fd;
	/* An ELF is loaded segment by segment from the file; anything else is read whole. */
	if ((uint64_t)st.st_size >= SELFMAG && pread_full(fd, magic, SELFMAG, 0) == 0 &&
	    memcmp(magic, ELFMAG, SELFMAG) == 0) {
		struct elf_src src = {.len = (uint64_t)st.st_size, .read = src_read_fd, .fd = fd};
		r = load_elf(mem, &src, img, err, errlen);
		goto out_close;
	}
	close(fd);
	uint8_t *buf;
	size_t len;
	r = loader_read_file(path, &buf, &len, err, errlen);
	if (r)
		return r;
	r = loader_load_image(mem, buf, len, img, err, errlen);
	free(buf);
	return r;
out_close:
	close(fd);
	return r;
}
