/* A container's mounts in its guest (cli/oci.h): tmpfs mounts through cove-init's agent, then
 * the engines' small files (/etc/hosts, ...) copied in with cove cp. */
#include "cli/oci.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/errmsg.h"
#include "sandbox/agent_client.h"

int oci_mounts_apply(struct oci_ctx *x, const char *sandbox, const struct oci_bundle *b)
{
	char uds[PATH_MAX], to[PATH_MAX + 64];
	int r;

	if (!b->nmounts)
		return 0;
	r = agent_resolve(sandbox, uds, sizeof(uds), x->err, sizeof(x->err));
	if (r)
		return r;
	for (size_t i = 0; i < b->nmounts; i++) {
		const struct oci_mount *m = &b->mounts[i];
		if (m->copy)
			continue;
		json_t *req = json_pack("{s:s,s:s,s:s,s:s}", "op", "mount", "type", "tmpfs",
					"target", m->dest, "size", m->size),
		       *reply = NULL;
		int fd = req ? agent_call(uds, 10, req, &reply, x->err, sizeof(x->err)) : -ENOMEM;
		json_decref(req);
		json_decref(reply);
		if (fd < 0) {
			char why[sizeof(x->err)];
			snprintf(why, sizeof(why), "%s", x->err);
			return errmsg(x->err, sizeof(x->err), fd, "tmpfs at %s: %s", m->dest, why);
		}
		close(fd);
	}
	for (size_t i = 0; i < b->nmounts; i++) {
		const struct oci_mount *m = &b->mounts[i];
		if (!m->copy)
			continue;
		snprintf(to, sizeof(to), "%s:%s", sandbox, m->dest);
		const char *argv[] = {"cove", "cp", m->source, to, NULL};
		r = oci_cove(x, argv);
		if (r) {
			char why[sizeof(x->err)];
			snprintf(why, sizeof(why), "%s", x->err);
			return errmsg(x->err, sizeof(x->err), r < 0 ? r : -EIO, "copy to %s: %s",
				      m->dest, why);
		}
	}
	return 0;
}
