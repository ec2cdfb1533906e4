/* The host's side of a sandbox's chain: settled and its digests checked, outside the jail. */
#include "lifecycle/chain_check.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "lifecycle/lazy_files.h"
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
	/* Memory layers still arriving from the store: their fetcher checks them chunk by chunk. */
	struct sbx_lazy *lz = calloc(1, sizeof(*lz));
	struct chain_skip skip[SBX_LAZY_MAX_FILES];
	int nskip = 0;
	if (!lz)
		return -ENOMEM;
	int dfd = open(r->state, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int sdfd =
	    dfd < 0 ? -1 : openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sdfd >= 0 && sbx_lazy_load(sdfd, lz, e2, sizeof(e2)) == 0)
		for (size_t i = 0; i < lz->n; i++)
			skip[nskip++] = (struct chain_skip){lz->f[i].name, lz->f[i].digest};
	ret = chain_verify_stamped_skip(dir, stamps, skip, nskip, e2, sizeof(e2));
	if (sdfd >= 0)
		close(sdfd);
	if (dfd >= 0)
		close(dfd);
	free(lz);
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
	if (sbx_lazy_pending_at(r, name))
		return errmsg(err, errlen, -EBUSY,
			      "%s: its memory layers are still arriving from the store: archive it "
			      "once they are here",
			      name);
	int ret = sbx_chain_check(r, name, &checked, err, errlen);

	return ret == -EBADMSG ? ret : 0;
}

int sbx_chain_stamps_freeze(const struct sbx_root *r, const char *name, char *err, size_t errlen)
{
	char stamps[PATH_MAX];
	bool checked;
	int ret;

	if (snprintf(stamps, sizeof(stamps), "%s/%s/%s", r->state, name, SBX_DIGEST_STAMPS) >=
	    (int)sizeof(stamps))
		return errmsg(err, errlen, -ENAMETOOLONG, "%s: path too long", name);
	ret = sbx_chain_check(r, name, &checked, err, errlen);
	if (ret)
		return ret;
	ret = chain_stamps_freeze(stamps);
	if (ret)
		return errmsg(err, errlen, ret, "%s: cannot write %s: %s", name, SBX_DIGEST_STAMPS,
			      strerror(-ret));
	return 0;
}
