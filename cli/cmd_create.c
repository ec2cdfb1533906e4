/* `cove create NAME`: a sandbox that outlives its process, made from defaults and started. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/create_from.h"
#include "cli/policy_opt.h"
#include "cli/sandbox_up.h"
#include "cli/store_reconnect.h"
#include "common/clock.h"
#include "common/errmsg.h"
#include "sandbox/event_log.h"
#include "lifecycle/broker.h"
#include "lifecycle/gc.h"
#include "lifecycle/guest_files.h"
#include "lifecycle/name.h"
#include "lifecycle/policy.h"
#include "lifecycle/root.h"
#include "lifecycle/spec.h"
#include "lifecycle/template.h"
#include "lifecycle/tombstone.h"
#include "lifecycle/tree.h"
#include "lifecycle/warm.h"
#include "cli/create_image.h"
#include "sandbox/options.h"

static const char create_usage[] =
    "usage: cove create NAME [--mem SIZE] [--vcpus N] [--cpu-template NAME]\n"
    "                   [--disk PATH[,ro][,bw=R,...]]...\n"
    "                   [--key SPEC] [--snapshot-every DURATION|off]\n"
    "                   [--idle-stop D] [--archive-after D] [--delete-after D]\n"
    "                   [--kernel FILE] [--rootfs FILE.ext4 | --initrd FILE]\n"
    "                   [--policy FILE] [--vsock-rate RATE] [--no-seccomp] [--no-jail]\n"
    "                   [--cold] [--image IMAGE [--on-exit restart|stop]] [--json]\n"
    "       cove create NAME --from T [--policy FILE] [--snapshot-every D] [--idle-stop D]\n"
    "                   [--archive-after D] [--delete-after D] [--json]\n"
    "--json: one JSON object on stdout, or one JSON line with \"exit\" on stderr\n"
    "(docs/CLI.md, \"JSON output\").\n"
    "Creates the sandbox NAME in ${COVE_STATE_DIR:-/var/lib/cove}/NAME and starts it: the guest\n"
    "kernel and root image this project builds (found in $COVE_GUEST_DIR, the build cache or\n"
    "/usr/share/cove), the root disk a copy-on-write overlay of that shared image, vsock and\n"
    "an API socket in ${COVE_RUN_DIR:-/run/cove}/NAME/, a snapshot chain with one snapshot\n"
    "every 60 s. cove-init runs its agent and waits for `cove exec NAME -- CMD`.\n"
    "Warm by default: NAME is a restore of the implicit template of its machine (kernel,\n"
    "root image or initramfs, --mem, --vcpus, --cpu-template, --vsock-rate, --no-seccomp,\n"
    "and the cove-vmm binary), as with --from: the first create of a configuration boots\n"
    "it once and saves it as template warm-<16 hex digits> (cove template ls), and a\n"
    "changed input (a rebuilt kernel, root image or cove-init) makes a new one. --key,\n"
    "--disk and --no-jail always boot (cold).\n"
    "  --cold                  boot NAME's kernel instead of restoring a template\n"
    "  --checkpoint DIR        resume a checkpointed machine instead: the clone of the\n"
    "                          template (implicit or --from) takes the chain and disk\n"
    "                          overlays packed in DIR (a cove archive, checked entry by\n"
    "                          entry), under the template's own spec (cove-oci restore)\n"
    "  --image IMAGE           the root is an imported OCI image (cove image import; ls):\n"
    "                          its ext4 under a copy-on-write overlay, cove-init kept on\n"
    "                          a tmpfs at /.cove. Its Entrypoint + Cmd is the sandbox's\n"
    "                          main process (its Env, WorkingDir, User); its Env,\n"
    "                          WorkingDir and User are cove exec's defaults. Warm too:\n"
    "                          the image and --on-exit are part of the implicit\n"
    "                          template's key, whose main process is saved running\n"
    "                          (with --on-exit stop it boots: the main process could\n"
    "                          end the template's build)\n"
    "  --on-exit restart|stop  when the main process exits: start it again after 1 s,\n"
    "                          doubling to 30 s (default), or stop the VM\n"
    "  --mem SIZE              guest RAM (default 256M)\n"
    "  --vcpus N               (default 1)\n"
    "  --cpu-template NAME     the guest sees only this CPU baseline (baseline-v2), now and\n"
    "                          at every restore, so it moves between hosts whose CPUs\n"
    "                          differ beyond it (vmm/CPU_TEMPLATES.md). Without one a restore\n"
    "                          on a host lacking a feature the guest saw exits 76\n"
    "  --disk PATH[,ro]        another disk (/dev/vdb...), the file itself; a rate limit\n"
    "                          with ,bw=50M,iops=1000,burst=SIZE,iops-burst=N (as cove run)\n"
    "  --vsock-rate RATE       bytes/s per vsock connection each way (e.g. 10M)\n"
    "  --no-seccomp            its VMM runs without seccomp filters at every start and\n"
    "                          restore (debugging only; the VMM warns in its log)\n"
    "  --no-jail               its VMM runs unjailed (by default it runs in namespaces of its\n"
    "                          own, with only this sandbox's files, as this user without\n"
    "                          capabilities: cove run --jail)\n"
    "  --key SPEC              encrypt the chain (key-cmd:CMD or pkcs11:CONFIG)\n"
    "  --snapshot-every D      60s, 5m...; off: only at stop (default 60s)\n"
    "  --idle-stop D           stop itself (snapshot first) after D with no exec session,\n"
    "                          running command, API call, vsock traffic or guest CPU use\n"
    "  --archive-after D       `cove gc` archives it once stopped for D (7d...)\n"
    "  --delete-after D        `cove gc` deletes it once unused for D (30d...)\n"
    "  --kernel, --rootfs      another kernel or base image; --initrd boots an initramfs\n"
    "                          with no root disk\n"
    "  --policy FILE           a cove-broker policy (JSON, at most 256 KiB), copied into\n"
    "                          the sandbox as policy.json: a broker runs beside it, its\n"
    "                          audit log in NAME/audit.jsonl, a new grant at every start\n"
    "  --from T                make NAME from template T (cove template --help) instead of\n"
    "                          booting: its newest snapshot cloned (files shared by hard\n"
    "                          link) and restored as a new machine (RNG reseeded, clock,\n"
    "                          hostname NAME, a new /etc/machine-id and boot_id, a new\n"
    "                          broker token). The machine (kernel, root, --mem, --vcpus)\n"
    "                          is the template's: only --policy, --snapshot-every,\n"
    "                          --idle-stop, --archive-after and --delete-after go with\n"
    "                          --from. With a policy (its own, else the template's) NAME\n"
    "                          gets a broker and an egress CA of its own, which replaces\n"
    "                          the template's CA in the guest's trust store.\n"
    "NAME: [a-z0-9][a-z0-9-]*, at most 48 characters.\n";

enum {
	O_MEM = 256,
	O_VCPUS,
	O_DISK,
	O_KEY,
	O_EVERY,
	O_KERNEL,
	O_ROOTFS,
	O_INITRD,
	O_ARCH,
	O_DEL,
	O_IDLE,
	O_POLICY,
	O_VRATE,
	O_NO_SECCOMP,
	O_NO_JAIL,
	O_FROM,
	O_CPU_TEMPLATE,
	O_COLD,
	O_IMAGE,
	O_ON_EXIT,
	O_CHECKPOINT
};

static const struct option create_opts[] = {
    {"mem", required_argument, NULL, O_MEM},
    {"vcpus", required_argument, NULL, O_VCPUS},
    {"cpu-template", required_argument, NULL, O_CPU_TEMPLATE},
    {"disk", required_argument, NULL, O_DISK},
    {"key", required_argument, NULL, O_KEY},
    {"snapshot-every", required_argument, NULL, O_EVERY},
    {"kernel", required_argument, NULL, O_KERNEL},
    {"rootfs", required_argument, NULL, O_ROOTFS},
    {"initrd", required_argument, NULL, O_INITRD},
    {"archive-after", required_argument, NULL, O_ARCH},
    {"delete-after", required_argument, NULL, O_DEL},
    {"idle-stop", required_argument, NULL, O_IDLE},
    {"policy", required_argument, NULL, O_POLICY},
    {"vsock-rate", required_argument, NULL, O_VRATE},
    {"no-seccomp", no_argument, NULL, O_NO_SECCOMP},
    {"no-jail", no_argument, NULL, O_NO_JAIL},
    {"from", required_argument, NULL, O_FROM},
    {"cold", no_argument, NULL, O_COLD},
    {"image", required_argument, NULL, O_IMAGE},
    {"on-exit", required_argument, NULL, O_ON_EXIT},
    {"checkpoint", required_argument, NULL, O_CHECKPOINT},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* An absolute copy of a host path the user gave (the VMM starts elsewhere later). */
static int abs_path(const char *in, char *out, size_t cap, char *err, size_t errlen)
{
	char *r = realpath(in, NULL);
	int ret = 0;

	if (!r)
		return snprintf(err, errlen, "%s: %s", in, strerror(errno)), -errno;
	if ((size_t)snprintf(out, cap, "%s", r) >= cap)
		ret = (snprintf(err, errlen, "%s: path too long", in), -ENAMETOOLONG);
	free(r);
	return ret;
}

static int add_disk(struct sbx_spec *s, const char *arg, char *err, size_t errlen)
{
	struct disk_opt d;
	struct sbx_disk *k;

	if (s->nr_disks >= SBX_MAX_DISKS)
		return snprintf(err, errlen, "at most %d disks", SBX_MAX_DISKS - 1), -E2BIG;
	if (parse_disk_opt(arg, &d, err, errlen))
		return -EINVAL;
	if (d.overlay[0])
		return snprintf(err, errlen,
				"--disk: the sandbox keeps its own overlays (give the "
				"base without overlay=)"),
		       -EINVAL;
	k = &s->disks[s->nr_disks];
	if (abs_path(d.path, k->path, sizeof(k->path), err, errlen))
		return -EINVAL;
	k->read_only = d.read_only;
	k->rate = d.rate;
	s->nr_disks++;
	return 0;
}

/* What `cove create` was asked: the spec it builds, and a template to clone instead. */
struct create_args {
	const char *name, *policy, *from;
	const char *machine_opt; /* the first option that names the machine (not with --from) */
	bool cold;		 /* --cold: boot, never a template */
	const char *image;	 /* --image REF (cove image ls) */
	const char *on_exit;	 /* --on-exit: the image's main process ends: restart | stop */
	const char *checkpoint;	 /* --checkpoint DIR: the chain from a checkpoint's archive */
	json_t *image_meta;	 /* the image's record, for the sandbox's image.json */
};

static int parse(int argc, char **argv, struct sbx_spec *s, struct create_args *a, char *err,
		 size_t errlen)
{
	char extra[SBX_MAX_DISKS][4096];
	int nextra = 0, c;
	const char **name = &a->name, **policy = &a->policy;
	char rootfs[4096] = "", initrd[4096] = "";

	s->mem_bytes = 256ULL << 20;
	s->vcpus = 1;
	s->snapshot_every_ms = 60000;
	optind = 1;
	opterr = 0;
	int li = -1;
	while ((c = getopt_long(argc, argv, "h", create_opts, &li)) != -1) {
		if (!a->machine_opt && li >= 0 && c != O_FROM && c != O_EVERY && c != O_IDLE &&
		    c != O_ARCH && c != O_DEL && c != O_POLICY && c != 'h')
			a->machine_opt = create_opts[li].name;
		li = -1;
		switch (c) {
		case O_FROM:
			if (tpl_name_check(optarg, err, errlen))
				return -EINVAL;
			a->from = optarg;
			break;
		case 'h':
			return 1;
		case O_COLD:
			a->cold = true;
			break;
		case O_IMAGE:
			a->image = optarg;
			break;
		case O_CHECKPOINT:
			a->checkpoint = optarg;
			break;
		case O_ON_EXIT:
			if (strcmp(optarg, "restart") && strcmp(optarg, "stop"))
				return snprintf(err, errlen, "--on-exit: restart or stop"), -EINVAL;
			a->on_exit = optarg;
			break;
		case O_MEM:
			if (parse_mem_size(optarg, &s->mem_bytes) || s->mem_bytes < (16ULL << 20))
				return snprintf(err, errlen, "--mem: bad size '%s'", optarg),
				       -EINVAL;
			break;
		case O_VCPUS:
			s->vcpus = atoi(optarg);
			if (s->vcpus < 1 || s->vcpus > 64)
				return snprintf(err, errlen, "--vcpus: 1 to 64"), -EINVAL;
			break;
		case O_CPU_TEMPLATE:
			if (opt_cpu_template(optarg, err, errlen))
				return -EINVAL;
			snprintf(s->cpu_template, sizeof(s->cpu_template), "%s", optarg);
			break;
		case O_DISK:
			if (nextra >= SBX_MAX_DISKS - 1)
				return snprintf(err, errlen, "at most %d disks", SBX_MAX_DISKS - 1),
				       -E2BIG;
			snprintf(extra[nextra++], sizeof(extra[0]), "%s", optarg);
			break;
		case O_KEY:
			if (opt_key_spec("--key", optarg, err, errlen))
				return -EINVAL;
			snprintf(s->key, sizeof(s->key), "%s", optarg);
			break;
		case O_EVERY:
			if (!strcmp(optarg, "off"))
				s->snapshot_every_ms = 0;
			else if (parse_duration_ms(optarg, &s->snapshot_every_ms) ||
				 s->snapshot_every_ms < 1000)
				return snprintf(
					   err, errlen,
					   "--snapshot-every: a duration of 1s or more, or off"),
				       -EINVAL;
			break;
		case O_IDLE:
			if (opt_idle_stop(optarg, &s->idle_stop_ms, err, errlen))
				return -EINVAL;
			break;
		case O_ARCH:
		case O_DEL:
			if (parse_duration_ms(optarg, c == O_ARCH ? &s->archive_after_ms
								  : &s->delete_after_ms))
				return snprintf(err, errlen, "--%s: a duration (90s, 15m, 7d)",
						c == O_ARCH ? "archive-after" : "delete-after"),
				       -EINVAL;
			break;
		case O_POLICY:
			*policy = optarg;
			break;
		case O_VRATE:
			if (opt_vsock_rate(optarg, &s->vsock_rate, err, errlen))
				return -EINVAL;
			break;
		case O_NO_JAIL:
			s->no_jail = true;
			break;
		case O_NO_SECCOMP:
			s->no_seccomp = true;
			break;
		case O_KERNEL:
			if (abs_path(optarg, s->kernel, sizeof(s->kernel), err, errlen))
				return -EINVAL;
			break;
		case O_ROOTFS:
			if (abs_path(optarg, rootfs, sizeof(rootfs), err, errlen))
				return -EINVAL;
			break;
		case O_INITRD:
			if (abs_path(optarg, initrd, sizeof(initrd), err, errlen))
				return -EINVAL;
			break;
		default:
			return snprintf(err, errlen, "unknown option '%s'", argv[optind - 1]),
			       -EINVAL;
		}
	}
	if (optind != argc - 1)
		return snprintf(err, errlen, "want exactly one NAME"), -EINVAL;
	*name = argv[optind];
	if (sbx_name_check(*name, err, errlen))
		return -EINVAL;
	/* A clone of a template: its machine is the template's. */
	if (a->from && a->machine_opt)
		return snprintf(err, errlen,
				"--%s: with --from the machine is the template's (only --policy, "
				"--snapshot-every, --idle-stop, --archive-after, --delete-after)",
				a->machine_opt),
		       -EINVAL;
	if (a->from)
		return 0;
	if (a->on_exit && !a->image)
		return snprintf(err, errlen, "--on-exit goes with --image"), -EINVAL;
	if (a->image && (rootfs[0] || initrd[0]))
		return snprintf(err, errlen, "--image and --%s: one root, not both",
				rootfs[0] ? "rootfs" : "initrd"),
		       -EINVAL;
	if (a->image)
		c = create_image_spec(s, *name, a->image, a->on_exit ? a->on_exit : "restart",
				      &a->image_meta, err, errlen);
	else
		c = sbx_spec_guest(s, *name, rootfs, initrd, err, errlen);
	if (c)
		return c;
	for (int i = 0; i < nextra; i++)
		if (add_disk(s, extra[i], err, errlen))
			return -EINVAL;
	return 0;
}

int cmd_create(int argc, char **argv)
{
	struct sbx_spec *s = calloc(1, sizeof(*s));
	struct sbx_root r = {.dfd = -1};
	struct create_args a = {0};
	const char *name, *policy_arg;
	char *policy = NULL;
	size_t policy_len = 0;
	char err[512];
	int ret, dfd = -1, status = 1;

	if (!s)
		return 1;
	ret = parse(argc, argv, s, &a, err, sizeof(err));
	name = a.name;
	policy_arg = a.policy;
	if (ret == 1) {
		fputs(create_usage, stdout);
		status = 0;
		goto out;
	}
	if (ret) {
		fprintf(stderr, "cove create: %s (try 'cove create --help')\n", err);
		status =
		    name && ret == -EINVAL && sbx_name_check(name, NULL, 0) ? SBX_EXIT_BAD_NAME : 2;
		goto out;
	}
	if (policy_arg && (status = policy_take("cove create", policy_arg, &policy, &policy_len)))
		goto out;
	if (a.checkpoint && !a.from &&
	    (a.cold || warm_ineligible(s) || (a.on_exit && !strcmp(a.on_exit, "stop")))) {
		fprintf(stderr, "cove create: --checkpoint resumes a template's clone: not with "
				"--cold, --key, --disk or --no-jail\n");
		status = 2;
		goto out;
	}
	if (a.from) {
		status = create_from(name, a.from, s, policy, policy_len, a.checkpoint);
		goto out;
	}
	/* --on-exit stop: a main process that ends would end the template's build. */
	if (!a.cold && !warm_ineligible(s) && !(a.on_exit && !strcmp(a.on_exit, "stop"))) {
		status = create_warm(name, s, policy, policy_len, a.image_meta, a.checkpoint);
		goto out;
	}
	status = 1;
	s->created_ms = realtime_ms();
	if (sbx_spec_new_machine_id(s)) {
		fprintf(stderr, "cove create: no randomness for a machine id\n");
		goto out;
	}
	if (sbx_root_open(&r, true, err, sizeof(err)) ||
	    (dfd = sbx_dir_open(&r, name, true, err, sizeof(err))) < 0) {
		fprintf(stderr, "cove create: %s\n", err);
		goto out;
	}
	sbx_tombstone_clear(&r, name);
	if (a.image_meta) {
		char dir[PATH_MAX + 64];
		snprintf(dir, sizeof(dir), "%s/%s", r.state, name);
		if (create_image_keep(dfd, s, dir, a.image_meta, err, sizeof(err))) {
			fprintf(stderr, "cove create: %s: %s\n", name, err);
			close(dfd);
			dfd = -1;
			sbx_tree_remove(r.dfd, name);
			goto out;
		}
	}
	if (policy && policy_keep(&r, name, dfd, s, policy, policy_len, err, sizeof(err))) {
		fprintf(stderr, "cove create: %s: %s\n", name, err);
		close(dfd);
		dfd = -1;
		sbx_tree_remove(r.dfd, name); /* nothing of it was started: leave nothing */
		goto out;
	}
	ret = sbx_spec_write(dfd, s);
	if (ret) {
		fprintf(stderr, "cove create: %s: cannot write its spec: %s\n", name,
			strerror(-ret));
		goto out;
	}
	ret = sbx_start(&r, name, dfd, "cove create", err, sizeof(err));
	if (ret) {
		fprintf(stderr,
			"cove create: %s: %s (its files stay in %s/%s; cove rm %s removes "
			"them)\n",
			name, err, r.state, name, name);
		goto out;
	}
	sbx_gc(&r, false, true, store_gc_hooks()); /* deadlines of other sandboxes, in passing */
	printf("%s: running (kernel %s, %s %s%s)\n", name, s->kernel,
	       s->initrd[0] ? "initramfs" : "root image",
	       s->initrd[0] ? s->initrd : s->disks[0].path,
	       policy ? ", cove-broker beside it" : "");
	status = 0;
out:
	if (dfd >= 0)
		close(dfd);
	sbx_root_close(&r);
	json_decref(a.image_meta);
	free(policy);
	free(s);
	return status;
}
