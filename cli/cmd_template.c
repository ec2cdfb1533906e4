/* `cove template create|ls|rm`: stopped, read-only sandboxes that `cove create --from` clones. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/json_mode.h"
#include "cli/commands.h"
#include "cli/create_image.h"
#include "cli/policy_opt.h"
#include "cli/template_build.h"
#include "cli/sandbox_stop.h"
#include "cli/sandbox_up.h"
#include "cli/store_reconnect.h"
#include "common/clock.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "lifecycle/launch.h"
#include "lifecycle/lock.h"
#include "lifecycle/root.h"
#include "lifecycle/spec.h"
#include "lifecycle/state.h"
#include "lifecycle/template.h"
#include "lifecycle/tree.h"
#include "lifecycle/warm.h"
#include "sandbox/agent_client.h"
#include "sandbox/options.h"

static const char template_usage[] =
    "usage: cove template create T [--rootfs FILE.ext4 | --initrd FILE] [--kernel FILE]\n"
    "                              [--mem SIZE] [--vcpus N] [--cpu-template NAME] [--run CMD]\n"
    "                              [--policy FILE] [--image IMAGE [--on-exit restart|stop]]\n"
    "                              [--json]\n"
    "       cove template ls [--json]\n"
    "       cove template rm T [--json]\n"
    "\n"
    "A template is a stopped, read-only sandbox that new ones are made from:\n"
    "`cove create NAME --from T` clones its newest snapshot (files shared by hard link) and\n"
    "restores it as a new machine (new RNG seed, clock, hostname NAME, /etc/machine-id,\n"
    "boot_id, broker token; docs/LIFECYCLE.md, \"Templates\"). Templates live in\n"
    "${COVE_STATE_DIR:-/var/lib/cove}/.templates/T, out of reach of every sandbox command.\n"
    "\n"
    "create  boots T once (the guest this project builds, or --kernel/--rootfs/--initrd),\n"
    "        runs CMD with `sh -c` as root in it when --run is given (its output is shown;\n"
    "        a status other than 0 fails the create and leaves nothing), syncs the guest's\n"
    "        disks, waits until the guest is quiet (its VMM under 10% of a CPU, at most\n"
    "        30 s), takes the final snapshot and stops it. Nothing may read\n"
    "        /proc/sys/kernel/random/boot_id in CMD: the kernel makes it on the first read,\n"
    "        and every sandbox made from T would then share it.\n"
    "  --mem SIZE     guest RAM (default 256M)     --vcpus N  (default 1)\n"
    "  --kernel FILE  --rootfs FILE.ext4  --initrd FILE  --cpu-template NAME  (as cove create;\n"
    "                 every sandbox made from T keeps T's CPU template)\n"
    "  --run CMD      the setup command, e.g. 'pip install ...'\n"
    "  --image IMAGE  the root is an imported OCI image (cove image ls), as cove create\n"
    "                 --image: its Entrypoint + Cmd, if any, is started before CMD and is\n"
    "                 saved running; the image's ext4 is linked into T, so cove image rm\n"
    "                 never breaks T or a sandbox made from it\n"
    "  --on-exit restart|stop  with --image: what the main process's exit does\n"
    "  --policy FILE  a cove-broker policy (as cove create): T boots with a broker and its\n"
    "                 guest trusts T's own egress CA; every sandbox made from T keeps the\n"
    "                 policy, gets a broker and a CA of its own, and its guest's trust store\n"
    "                 has the sandbox's CA in place of T's\n"
    "ls      the saved templates (--json: shape \"template ls\" of docs/CLI.md), and builds under "
    "way or failed;\n"
    "        warm-* are the implicit templates plain `cove create` builds (cove create --help)\n"
    "rm      removes T; sandboxes made from it keep working (their layers are their own\n"
    "        links to files that are never changed in place)\n"
    "T: [a-z0-9][a-z0-9-]*, at most 32 characters; warm- and 16 hex digits are reserved. Exit "
    "status: 64 a bad name, 65 no such\n"
    "template, 68 it exists already, 2 bad usage, 1 anything else.\n";

enum {
	O_MEM = 256,
	O_VCPUS,
	O_KERNEL,
	O_ROOTFS,
	O_INITRD,
	O_RUN,
	O_CPU_TEMPLATE,
	O_POLICY,
	O_IMAGE,
	O_ON_EXIT
};

struct tpl_args {
	const char *name;
	const char *run;
	const char *policy;
	const char *image;   /* --image REF */
	const char *on_exit; /* --on-exit, with --image */
	json_t *image_meta;  /* the image's record, for T's image.json */
	char rootfs[PATH_MAX], initrd[PATH_MAX];
};

static int abs_path(const char *in, char *out, size_t cap, char *err, size_t errlen)
{
	char *r = realpath(in, NULL);
	int ret = 0;

	if (!r)
		return errmsg(err, errlen, -errno, "%s: %s", in, strerror(errno));
	if ((size_t)snprintf(out, cap, "%s", r) >= cap)
		ret = errmsg(err, errlen, -ENAMETOOLONG, "%s: path too long", in);
	free(r);
	return ret;
}

/* 1 for --help; 0; -errno with one line in err. */
static int parse_create(int argc, char **argv, struct sbx_spec *s, struct tpl_args *a, char *err,
			size_t errlen)
{
	static const struct option opts[] = {
	    {"mem", required_argument, NULL, O_MEM},
	    {"vcpus", required_argument, NULL, O_VCPUS},
	    {"cpu-template", required_argument, NULL, O_CPU_TEMPLATE},
	    {"kernel", required_argument, NULL, O_KERNEL},
	    {"rootfs", required_argument, NULL, O_ROOTFS},
	    {"initrd", required_argument, NULL, O_INITRD},
	    {"run", required_argument, NULL, O_RUN},
	    {"policy", required_argument, NULL, O_POLICY},
	    {"image", required_argument, NULL, O_IMAGE},
	    {"on-exit", required_argument, NULL, O_ON_EXIT},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	int c;

	s->mem_bytes = 256ULL << 20;
	s->vcpus = 1;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'h':
			return 1;
		case O_MEM:
			if (parse_mem_size(optarg, &s->mem_bytes) || s->mem_bytes < (16ULL << 20))
				return errmsg(err, errlen, -EINVAL, "--mem: bad size '%s'", optarg);
			break;
		case O_VCPUS:
			s->vcpus = atoi(optarg);
			if (s->vcpus < 1 || s->vcpus > 64)
				return errmsg(err, errlen, -EINVAL, "--vcpus: 1 to 64");
			break;
		case O_CPU_TEMPLATE:
			if (opt_cpu_template(optarg, err, errlen))
				return -EINVAL;
			snprintf(s->cpu_template, sizeof(s->cpu_template), "%s", optarg);
			break;
		case O_KERNEL:
			if (abs_path(optarg, s->kernel, sizeof(s->kernel), err, errlen))
				return -EINVAL;
			break;
		case O_ROOTFS:
			if (abs_path(optarg, a->rootfs, sizeof(a->rootfs), err, errlen))
				return -EINVAL;
			break;
		case O_INITRD:
			if (abs_path(optarg, a->initrd, sizeof(a->initrd), err, errlen))
				return -EINVAL;
			break;
		case O_POLICY:
			a->policy = optarg;
			break;
		case O_IMAGE:
			a->image = optarg;
			break;
		case O_ON_EXIT:
			if (strcmp(optarg, "restart") && strcmp(optarg, "stop"))
				return errmsg(err, errlen, -EINVAL,
					      "--on-exit: restart or stop, not '%s'", optarg);
			a->on_exit = optarg;
			break;
		case O_RUN:
			if (!optarg[0] || strlen(optarg) >= TPL_RUN_MAX)
				return errmsg(err, errlen, -EINVAL, "--run: 1 to %d bytes",
					      TPL_RUN_MAX - 1);
			a->run = optarg;
			break;
		default:
			return errmsg(err, errlen, -EINVAL, "unknown option '%s'",
				      argv[optind - 1]);
		}
	}
	if (optind != argc - 1)
		return errmsg(err, errlen, -EINVAL, "want exactly one template name");
	a->name = argv[optind];
	if (warm_name_is(a->name))
		return errmsg(err, errlen, -EINVAL,
			      "'%s': names warm- and 16 hex digits are cove create's implicit "
			      "templates",
			      a->name);
	if (a->on_exit && !a->image)
		return errmsg(err, errlen, -EINVAL, "--on-exit goes with --image");
	if (a->image && (a->rootfs[0] || a->initrd[0]))
		return errmsg(err, errlen, -EINVAL, "--image and --%s: one root, not both",
			      a->rootfs[0] ? "rootfs" : "initrd");
	if (tpl_name_check(a->name, err, errlen))
		return -EINVAL;
	if (a->image)
		return create_image_spec(s, a->name, a->image, a->on_exit ? a->on_exit : "restart",
					 &a->image_meta, err, errlen);
	return sbx_spec_guest(s, a->name, a->rootfs, a->initrd, err, errlen);
}

static int template_create(int argc, char **argv)
{
	struct sbx_spec *s = calloc(1, sizeof(*s));
	struct tpl_args *a = calloc(1, sizeof(*a));
	struct sbx_root r = {.dfd = -1}, t = {.dfd = -1};
	struct tpl_meta m = {0};
	char err[600], *policy = NULL;
	size_t policy_len = 0;
	int ret, status = 1;

	if (!s || !a)
		goto out;
	ret = parse_create(argc, argv, s, a, err, sizeof(err));
	if (ret) {
		if (ret == 1)
			fputs(template_usage, stdout);
		else
			fprintf(stderr, "cove template create: %s (try 'cove template --help')\n",
				err);
		status = ret == 1				       ? 0
			 : a->name && tpl_name_check(a->name, NULL, 0) ? SBX_EXIT_BAD_NAME
								       : 2;
		goto out;
	}
	if (a->policy &&
	    (status = policy_take("cove template create", a->policy, &policy, &policy_len)))
		goto out;
	status = 1;
	if (sbx_root_open(&r, true, err, sizeof(err)) ||
	    tpl_root_open(&r, &t, true, err, sizeof(err))) {
		fprintf(stderr, "cove template create: %s\n", err);
		goto out;
	}
	status = tpl_build(&r, &t, a->name, s, a->run, policy, policy_len, a->image_meta,
			   "cove template create", &m);
	if (status)
		goto out;
	printf("%s: template saved in %.2f s (%.1f MiB)\n", a->name, m.build_ms / 1000.0,
	       (double)sbx_tree_bytes(t.dfd, a->name) / (1 << 20));
	/* With a store, every host can create from it: its blobs go up once. Not fatal. */
	ret = store_try_template("push", a->name);
	if (ret > 0)
		fprintf(stderr,
			"cove template create: %s: warning: not pushed to the store (above); it "
			"stays on this host\n",
			a->name);
	else if (ret == 0)
		printf("%s: template pushed to the store\n", a->name);
out:
	sbx_root_close(&t);
	sbx_root_close(&r);
	free(policy);
	free(s);
	if (a)
		json_decref(a->image_meta);
	free(a);
	return status;
}

/* One template as JSON: its record, spec and size; a directory without a record is a build
 * under way (its VMM or start lock held) or one that failed. NULL when it is no template. */
static json_t *describe(const struct sbx_root *t, const char *name)
{
	struct tpl_meta m;
	struct sbx_spec *s = calloc(1, sizeof(*s));
	int dfd = sbx_dir_open(t, name, false, NULL, 0);
	const char *state = "ready";
	json_t *j = NULL;

	if (!s || dfd < 0)
		goto out;
	if (tpl_meta_read(dfd, &m, NULL, 0)) {
		memset(&m, 0, sizeof(m));
		state =
		    sbx_lock_held(dfd, SBX_LOCK_VMM) == 1 || sbx_lock_held(dfd, SBX_LOCK_START) == 1
			? "building"
			: "incomplete";
	}
	if (sbx_spec_read(dfd, s, NULL, 0))
		memset(s, 0, sizeof(*s));
	j = json_pack("{s:s,s:s,s:b,s:I,s:I,s:s,s:I,s:i,s:s,s:s,s:I}", "name", name, "state", state,
		      "implicit", warm_name_is(name), "created_ms", (json_int_t)m.created_ms,
		      "build_ms", (json_int_t)m.build_ms, "run", m.run, "mem_bytes",
		      (json_int_t)s->mem_bytes, "vcpus", s->vcpus, "kernel", s->kernel, "root",
		      s->initrd[0] ? s->initrd : s->disks[0].path, "bytes",
		      (json_int_t)sbx_tree_bytes(t->dfd, name));
out:
	if (dfd >= 0)
		close(dfd);
	free(s);
	return j;
}

static int template_ls(int argc, char **argv)
{
	bool as_json = argc == 2 && !strcmp(argv[1], "--json");
	struct sbx_root r = {.dfd = -1}, t = {.dfd = -1};
	json_t *all = json_array(), *j;
	struct dirent *e;
	DIR *d = NULL;
	size_t i;
	int fd;

	if (argc > 2 || (argc == 2 && !as_json)) {
		fprintf(stderr, "usage: cove template ls [--json]\n");
		json_decref(all);
		return argc == 2 && !strcmp(argv[1], "--help") ? 0 : 2;
	}
	if (sbx_root_open(&r, false, NULL, 0) == 0 && tpl_root_open(&r, &t, false, NULL, 0) == 0 &&
	    (fd = dup(t.dfd)) >= 0 && !(d = fdopendir(fd)))
		close(fd);
	while (d && (e = readdir(d)))
		if (!tpl_name_check(e->d_name, NULL, 0) && (j = describe(&t, e->d_name)))
			json_array_append_new(all, j);
	if (d)
		closedir(d);
	if (as_json) {
		json_mode_print("template ls", json_pack("{s:O}", "templates", all));
	} else {
		printf("%-20s %-10s %-16s %7s %5s %8s  %s\n", "NAME", "STATE", "CREATED (UTC)",
		       "MEM", "VCPUS", "SIZE", "RUN");
		json_array_foreach(all, i, j)
		{
			time_t c =
			    (time_t)(json_integer_value(json_object_get(j, "created_ms")) / 1000);
			char when[32] = "-";
			struct tm tm;

			if (c > 0 && gmtime_r(&c, &tm))
				strftime(when, sizeof(when), "%Y-%m-%d %H:%M", &tm);
			printf(
			    "%-20s %-10s %-16s %6lldM %5lld %7.1fM  %s\n",
			    json_string_value(json_object_get(j, "name")),
			    json_string_value(json_object_get(j, "state")), when,
			    (long long)(json_integer_value(json_object_get(j, "mem_bytes")) >> 20),
			    (long long)json_integer_value(json_object_get(j, "vcpus")),
			    (double)json_integer_value(json_object_get(j, "bytes")) / (1 << 20),
			    json_string_value(json_object_get(j, "run")));
		}
	}
	json_decref(all);
	sbx_root_close(&t);
	sbx_root_close(&r);
	return 0;
}

static int template_rm(int argc, char **argv)
{
	struct sbx_root r = {.dfd = -1}, t = {.dfd = -1};
	char err[512];
	int dfd = -1, lk = -1, ret, status = 1;

	if (argc != 2 || argv[1][0] == '-') {
		fprintf(stderr, "usage: cove template rm T [--json]\n");
		return argc == 2 && !strcmp(argv[1], "--help") ? 0 : 2;
	}
	if (tpl_name_check(argv[1], err, sizeof(err))) {
		fprintf(stderr, "cove template rm: %s\n", err);
		return SBX_EXIT_BAD_NAME;
	}
	if (sbx_root_open(&r, false, NULL, 0) || tpl_root_open(&r, &t, false, NULL, 0) ||
	    (dfd = sbx_dir_open(&t, argv[1], false, NULL, 0)) < 0) {
		fprintf(stderr, "cove template rm: no template named %s\n", argv[1]);
		status = SBX_EXIT_UNKNOWN;
		goto out;
	}
	/* Not while a create --from links its files: those hold its start lock. */
	lk = sbx_lock_take(dfd, SBX_LOCK_START, true, false);
	/* A build under way ends here (its create fails). */
	sbx_vmm_end(dfd, SIGKILL);
	ret = sbx_tree_remove(t.dfd, argv[1]);
	if (ret) {
		fprintf(stderr, "cove template rm: %s: %s\n", argv[1], strerror(-ret));
		goto out;
	}
	tpl_run_dir_remove(&t, argv[1]);
	printf("%s: template removed\n", argv[1]);
	status = 0;
out:
	if (lk >= 0)
		close(lk);
	if (dfd >= 0)
		close(dfd);
	sbx_root_close(&t);
	sbx_root_close(&r);
	return status;
}

int cmd_template(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
	    !strcmp(argv[1], "help")) {
		fputs(template_usage, argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (!strcmp(argv[1], "create"))
		return template_create(argc - 1, argv + 1);
	if (!strcmp(argv[1], "ls"))
		return template_ls(argc - 1, argv + 1);
	if (!strcmp(argv[1], "rm"))
		return template_rm(argc - 1, argv + 1);
	fprintf(stderr, "cove template: unknown subcommand '%s' (try 'cove template --help')\n",
		argv[1]);
	return 2;
}
