/* The audit log's MAC key file: created once with a random key, read back, never in the log. */
#include "audit.h"
#include "common/errmsg.h"
#include "common/fd_io.h"
#include "common/hex.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KEY_HEX (2 * AUDIT_KEY_LEN)

static int key_create(const char *path, uint8_t key[AUDIT_KEY_LEN], char *err, size_t errlen)
{
	char hex[KEY_HEX + 2];
	int fd, r;

	if (RAND_bytes(key, AUDIT_KEY_LEN) != 1)
		return errmsg(err, errlen, -EIO, "audit key %s: no random bytes", path);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "audit key %s: %s", path, strerror(errno));
	hex_encode(key, AUDIT_KEY_LEN, hex);
	hex[KEY_HEX] = '\n';
	r = write_full(fd, hex, KEY_HEX + 1);
	if (!r && fsync(fd))
		r = -errno;
	if (r)
		r = errmsg(err, errlen, r, "audit key %s: write failed", path);
	OPENSSL_cleanse(hex, sizeof(hex));
	if (close(fd) && !r)
		r = errmsg(err, errlen, -errno, "audit key %s: %s", path, strerror(errno));
	if (r)
		unlink(path);
	return r;
}

int audit_key_load(const char *path, bool create, uint8_t key[AUDIT_KEY_LEN], char *err,
		   size_t errlen)
{
	char hex[KEY_HEX + 2];
	struct stat st;
	ssize_t n;
	int fd, r;

	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT && create)
		return key_create(path, key, err, errlen);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "audit key %s: %s", path, strerror(errno));
	/* Anyone else who can read the key can forge the log; anyone who can write it, too. */
	if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & 077)) {
		close(fd);
		return errmsg(err, errlen, -EPERM,
			      "audit key %s: must be a regular file of ours with mode 0600", path);
	}
	n = read_upto(fd, hex, sizeof(hex));
	close(fd);
	r = 0;
	if (n < KEY_HEX || n > KEY_HEX + 1 || (n == KEY_HEX + 1 && hex[KEY_HEX] != '\n'))
		r = -EINVAL;
	if (!r) {
		hex[KEY_HEX] = '\0';
		r = hex_decode(hex, key, AUDIT_KEY_LEN);
	}
	OPENSSL_cleanse(hex, sizeof(hex));
	if (r)
		return errmsg(err, errlen, -EINVAL, "audit key %s: not %d hex digits", path,
			      KEY_HEX);
	return 0;
}
