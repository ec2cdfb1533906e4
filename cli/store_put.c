/* cove store put FILE KEY: one file up as one object, the way a generation's layers go up. */
#include "cli/store_put.h"

#include "common/errmsg.h"
#include "common/log.h"
#include "lifecycle/store/s3.h"
#include "lifecycle/store/sync.h"

#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void put_usage(FILE *out)
{
	fprintf(out, "usage: cove store put FILE KEY [--config FILE]\n");
}

/* The fleet's own records live under these: put never writes over them. */
static int put_key_check(const char *key, char *err, size_t errlen)
{
	static const char *const reserved[] = {STORE_SBX_PREFIX, STORE_BLOB_PREFIX};
	if (!key[0] || key[0] == '/')
		return errmsg(err, errlen, -EINVAL, "store put: KEY is empty or starts with '/'");
	for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++)
		if (!strncmp(key, reserved[i], strlen(reserved[i])))
			return errmsg(err, errlen, -EPERM,
				      "store put: keys under %s are the fleet's own (generations, "
				      "leases, blobs): not written by put",
				      reserved[i]);
	return 0;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Opens path and sends it: a single PUT up to STORE_SINGLE_PUT_MAX, else s3_upload_fd with
 * the client's part size and parallelism, as send_blob (sync.c) does for a layer's blob. */
static int put_file(struct s3_client *c, const char *path, const char *key, uint64_t *len,
		    bool *multipart, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "store put: %s: %s", path, strerror(errno));
	struct stat st;
	int r = 0;
	if (fstat(fd, &st))
		r = errmsg(err, errlen, -errno, "store put: %s: %s", path, strerror(errno));
	else if (!S_ISREG(st.st_mode))
		r = errmsg(err, errlen, -EINVAL, "store put: %s is not a regular file", path);
	if (!r) {
		*len = (uint64_t)st.st_size;
		*multipart = *len > STORE_SINGLE_PUT_MAX;
		if (!*len)
			r = s3_put(c, key, "", 0, 0, err, errlen);
		else if (!*multipart)
			r = s3_put_fd(c, key, fd, 0, *len, 0, err, errlen);
		else
			r = s3_upload_fd(c, key, fd, 0, *len, NULL, err, errlen);
	}
	close(fd);
	return r;
}

int store_put_cmd(int argc, char **argv)
{
	const char *config = NULL, *pos[2] = {NULL, NULL};
	int npos = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--config") && i + 1 < argc) {
			config = argv[++i];
		} else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			put_usage(stdout);
			return 0;
		} else if (argv[i][0] != '-' && npos < 2) {
			pos[npos++] = argv[i];
		} else {
			put_usage(stderr);
			return 2;
		}
	}
	if (npos != 2) {
		put_usage(stderr);
		return 2;
	}
	struct logger log = {.level = LOG_INFO, .out = stderr, .name = "cove store"};
	struct store_config *cfg = calloc(1, sizeof(*cfg));
	struct s3_client *c = NULL;
	char err[600] = "";
	uint64_t len = 0, requests = 0, retries = 0;
	bool multipart = false;
	double t0 = now_s(), t1 = t0;
	int r = put_key_check(pos[1], err, sizeof(err));
	if (!r)
		r = cfg ? store_config_load(config, cfg, err, sizeof(err)) : -ENOMEM;
	if (!r)
		r = s3_client_new(cfg, &(struct s3_opts){.log = &log}, &c, err, sizeof(err));
	if (cfg)
		store_config_wipe(cfg);
	free(cfg);
	if (!r) {
		t0 = now_s();
		r = put_file(c, pos[0], pos[1], &len, &multipart, err, sizeof(err));
		t1 = now_s();
		s3_client_counts(c, &requests, &retries);
	}
	s3_client_free(c);
	if (r) {
		log_err(&log, "%s", err[0] ? err : "store put: out of memory");
		return 1;
	}
	double secs = t1 - t0;
	json_t *j = json_pack("{s:s, s:I, s:b, s:f, s:f, s:I, s:I}", "key", pos[1], "bytes",
			      (json_int_t)len, "multipart", multipart, "seconds", secs, "mib_per_s",
			      secs > 0 ? (double)len / (1 << 20) / secs : 0.0, "requests",
			      (json_int_t)requests, "retries", (json_int_t)retries);
	char *text = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
	if (text)
		printf("%s\n", text);
	free(text);
	json_decref(j);
	return 0;
}
