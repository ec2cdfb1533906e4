/* --policy FILE: checked by cove-broker, then kept beside the spec. */
#include "cli/policy_opt.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errmsg.h"
#include "lifecycle/broker.h"
#include "lifecycle/policy.h"

int policy_take(const char *who, const char *path, char **buf, size_t *len)
{
	char err[512], exe[PATH_MAX];

	if (sbx_policy_load(path, buf, len, err, sizeof(err))) {
		fprintf(stderr, "%s: --policy %s: %s\n", who, path, err);
		return CREATE_EXIT_BAD_POLICY;
	}
	if (sbx_broker_find(exe, sizeof(exe), err, sizeof(err))) {
		fprintf(stderr, "%s: --policy: %s\n", who, err);
		return 1;
	}
	if (sbx_broker_check_policy(exe, path, err, sizeof(err))) {
		fprintf(stderr, "%s: --policy %s: %s\n", who, path, err);
		return CREATE_EXIT_BAD_POLICY;
	}
	return 0;
}

int policy_keep(const struct sbx_root *r, const char *name, int dfd, struct sbx_spec *s,
		const char *buf, size_t len, char *err, size_t errlen)
{
	char *state = realpath(r->state, NULL);
	int n, ret;

	if (!state)
		return errmsg(err, errlen, -errno, "%s: %s", r->state, strerror(errno));
	n = snprintf(s->policy, sizeof(s->policy), "%s/%s/%s", state, name, SBX_POLICY);
	free(state);
	if (n < 0 || (size_t)n >= sizeof(s->policy))
		return errmsg(err, errlen, -ENAMETOOLONG, "policy path too long");
	ret = sbx_policy_write(dfd, buf, len);
	if (ret)
		return errmsg(err, errlen, ret, "cannot write %s: %s", SBX_POLICY, strerror(-ret));
	return 0;
}
