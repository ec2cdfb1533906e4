/* Implicit templates: which configurations get one, its key and its name. */
#include "lifecycle/warm.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/evp.h>

#include "common/errmsg.h"
#include "lifecycle/image_files.h"

int warm_name_is(const char *name)
{
	size_t pl = sizeof(WARM_PREFIX) - 1;

	if (!name || strncmp(name, WARM_PREFIX, pl) || strlen(name) != WARM_NAME_LEN)
		return 0;
	for (size_t i = pl; i < WARM_NAME_LEN; i++)
		if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
			return 0;
	return 1;
}

const char *warm_ineligible(const struct sbx_spec *s)
{
	if (s->key[0])
		return "--key (a clone would share the template's data key)";
	if (s->no_jail)
		return "--no-jail";
	if (s->nr_disks > (s->initrd[0] && !sbx_spec_is_image(s) ? 0 : 1))
		return "--disk (an extra disk is the sandbox's own file, not a template's)";
	return NULL;
}

/*
 * "LABEL PATH dev ino size mtime_ns\n" appended at *off. With no_path, "LABEL dev ino ...": an
 * image's ext4 is named by the cache at a create and by the template's own hard link after, and
 * both must give one key.
 */
static int key_file(char *key, size_t cap, size_t *off, const char *label, const char *path,
		    bool no_path, char *err, size_t errlen)
{
	struct stat st;
	int n;

	if (!path[0]) {
		n = snprintf(key + *off, cap - *off, "%s -\n", label);
	} else {
		if (stat(path, &st) < 0)
			return errmsg(err, errlen, -errno, "%s %s: %s", label, path,
				      strerror(errno));
		n = snprintf(key + *off, cap - *off, "%s %s %llu %llu %lld %lld.%09ld\n", label,
			     no_path ? "-" : path, (unsigned long long)st.st_dev,
			     (unsigned long long)st.st_ino, (long long)st.st_size,
			     (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
	}
	if (n < 0 || (size_t)n >= cap - *off)
		return errmsg(err, errlen, -ENAMETOOLONG, "the template key is too long");
	*off += (size_t)n;
	return 0;
}

int warm_key_text(const struct sbx_spec *s, const char *vmm, char *key, size_t cap, char *err,
		  size_t errlen)
{
	size_t off = 0;
	int n = snprintf(key, cap,
			 "cove-warm 1\nmem %llu\nvcpus %d\ncpu-template %s\n"
			 "vsock-rate %llu\nseccomp %d\n",
			 (unsigned long long)s->mem_bytes, s->vcpus,
			 s->cpu_template[0] ? s->cpu_template : "-",
			 (unsigned long long)s->vsock_rate, !s->no_seccomp);

	if (n < 0 || (size_t)n >= cap)
		return errmsg(err, errlen, -ENAMETOOLONG, "the template key is too long");
	off = (size_t)n;
	bool image = sbx_spec_is_image(s);
	int ret = key_file(key, cap, &off, "kernel", s->kernel, false, err, errlen)
		      ?: key_file(key, cap, &off, "initrd", s->initrd, false, err, errlen)
		      ?: key_file(key, cap, &off, image ? "image" : "root",
				  s->initrd[0] && !image ? "" : s->disks[0].path, image, err,
				  errlen)
		      ?: key_file(key, cap, &off, "vmm", vmm, false, err, errlen);
	/* An image's main process and its settings (cove.root= and what follows: cove.main=,
	 * the on-exit choice) are part of the machine the template saves. */
	const char *main = image ? strstr(s->cmdline, " cove.root=") : NULL;
	if (!ret && main) {
		n = snprintf(key + off, cap - off, "main%s\n", main);
		if (n < 0 || (size_t)n >= cap - off)
			ret = errmsg(err, errlen, -ENAMETOOLONG, "the template key is too long");
	}
	return ret;
}

int warm_name_of(const char *key, char *name, size_t cap)
{
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned int mdlen = 0;
	size_t pl = sizeof(WARM_PREFIX) - 1;

	if (cap < WARM_NAME_LEN + 1 ||
	    !EVP_Digest(key, strlen(key), md, &mdlen, EVP_sha256(), NULL) || mdlen < WARM_HEX / 2)
		return -EIO;
	memcpy(name, WARM_PREFIX, pl);
	for (size_t i = 0; i < WARM_HEX / 2; i++)
		snprintf(name + pl + 2 * i, 3, "%02x", md[i]);
	return 0;
}
