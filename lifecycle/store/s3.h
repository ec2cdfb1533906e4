/* An S3 client over libcurl (SigV4, verified TLS, retries): objects, listings, multipart. */
#ifndef COVE_S3_H
#define COVE_S3_H

#include "lifecycle/store/store_config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct logger;
struct s3_client;

#define S3_KEY_MAX	  1024 /* bytes of a full key (prefix included), as S3's own limit */
#define S3_ETAG_MAX	  80
#define S3_UPLOAD_ID_MAX  512
#define S3_REPLY_MAX	  (1u << 20) /* bytes of an XML reply */
#define S3_ERROR_BODY_MAX 4096	     /* bytes of an error reply kept for its <Code> */
#define S3_LIST_MAX	  1000	     /* keys per ListObjectsV2 page */
#define S3_PART_MIN	  (5u << 20)
#define S3_PART_MAX	  (512u << 20)
#define S3_PARTS_MAX	  10000
#define S3_PARALLEL_MAX	  16

/* PUT flags */
#define S3_IF_NONE_MATCH 1u /* create only: an existing key answers 412, returned as -EEXIST */
#define S3_IF_MATCH	 2u /* replace only the version whose ETag is given: else 412, -ESTALE */

struct s3_opts {
	struct logger *log;	     /* NULL: silent */
	int max_attempts;	     /* per request, first try included; 0: 6 */
	unsigned base_delay_ms;	     /* backoff base; 0: 100 */
	unsigned max_delay_ms;	     /* backoff cap; 0: 5000 */
	unsigned connect_timeout_ms; /* 0: 5000 */
	unsigned stall_timeout_s;    /* a transfer under 1 KiB/s this long is cut; 0: 30 */
	size_t part_size;	     /* multipart part size; 0: 8 MiB */
	int parallel;		     /* parts in flight; 0: 4 */
	/* test only: CURLOPT_RESOLVE entries ("host:port:addr"), NULL-terminated; NULL: none */
	const char *const *resolve;
};

/* A client for cfg's endpoint and bucket (cfg is copied, secrets included). 0 or -errno.
 * The process calls curl_global_init (and xmlInitParser) once before its first client. One
 * client is used by one thread at a time. */
int s3_client_new(const struct store_config *cfg, const struct s3_opts *opts,
		  struct s3_client **out, char *err, size_t errlen);
/* Wipes the copied secrets and frees. NULL is fine. */
void s3_client_free(struct s3_client *c);
/* Requests made and retries taken so far (for tests and logs). */
void s3_client_counts(const struct s3_client *c, uint64_t *requests, uint64_t *retries);

/*
 * Every key below is relative to the configured prefix. Every function returns 0 or -errno
 * with one line in err: -ENOENT (404), -EEXIST (412 on a create-only PUT), -EACCES (403),
 * -EOPNOTSUPP (501), -ERANGE (416), -EKEYREJECTED (TLS peer not verified), -EBADMSG (a reply
 * that breaks the protocol or a cap), -EIO (5xx or connection errors after every attempt).
 */
int s3_put(struct s3_client *c, const char *key, const void *buf, size_t len, unsigned flags,
	   char *err, size_t errlen);
/* PUTs fd's bytes [off, off+len), read with pread as they are sent. */
int s3_put_fd(struct s3_client *c, const char *key, int fd, off_t off, uint64_t len, unsigned flags,
	      char *err, size_t errlen);

/*
 * A conditional PUT of a small object from a buffer: create-only when if_match is NULL
 * (-EEXIST on 412), else only over the version whose ETag is if_match (-ESTALE on 412; quotes
 * around it are dropped: RGW matches only the bare ETag). The new version's ETag (bare) into
 * etag_out (S3_ETAG_MAX + 1 bytes), "" when the server sent none. A retried request can meet
 * its own first attempt's write: the caller decides what a 412 after a lost reply means.
 */
int s3_put_cond(struct s3_client *c, const char *key, const void *buf, size_t len,
		const char *if_match, char *etag_out, char *err, size_t errlen);
/* GETs a whole object of at most cap bytes, with its ETag (bare) into etag_out. */
int s3_get_etag(struct s3_client *c, const char *key, void *buf, size_t cap, size_t *got,
		char *etag_out, char *err, size_t errlen);

/* GETs the object (len 0: whole; else bytes [off, off+len)) into buf (cap bytes); *got is
 * the byte count. A reply longer than cap is refused (-EFBIG). */
int s3_get(struct s3_client *c, const char *key, uint64_t off, uint64_t len, void *buf, size_t cap,
	   size_t *got, char *err, size_t errlen);
/* The same, written to fd at fd_off with pwrite; at most cap bytes. */
int s3_get_fd(struct s3_client *c, const char *key, uint64_t off, uint64_t len, int fd,
	      off_t fd_off, uint64_t cap, uint64_t *got, char *err, size_t errlen);

struct s3_object_info {
	uint64_t size;
	char etag[S3_ETAG_MAX + 1];
};
int s3_head(struct s3_client *c, const char *key, struct s3_object_info *info, char *err,
	    size_t errlen);
/* DELETE; a missing key is success (S3 answers 204 either way). */
int s3_delete(struct s3_client *c, const char *key, char *err, size_t errlen);

struct s3_list_entry {
	char key[S3_KEY_MAX + 1]; /* relative to the configured prefix */
	uint64_t size;
	char etag[S3_ETAG_MAX + 1];
	int64_t mtime; /* LastModified, seconds since the epoch; 0 when absent or unreadable */
};
struct s3_list_page {
	struct s3_list_entry *entries;
	size_t n;
	bool truncated;
	char next_token[S3_KEY_MAX + 1];
};
/* One ListObjectsV2 page of keys under prefix (relative), at most max_keys (<= S3_LIST_MAX),
 * continuing from token (NULL or "" for the first page). Free with s3_list_page_free. */
int s3_list(struct s3_client *c, const char *prefix, const char *token, size_t max_keys,
	    struct s3_list_page *page, char *err, size_t errlen);
void s3_list_page_free(struct s3_list_page *page);

/* Multipart upload, step by step. */
struct s3_part {
	int number;
	char etag[S3_ETAG_MAX + 1];
};
int s3_mpu_create(struct s3_client *c, const char *key, char *upload_id, size_t idlen, char *err,
		  size_t errlen);
int s3_mpu_complete(struct s3_client *c, const char *key, const char *upload_id,
		    const struct s3_part *parts, size_t n, char *err, size_t errlen);
int s3_mpu_abort(struct s3_client *c, const char *key, const char *upload_id, char *err,
		 size_t errlen);

struct s3_upload_hooks {
	/* called after each part is stored (in the caller's thread); NULL: none */
	void (*part_done)(void *arg, int part_number);
	/* called as body bytes are read from the fd (retried parts count again); NULL: none */
	void (*bytes_read)(void *arg, uint64_t total);
	void *arg;
};
/*
 * Uploads fd's bytes [off, off+len) to key as a multipart upload: parts of opts.part_size
 * read with pread while they are sent, opts.parallel at a time over one curl multi handle,
 * each retried on its own; completed, or aborted when it gives up. 0 or -errno.
 */
int s3_upload_fd(struct s3_client *c, const char *key, int fd, off_t off, uint64_t len,
		 const struct s3_upload_hooks *hooks, char *err, size_t errlen);

struct s3_upload_entry {
	char key[S3_KEY_MAX + 1]; /* relative to the configured prefix */
	char upload_id[S3_UPLOAD_ID_MAX + 1];
};
/* The multipart uploads in progress under prefix (relative), at most max; *out is malloc'd. */
int s3_list_uploads(struct s3_client *c, const char *prefix, size_t max,
		    struct s3_upload_entry **out, size_t *n, char *err, size_t errlen);

#endif
