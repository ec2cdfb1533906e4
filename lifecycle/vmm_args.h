/* The command line of a sandbox's VMM: `cove run` for its first boot, `cove restore` after. */
#ifndef COVE_LIFECYCLE_VMM_ARGS_H
#define COVE_LIFECYCLE_VMM_ARGS_H

#include <stddef.h>

#include "lifecycle/root.h"
#include "lifecycle/spec.h"

#define SBX_ARGS_MAX  96
#define SBX_CHAIN     "chain"
#define SBX_CONSOLE   "console.log"
#define SBX_VSOCK_CID 3

struct sbx_args {
	char *argv[SBX_ARGS_MAX + 1];
	int argc;
	char arena[24 * 1024]; /* the strings argv points into */
	size_t used;
};

/*
 * Every path comes from the spec and the root, never from a chain. run: boots the spec's kernel
 * with dirty tracking and a snapshot chain in NAME/chain; restore: starts from that chain's
 * newest layer with the same disks, sockets and key. 0 or -E2BIG.
 */
int sbx_args_run(struct sbx_args *a, const struct sbx_root *r, const char *name,
		 const struct sbx_spec *s);
/* One more argument at the end of a built argv: 0 or -E2BIG. */
int sbx_args_append(struct sbx_args *a, const char *arg);

/* The host's record of the chain files whose digests it checked (chain_verify_stamped). */
#define SBX_DIGEST_STAMPS "digest-stamps"

int sbx_args_restore(struct sbx_args *a, const struct sbx_root *r, const char *name,
		     const struct sbx_spec *s);

#endif
