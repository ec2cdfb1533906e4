/* Kernel image loading: validate ELF64 headers and segments before a single byte reaches guest RAM. */
#include "loader.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "x86_boot.h"

#define LOADER_MAX_PHDRS 64

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return code;
}

static int load_flat(struct guest_mem *mem, const uint8_t *buf, size_t len, uint64_t *entry,
		     char *err, size_t errlen)
{
	void *dst = guest_mem_ptr(mem, HIMEM_START, len);
	if (!dst)
		return fail(err, errlen, -EFBIG, "flat image of %zu bytes does not fit in guest RAM",
			    len);
	memcpy(dst, buf, len);
	*entry = HIMEM_START;
	return 0;
}

int loader_load_image(struct guest_mem *mem, const uint8_t *buf, size_t len, uint64_t *entry,
		      char *err, size_t errlen)
{
	if (len == 0)
		return fail(err, errlen, -ENOEXEC, "kernel image is empty");
	if (len < SELFMAG || memcmp(buf, ELFMAG, SELFMAG) != 0)
		return load_flat(mem, buf, len, entry, err, errlen);
	if (len < sizeof(Elf64_Ehdr))
		return fail(err, errlen, -ENOEXEC, "truncated ELF header");
	const Elf64_Ehdr *eh = (const Elf64_Ehdr *)buf;
	if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_ident[EI_DATA] != ELFDATA2LSB)
		return fail(err, errlen, -ENOEXEC, "not a 64-bit little-endian ELF");
	if (eh->e_machine != EM_X86_64)
		return fail(err, errlen, -ENOEXEC, "ELF machine %u is not x86-64", eh->e_machine);
	if (eh->e_type != ET_EXEC)
		return fail(err, errlen, -ENOEXEC, "ELF type %u is not an executable", eh->e_type);
	if (eh->e_phentsize != sizeof(Elf64_Phdr) || eh->e_phnum == 0 ||
	    eh->e_phnum > LOADER_MAX_PHDRS)
		return fail(err, errlen, -ENOEXEC, "bad ELF program header table (%u entries of %u)",
			    eh->e_phnum, eh->e_phentsize);
	if (eh->e_phoff > len || (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr) > len - eh->e_phoff)
		return fail(err, errlen, -ENOEXEC, "ELF program headers lie outside the file");

	bool entry_ok = false;
	int nr_load = 0;
	/* Check every segment before copying any, so a bad image leaves RAM untouched. */
	for (int pass = 0; pass < 2; pass++) {
		for (unsigned i = 0; i < eh->e_phnum; i++) {
			Elf64_Phdr ph;
			memcpy(&ph, buf + eh->e_phoff + i * sizeof(ph), sizeof(ph));
			if (ph.p_type != PT_LOAD || ph.p_memsz == 0)
				continue;
			if (pass == 0) {
				if (ph.p_filesz > ph.p_memsz)
					return fail(err, errlen, -ENOEXEC,
						    "segment %u: file size exceeds memory size", i);
				if (ph.p_offset > len || ph.p_filesz > len - ph.p_offset)
					return fail(err, errlen, -ENOEXEC,
						    "segment %u lies outside the file", i);
				if (ph.p_paddr < HIMEM_START ||
				    !guest_mem_ptr(mem, ph.p_paddr, ph.p_memsz))
					return fail(err, errlen, -ENOEXEC,
						    "segment %u at 0x%llx+0x%llx is not in guest RAM above 1 MiB",
						    i, (unsigned long long)ph.p_paddr,
						    (unsigned long long)ph.p_memsz);
				if (eh->e_entry >= ph.p_paddr && eh->e_entry - ph.p_paddr < ph.p_memsz)
					entry_ok = true;
				nr_load++;
				continue;
			}
			uint8_t *dst = guest_mem_ptr(mem, ph.p_paddr, ph.p_memsz);
			memcpy(dst, buf + ph.p_offset, ph.p_filesz);
			memset(dst + ph.p_filesz, 0, ph.p_memsz - ph.p_filesz);
		}
		if (pass == 0 && nr_load == 0)
			return fail(err, errlen, -ENOEXEC, "ELF has no loadable segment");
		if (pass == 0 && !entry_ok)
			return fail(err, errlen, -ENOEXEC,
				    "ELF entry 0x%llx is outside every loadable segment",
				    (unsigned long long)eh->e_entry);
	}
	*entry = eh->e_entry;
	return 0;
}

int loader_read_file(const char *path, uint8_t **out, size_t *out_len, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return fail(err, errlen, -errno, "cannot open %s: %s", path, strerror(errno));
	struct stat st;
	int r;
	if (fstat(fd, &st) < 0) {
		r = fail(err, errlen, -errno, "cannot stat %s: %s", path, strerror(errno));
		goto out_close;
	}
	if (!S_ISREG(st.st_mode)) {
		r = fail(err, errlen, -EINVAL, "%s is not a regular file", path);
		goto out_close;
	}
	if ((uint64_t)st.st_size > LOADER_MAX_FILE) {
		r = fail(err, errlen, -EFBIG, "%s is larger than %llu MiB", path,
			 LOADER_MAX_FILE >> 20);
		goto out_close;
	}
	size_t len = (size_t)st.st_size;
	uint8_t *buf = malloc(len ? len : 1);
	if (!buf) {
		r = fail(err, errlen, -ENOMEM, "out of memory reading %s", path);
		goto out_close;
	}
	size_t done = 0;
	while (done < len) {
		ssize_t n = read(fd, buf + done, len - done);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = fail(err, errlen, n < 0 ? -errno : -EIO, "short read of %s", path);
			free(buf);
			goto out_close;
		}
		done += (size_t)n;
	}
	*out = buf;
	*out_len = len;
	r = 0;
out_close:
	close(fd);
	return r;
}
