/* The store's sandboxes, from one listing of sandboxes/ (catalog.h). */
#include "lifecycle/store/catalog.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errmsg.h"
#include "lifecycle/store/sync.h"

/* "sandboxes/NAME/REST": NAME into name, REST returned; NULL for other keys. */
static const char *split(const char *key, char *name, size_t cap)
{
	size_t pl = strlen(STORE_SBX_PREFIX);
	const char *p = key + pl, *slash;
	if (strncmp(key, STORE_SBX_PREFIX, pl) || !(slash = strchr(p, '/')) ||
	    (size_t)(slash - p) >= cap || slash == p)
		return NULL;
	memcpy(name, p, (size_t)(slash - p));
	name[slash - p] = 0;
	return slash + 1;
}

int store_catalog(struct s3_client *c, size_t max, struct store_sandbox **out, size_t *n, char *err,
		  size_t errlen)
{
	*out = NULL;
	*n = 0;
	struct store_sandbox *v = calloc(max ? max : 1, sizeof(*v));
	if (!v)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	char token[S3_KEY_MAX + 1] = "";
	int r = 0;
	for (bool more = true; !r && more;) {
		struct s3_list_page pg;
		r = s3_list(c, STORE_SBX_PREFIX, token, S3_LIST_MAX, &pg, err, errlen);
		if (r)
			break;
		for (size_t i = 0; !r && i < pg.n; i++) {
			char name[SBX_NAME_MAX + 1];
			const char *rest = split(pg.entries[i].key, name, sizeof(name));
			if (!rest || sbx_name_check(name, NULL, 0))
				continue;
			/* Keys come sorted: a sandbox's keys are together. */
			if (!*n || strcmp(v[*n - 1].name, name)) {
				if (*n == max) {
					r = errmsg(err, errlen, -E2BIG,
						   "the store holds more than %zu sandboxes", max);
					break;
				}
				memcpy(v[(*n)++].name, name, strlen(name) + 1);
			}
			struct store_sandbox *s = &v[*n - 1];
			unsigned long long g;
			char tail[8];
			if (!strcmp(rest, STORE_TOMBSTONE)) {
				s->removed = true;
			} else if (sscanf(rest, "gen/%20llu.jso%1s", &g, tail) == 2 && g) {
				s->generations++;
				if (g > s->newest) {
					s->newest = g;
					s->committed = pg.entries[i].mtime;
				}
			}
		}
		more = pg.truncated && pg.next_token[0];
		snprintf(token, sizeof(token), "%s", pg.next_token);
		s3_list_page_free(&pg);
	}
	if (r) {
		free(v);
		*n = 0;
		return r;
	}
	*out = v;
	return 0;
}
