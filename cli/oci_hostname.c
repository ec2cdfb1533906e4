/* A container's hostname in its guest (cli/oci.h): config.json's, through cove-init's agent (op
 * hostname), before its process starts. */
#include "cli/oci.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

#include <jansson.h>

#include "common/errmsg.h"
#include "sandbox/agent_client.h"

int oci_hostname_apply(struct oci_ctx *x, const char *sandbox, const struct oci_bundle *b)
{
	char uds[PATH_MAX], why[sizeof(x->err)];
	json_t *req, *reply = NULL;
	int fd, r;

	if (!b->hostname[0])
		return 0;
	r = agent_resolve(sandbox, uds, sizeof(uds), x->err, sizeof(x->err));
	if (r)
		return r;
	req = json_pack("{s:s,s:s}", "op", "hostname", "name", b->hostname);
	fd = req ? agent_call(uds, 10, req, &reply, x->err, sizeof(x->err)) : -ENOMEM;
	json_decref(req);
	json_decref(reply);
	if (fd < 0) {
		snprintf(why, sizeof(why), "%s", x->err);
		return errmsg(x->err, sizeof(x->err), fd, "hostname %s: %s", b->hostname, why);
	}
	close(fd);
	return 0;
}
