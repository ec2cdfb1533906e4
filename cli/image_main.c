/* cove-image: `cove image ...` (cmd_image.c execs it), a dynamic helper beside cove so that
 * libarchive stays out of the static cove and out of cove-vmm. */
#include "common/errmsg.h"
#include "common/log.h"
#include "common/size_parse.h"
#include "image/cache.h"
#include "image/import.h"
#include "lifecycle/root.h"
#include "lifecycle/tree.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXIT_USAGE   2
#define DEFAULT_MAX  (16ULL << 30)
#define DEFAULT_FREE (1ULL << 30)

static void usage(FILE *out)
{
	fprintf(
	    out,
	    "usage: cove image import SOURCE [--name NAME] [--max-size SIZE] [--free SIZE] "
	    "[--json]\n"
	    "       cove image ls [--json]\n"
	    "       cove image inspect NAME\n"
	    "       cove image rm NAME\n"
	    "Images are kept in ${COVE_STATE_DIR:-/var/lib/cove}/.images, one sparse ext4 "
	    "root per\nimage digest; `cove create NAME --image IMAGE` starts a sandbox from "
	    "one.\n"
	    "SOURCE: an OCI image layout directory, an OCI archive or docker-archive (a tar "
	    "file),\n"
	    "or TRANSPORT:WHAT as skopeo writes it: oci:DIR[:REF], oci-archive:FILE[:REF],\n"
	    "docker-archive:FILE[:REF], containers-storage:REF (copied out through skopeo).\n"
	    "  --name NAME     the name to use (default: the one the source gives, else the\n"
	    "                  file name)\n"
	    "  --max-size SIZE refuse an image that unpacks to more (default 16G)\n"
	    "  --free SIZE     room left in its ext4 for the sandbox's own files (default 1G;\n"
	    "                  the file is sparse)\n"
	    "  --json          one JSON object (\"v\": 1; docs/CLI.md's shape \"image import\"):\n"
	    "                  name, digest, cached, ms, layers, entries, unpacked_bytes,\n"
	    "                  ext4_bytes (image ls --json: shape \"image ls\")\n"
	    "A second import of an image already here unpacks nothing (\"cached\": true).\n");
}

static int open_cache(bool create, struct sbx_root *root, int *cachefd, char *err, size_t errlen)
{
	int r = sbx_root_open(root, create, err, errlen);
	if (r)
		return r;
	*cachefd = image_cache_open(root->dfd, create, err, errlen);
	if (*cachefd < 0) {
		sbx_root_close(root);
		return *cachefd;
	}
	return 0;
}

static int cmd_import(int argc, char **argv, struct logger *log)
{
	struct import_opts o = {.max_bytes = DEFAULT_MAX, .free_bytes = DEFAULT_FREE};
	bool json = false;
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "--json"))
			json = true;
		else if (!strcmp(a, "--name") && i + 1 < argc)
			o.name = argv[++i];
		else if (!strcmp(a, "--max-size") && i + 1 < argc) {
			if (size_parse(argv[++i], &o.max_bytes) || !o.max_bytes) {
				fprintf(stderr, "cove image: --max-size %s: not a size\n", argv[i]);
				return EXIT_USAGE;
			}
		} else if (!strcmp(a, "--free") && i + 1 < argc) {
			if (size_parse(argv[++i], &o.free_bytes) || o.free_bytes > (1ULL << 40)) {
				fprintf(stderr, "cove image: --free %s: not a size\n", argv[i]);
				return EXIT_USAGE;
			}
		} else if (a[0] != '-' && !o.source)
			o.source = a;
		else {
			usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (!o.source) {
		usage(stderr);
		return EXIT_USAGE;
	}
	char err[768];
	struct sbx_root root;
	int cachefd;
	struct import_result res;
	int r = open_cache(true, &root, &cachefd, err, sizeof(err));
	if (!r) {
		r = image_import(cachefd, &o, &res, log, err, sizeof(err));
		close(cachefd);
		sbx_root_close(&root);
	}
	if (r) {
		if (json)
			fprintf(stderr, "{\"version\":1,\"error\":\"%s\",\"exit\":1}\n",
				r == -EINVAL || r == -ELOOP || r == -EBADMSG || r == -EFBIG ||
					r == -E2BIG
				    ? "refused"
				    : "failed");
		fprintf(stderr, "cove image import: %s\n", err);
		return 1;
	}
	if (json) {
		json_t *j = json_pack(
		    "{s:i,s:s,s:s,s:s+,s:b,s:I,s:I,s:I,s:I,s:I,s:I}", "v", 1, "command",
		    "image import", "name", res.name, "digest", "sha256:", res.hex, "cached",
		    res.cached, "ms", (json_int_t)res.ms, "layers", (json_int_t)res.layers,
		    "entries", (json_int_t)res.entries, "unpacked_bytes", (json_int_t)res.bytes,
		    "ext4_bytes", (json_int_t)res.ext4_bytes, "special_skipped",
		    (json_int_t)res.special);
		char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
		printf("%s\n", t ? t : "{}");
		free(t);
		json_decref(j);
	} else if (res.cached) {
		printf("%s: sha256:%s already imported: cache hit, nothing unpacked (%.2f s)\n",
		       res.name, res.hex, res.ms / 1000.0);
	} else {
		printf("%s: sha256:%s imported: %llu layers, %llu entries, %llu MiB of files, an "
		       "ext4 of %llu MiB (sparse) in %.2f s\n",
		       res.name, res.hex, (unsigned long long)res.layers,
		       (unsigned long long)res.entries, (unsigned long long)(res.bytes >> 20),
		       (unsigned long long)(res.ext4_bytes >> 20), res.ms / 1000.0);
	}
	return 0;
}

static int cmd_ls(int argc, char **argv)
{
	bool json = argc > 2 && !strcmp(argv[2], "--json");
	char err[512];
	struct sbx_root root;
	int cachefd;
	json_t *refs = NULL, *out = json_array();
	int r = open_cache(false, &root, &cachefd, err, sizeof(err));
	if (r == -ENOENT) {
		r = 0;
		cachefd = -1;
	} else if (!r) {
		r = image_refs_read(cachefd, &refs, err, sizeof(err));
	}
	if (r) {
		fprintf(stderr, "cove image ls: %s\n", err);
		return 1;
	}
	const char *name;
	json_t *v;
	if (!json)
		printf("%-40s %-19s %10s %10s\n", "NAME", "DIGEST", "FILES", "EXT4");
	json_object_foreach(refs, name, v)
	{
		const char *hex = json_string_value(v);
		json_t *m = NULL;
		if (!hex || image_meta_read(cachefd, hex, &m, err, sizeof(err)))
			continue;
		json_int_t bytes = json_integer_value(json_object_get(m, "unpacked_bytes"));
		json_int_t ext4 = json_integer_value(json_object_get(m, "ext4_bytes"));
		if (json)
			json_array_append_new(
			    out, json_pack("{s:s,s:s+,s:I,s:I,s:O}", "name", name, "digest",
					   "sha256:", hex, "unpacked_bytes", bytes, "ext4_bytes",
					   ext4, "config", json_object_get(m, "config")));
		else
			printf("%-40s sha256:%.12s %9lldM %9lldM\n", name, hex,
			       (long long)(bytes >> 20), (long long)(ext4 >> 20));
		json_decref(m);
	}
	if (json) {
		json_t *j =
		    json_pack("{s:i,s:s,s:O}", "v", 1, "command", "image ls", "images", out);
		char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
		printf("%s\n", t ? t : "{}");
		free(t);
		json_decref(j);
	}
	json_decref(out);
	json_decref(refs);
	if (cachefd >= 0) {
		close(cachefd);
		sbx_root_close(&root);
	}
	return 0;
}

static int cmd_inspect_rm(int argc, char **argv, bool rm)
{
	if (argc != 3) {
		usage(stderr);
		return EXIT_USAGE;
	}
	char err[512], hex[DIGEST_HEX + 1];
	struct sbx_root root;
	int cachefd;
	int r = open_cache(false, &root, &cachefd, err, sizeof(err));
	if (!r)
		r = image_resolve(cachefd, argv[2], hex, err, sizeof(err));
	json_t *m = NULL;
	if (!r && !rm)
		r = image_meta_read(cachefd, hex, &m, err, sizeof(err));
	if (!r && !rm) {
		char *t = json_dumps(m, JSON_INDENT(2) | JSON_SORT_KEYS);
		printf("%s\n", t ? t : "{}");
		free(t);
		json_decref(m);
	}
	if (!r && rm) {
		/* Every name of that digest goes, then its files: sandboxes made from it hold
		 * their own hard link of its root (cove create --image). */
		json_t *refs = NULL;
		r = image_refs_read(cachefd, &refs, err, sizeof(err));
		const char *name;
		json_t *v;
		void *tmp;
		json_object_foreach_safe(refs, tmp, name, v)
		{
			if (!r && json_is_string(v) && !strcmp(json_string_value(v), hex))
				r = image_ref_set(cachefd, name, NULL, err, sizeof(err));
		}
		json_decref(refs);
		if (!r)
			r = sbx_tree_remove(cachefd, hex);
		if (!r)
			printf("%s: sha256:%s removed\n", argv[2], hex);
		else if (!err[0])
			snprintf(err, sizeof(err), "cannot remove it: %s", strerror(-r));
	}
	if (cachefd >= 0 && r != -ENOENT) {
		close(cachefd);
		sbx_root_close(&root);
	}
	if (r) {
		fprintf(stderr, "cove image %s: %s\n", rm ? "rm" : "inspect", err);
		return r == -ENOENT ? 66 : 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct logger log = {.level = LOG_INFO, .out = stderr, .name = "cove image"};
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? EXIT_USAGE : 0;
	}
	if (!strcmp(argv[1], "import"))
		return cmd_import(argc, argv, &log);
	if (!strcmp(argv[1], "ls"))
		return cmd_ls(argc, argv);
	if (!strcmp(argv[1], "inspect"))
		return cmd_inspect_rm(argc, argv, false);
	if (!strcmp(argv[1], "rm"))
		return cmd_inspect_rm(argc, argv, true);
	usage(stderr);
	return EXIT_USAGE;
}
