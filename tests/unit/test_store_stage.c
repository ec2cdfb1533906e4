/* Unit tests of lifecycle/store/stage.c: a chain's newest generation packed into blobs and
 * placed again in an empty directory restores as the same chain; changed files refused. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "chain_fixture.h"
#include "common/file_io.h"
#include "lifecycle/store/stage.h"

static int setup(void **state)
{
	return fx_setup(state, "stage");
}

static int teardown(void **state)
{
	return fx_teardown(state);
}

struct staged {
	size_t n;
	char names[64][STORE_FILE_NAME_MAX];
	struct store_file files[64];
	int fds[64];
	uint64_t lens[64];
};

static void stage_all(const char *dir, int stage_dfd, struct staged *s)
{
	char err[512];
	uint64_t layer = 0;
	assert_int_equal(store_stage_list(dir, s->names, 64, &s->n, &layer, err, sizeof(err)), 0);
	assert_int_equal(layer, 3);
	struct chain *c = calloc(1, sizeof(*c));
	assert_int_equal(chain_load(dir, c, err, sizeof(err)), 0);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY);
	for (size_t i = 0; i < s->n; i++) {
		int r =
		    store_stage_file(dfd, s->names[i], chain_digest_get(c, s->names[i]), stage_dfd,
				     &s->files[i], &s->fds[i], &s->lens[i], err, sizeof(err));
		if (r)
			fail_msg("%s: %s", s->names[i], err);
	}
	close(dfd);
	free(c);
}

static void test_round_trip(void **state)
{
	struct chain_fx *f = *state;
	char stage[64], dst[64], err[512];
	fx_mkdtemp(stage, sizeof(stage), "stage-blobs");
	fx_mkdtemp(dst, sizeof(dst), "stage-dst");
	int sdfd = open(stage, O_RDONLY | O_DIRECTORY), ddfd = open(dst, O_RDONLY | O_DIRECTORY);
	struct staged *s = calloc(1, sizeof(*s));
	stage_all(f->dir, sdfd, s);
	/* Every layer and state, and the generation file last. */
	assert_int_equal(s->n, 7);
	assert_string_equal(s->names[0], "mem-0");
	assert_non_null(strstr(s->names[s->n - 1], "chain"));
	for (size_t i = 0; i < s->n; i++) {
		int r =
		    store_place_file(s->fds[i], s->lens[i], &s->files[i], ddfd, err, sizeof(err));
		if (r)
			fail_msg("place %s: %s", s->names[i], err);
	}
	/* The placed directory holds the same chain, every digest checked. */
	struct chain *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
	assert_int_equal(chain_load(f->dir, a, err, sizeof(err)), 0);
	assert_int_equal(chain_load(dst, b, err, sizeof(err)), 0);
	assert_int_equal(a->nr_layers, b->nr_layers);
	assert_memory_equal(a->chain_id, b->chain_id, 16);
	assert_int_equal(chain_verify_stamped(dst, NULL, err, sizeof(err)), 0);
	/* Placing again: never replaced. */
	assert_int_equal(
	    store_place_file(s->fds[0], s->lens[0], &s->files[0], ddfd, err, sizeof(err)), -EEXIST);
	/* A blob whose manifest entry claims another size, or another digest: refused. */
	struct store_file other = s->files[1];
	snprintf(other.name, sizeof(other.name), "mem-x");
	other.size += 1;
	assert_int_equal(store_place_file(s->fds[1], s->lens[1], &other, ddfd, err, sizeof(err)),
			 -EBADMSG);
	other.size -= 1;
	other.digest[3] ^= 1;
	assert_int_equal(store_place_file(s->fds[1], s->lens[1], &other, ddfd, err, sizeof(err)),
			 -EILSEQ);
	assert_non_null(strstr(err, "mem-x"));
	struct stat st;
	assert_int_not_equal(fstatat(ddfd, "mem-x", &st, 0), 0); /* nothing placed */
	for (size_t i = 0; i < s->n; i++)
		close(s->fds[i]);
	free(a);
	free(b);
	free(s);
	close(sdfd);
	close(ddfd);
	fx_rmdir(stage);
	fx_rmdir(dst);
}

/* A layer changed after its commit is not uploaded: the uploader's own hash names it. */
static void test_changed_layer_refused(void **state)
{
	struct chain_fx *f = *state;
	char path[128], err[512];
	snprintf(path, sizeof(path), "%s/mem-1", f->dir);
	uint8_t b = 0x77;
	fx_write(path, &b, 1, 5000, false);
	struct chain *c = calloc(1, sizeof(*c));
	assert_int_equal(chain_load(f->dir, c, err, sizeof(err)), 0);
	int dfd = open(f->dir, O_RDONLY | O_DIRECTORY);
	struct store_file sf;
	int fd = -1;
	uint64_t len;
	assert_int_equal(store_stage_file(dfd, "mem-1", chain_digest_get(c, "mem-1"), dfd, &sf, &fd,
					  &len, err, sizeof(err)),
			 -EBADMSG);
	assert_non_null(strstr(err, "mem-1: its bytes do not match"));
	assert_int_equal(fd, -1);
	/* Not a plain name, or a link: refused. */
	assert_int_equal(
	    store_stage_file(dfd, "../etc", NULL, dfd, &sf, &fd, &len, err, sizeof(err)), -EINVAL);
	assert_int_equal(symlinkat("/etc/passwd", dfd, "mem-link"), 0);
	assert_int_not_equal(
	    store_stage_file(dfd, "mem-link", NULL, dfd, &sf, &fd, &len, err, sizeof(err)), 0);
	assert_int_equal(unlinkat(dfd, "mem-link", 0), 0);
	close(dfd);
	free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_changed_layer_refused, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
