/* The host's side of a sandbox's chain: settled and its digests checked, outside the jail. */
#include "lifecycle/chain_check.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>

#include "common/errmsg.h"
#include "lifecycle/vmm_args.h"
#include "snapshot/chain.h"

int sbx_chain_check(const struct sbx_root *r, const char *name, bool *checked, char *err,
		    size_t errlen)
{
	char dir[PATH_MAX], stamps[PATH_MAX], e2[512];
	int ret;

	*checked = false;
	if (snprintf(dir, sizeof(dir), "%s/%s/%s", r->state, name, SBX_CHAIN) >= (int)sizeof(dir) ||
	    snprintf(stamps, sizeof(stamps), "%s/%s/%s", r->state, name, SBX_DIGEST_STAMPS) >=
		(int)sizeof(stamps))
		return errmsg(err, errlen, -ENAMETOOLONG, "%s: path too long", name);
	ret = chain_settle(dir, e2, sizeof(e2));
	if (ret)
		return errmsg(err, errlen, ret, "%s: its chain: %s", name, e2);
	ret = chain_verify_stamped(dir, stamps, e2, sizeof(e2));
	if (ret == -ENOENT)
		return 0;
	if (ret < 0)
		return errmsg(err, errlen, ret, "%s: %s", name, e2);
	*checked = ret == 0;
	return 0;
}

int sbx_chain_check_archive(const struct sbx_root *r, const char *name, char *err, size_t errlen)
{
	bool checked;
	int ret = sbx_chain_check(r, name, &checked, err, errlen);

	return ret == -EBADMSG ? ret : 0;
}
