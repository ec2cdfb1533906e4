/* The state root measured for the cache (cache_scan.h). */
#include "lifecycle/cache_scan.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "lifecycle/broker.h"
#include "lifecycle/lazy_files.h"
#include "lifecycle/lock.h"

#define SCAN_DEPTH 16

struct scan {
	struct cache_file *f;
	size_t n, cap;
	int err;
};

static void note(struct scan *s, const struct stat *st, int owner)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 1024;
		struct cache_file *f = realloc(s->f, cap * sizeof(*f));
		if (!f) {
			s->err = -ENOMEM;
			return;
		}
		s->f = f;
		s->cap = cap;
	}
	/* A directory has one name of its own (its "." and ".." are not other names). */
	s->f[s->n++] = (struct cache_file){.dev = st->st_dev,
					   .ino = st->st_ino,
					   .nlink = S_ISDIR(st->st_mode) ? 1 : st->st_nlink,
					   .bytes = (uint64_t)st->st_blocks * 512,
					   .owner = owner};
}

static void walk(struct scan *s, int dfd, const char *name, int owner, int depth)
{
	struct stat st;
	struct dirent *e;
	DIR *d;
	int fd;

	if (s->err || fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return; /* gone meanwhile: nothing to count */
	note(s, &st, owner);
	if (!S_ISDIR(st.st_mode) || depth >= SCAN_DEPTH)
		return;
	fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || !(d = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			walk(s, dirfd(d), e->d_name, owner, depth + 1);
	closedir(d);
}

/* State, last use and locks of sandbox dfd into c. */
static void describe(int dfd, struct cache_cand *c)
{
	struct sbx_event ev = {0};
	struct stat st;

	if (sbx_state_read(dfd, &c->state, &ev))
		c->state = SBX_CREATING; /* no log we can read: never evicted */
	c->last_used_ms = ev.time_ms;
	if (!c->last_used_ms && fstat(dfd, &st) == 0)
		c->last_used_ms = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
	c->busy = sbx_lock_held(dfd, SBX_LOCK_VMM) != 0 ||
		  sbx_lock_held(dfd, SBX_LOCK_START) != 0 ||
		  sbx_lock_held(dfd, CACHE_FOLLOW_LOCK) != 0 ||
		  sbx_lock_held(dfd, SBX_LAZY_LOCK) != 0; /* a fetcher still writes its layers */
	c->audit = faccessat(dfd, SBX_BROKER_AUDIT, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

int cache_scan(const struct sbx_root *r, struct cache_cand **out, size_t *n, uint64_t *usage,
	       char *err, size_t errlen)
{
	int fd = dup(r->dfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct scan s = {0};
	struct cache_cand *c = NULL;
	size_t nc = 0, cap = 0;
	struct dirent *e;

	*out = NULL;
	*n = 0;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return errmsg(err, errlen, -errno, "%s: %s", r->state, strerror(errno));
	}
	rewinddir(d); /* the dup shares its offset with r->dfd */
	while (!s.err && (e = readdir(d))) {
		int owner = -1, sfd;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (!sbx_name_check(e->d_name, NULL, 0) &&
		    (sfd = sbx_dir_open(r, e->d_name, false, NULL, 0)) >= 0) {
			if (nc == cap) {
				size_t ncap = cap ? cap * 2 : 64;
				struct cache_cand *nb = realloc(c, ncap * sizeof(*c));
				if (!nb) {
					close(sfd);
					s.err = -ENOMEM;
					break;
				}
				c = nb;
				cap = ncap;
			}
			memset(&c[nc], 0, sizeof(c[nc]));
			strcpy(c[nc].name, e->d_name);
			describe(sfd, &c[nc]);
			close(sfd);
			owner = (int)nc++;
		}
		walk(&s, dirfd(d), e->d_name, owner, 0);
	}
	closedir(d);
	uint64_t *freeable = nc ? calloc(nc, sizeof(*freeable)) : NULL;
	if (!s.err && nc && !freeable)
		s.err = -ENOMEM;
	if (s.err) {
		free(s.f);
		free(c);
		free(freeable);
		return errmsg(err, errlen, s.err, "%s: measuring it: %s", r->state,
			      strerror(-s.err));
	}
	cache_account(s.f, s.n, nc, usage, freeable);
	for (size_t i = 0; i < nc; i++)
		c[i].bytes = freeable[i];
	free(freeable);
	free(s.f);
	*out = c;
	*n = nc;
	return 0;
}
