/* cove-broker: holds credentials for one sandbox and makes policy-checked requests for it.
 *   cove-broker --policy FILE --listen PATH --ctl PATH --audit FILE [--initial-epoch N]
 *               [--initial-token HEX] [--helper-timeout-ms N] [--timeout-s N]
 *               [--audit-key FILE] [--user NAME --client NAME] [--egress-listen PATH]
 *               [--mitm-ca-dir DIR] [-v]
 *   cove-broker verify-audit [--key KEYFILE] FILE
 *   cove-broker check-policy FILE */
#include "audit.h"
#include "confine.h"
#include "egress.h"
#include "broker.h"
#include "loop.h"
#include "mitm_ca.h"
#include "policy.h"
#include "request.h"
#include "helper.h"
#include "fetch.h"
#include "user.h"
#include "wipe_alloc.h"
#include "common/dirfd_io.h"
#include "common/hex.h"

#include <curl/curl.h>
#include <openssl/crypto.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static void usage(FILE *f)
{
	fprintf(f,
		"usage: cove-broker --policy FILE --listen PATH --ctl PATH --audit FILE\n"
		"                   [--initial-epoch N] [--initial-token HEX32]\n"
		"                   [--helper-timeout-ms N] [--timeout-s N]\n"
		"                   [--audit-key FILE] [--user NAME --client NAME]\n"
		"                   [--confine DIR]... [--egress-listen PATH]\n"
		"                   [--mitm-ca-dir DIR] [-v]\n"
		"  --egress-listen PATH: the guest's HTTP proxy (CONNECT and http://) under the\n"
		"  policy's \"egress\" rules; give it <vsock uds>_1026\n"
		"  --mitm-ca-dir DIR: the sandbox's CA (mitm-ca.key, mitm-ca.crt; made when absent):\n"
		"  with it, a CONNECT to a host a credential names is intercepted and injected\n"
		"  --confine DIR: once its files and sockets are open, the broker sees DIR as an\n"
		"  empty directory (its own mount namespace) and drops every capability\n"
		"       cove-broker verify-audit [--key KEYFILE] FILE\n"
		"       cove-broker check-policy FILE\n");
}

static int cmd_verify(const char *path, const char *key_path)
{
	uint8_t key[AUDIT_KEY_LEN];
	char why[512] = "";
	size_t nrec = 0;
	long bad;

	if (key_path && audit_key_load(key_path, false, key, why, sizeof(why))) {
		fprintf(stderr, "cove-broker: verify-audit: %s\n", why);
		return 2;
	}
	bad = audit_verify_file(path, key_path ? key : NULL, &nrec, why, sizeof(why));
	OPENSSL_cleanse(key, sizeof(key));

	if (bad < 0) {
		fprintf(stderr, "cove-broker: verify-audit: %s\n", why);
		return 2;
	}
	if (bad > 0) {
		fprintf(stderr, "cove-broker: verify-audit: %s: line %ld: %s\n", path, bad, why);
		return 1;
	}
	printf("%s: OK, %zu records%s\n", path, nrec,
	       key_path ? ", MAC verified"
			: " (hash chain only: without --key a rewritten log is not detected)");
	return 0;
}

static int cmd_check_policy(const char *path)
{
	struct policy p;
	char err[512];

	if (policy_load(path, &p, err, sizeof(err))) {
		fprintf(stderr, "cove-broker: %s\n", err);
		return 1;
	}
	printf("%s: OK, %zu credentials, %zu egress rules\n", path, p.ncreds, p.egress.nrules);
	policy_free(&p);
	return 0;
}

/* The per-sandbox CA in dir (created 0700 when missing), named after the sandbox: dir's parent
 * directory's name when dir is ".../NAME/mitm-ca", else dir's own name. 0 or -errno. */
static int open_mitm_ca(const char *dir, struct mitm_ca *ca, char *err, size_t errlen)
{
	char name[65] = "sandbox", path[4096];
	const char *base, *slash;
	size_t len;
	int dfd, r;

	if (snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	len = strlen(path);
	while (len > 1 && path[len - 1] == '/')
		path[--len] = '\0';
	slash = strrchr(path, '/');
	base = slash ? slash + 1 : path;
	if (!strcmp(base, "mitm-ca") && slash && slash > path) {
		const char *end = slash, *p = slash;

		while (p > path && p[-1] != '/')
			p--;
		snprintf(name, sizeof(name), "%.*s", (int)(end - p > 64 ? 64 : end - p), p);
	} else if (*base) {
		snprintf(name, sizeof(name), "%.64s", base);
	}
	for (char *p = name; *p; p++)
		if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
			*p = '_';
	if (!name[0])
		snprintf(name, sizeof(name), "sandbox");
	dfd = dirfd_open_dir(dir, true, err, errlen);
	if (dfd < 0)
		return dfd;
	r = mitm_ca_open(ca, dfd, name, err, errlen);
	close(dfd);
	return r;
}

/* Options that take a string (a path, a user name, the token): each sets one. */
enum {
	S_POLICY,
	S_LISTEN,
	S_CTL,
	S_AUDIT,
	S_TOKEN,
	S_KEY,
	S_USER,
	S_CLIENT,
	S_EGRESS,
	S_MITM_CA,
	S_COUNT
};
static const char *const str_opt_names[S_COUNT] = {
    "policy", "listen", "ctl", "audit", "initial-token", "audit-key", "user", "client",
    "egress-listen", "mitm-ca-dir"};
/* Options that take a number. */
enum { N_EPOCH, N_HELPER_MS, N_TIMEOUT_S, N_COUNT };
static const char *const num_opt_names[N_COUNT] = {"initial-epoch", "helper-timeout-ms",
						   "timeout-s"};
enum { OPT_STR = 256, OPT_NUM = OPT_STR + S_COUNT };

struct broker_args {
	const char *str[S_COUNT];
	const char *confine[BROKER_CONFINE_MAX]; /* --confine DIR */
	int nr_confine;
	bool verbose;
	struct broker_user user, client; /* with --user/--client */
};

/* One numeric option into b: 0 or -EINVAL. Timeouts are 1..3600000. */
static int set_number(struct broker *b, int which, const char *s)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' ||
	    (which != N_EPOCH && (v == 0 || v > 3600000)))
		return -EINVAL;
	if (which == N_EPOCH)
		b->epoch = v;
	else if (which == N_HELPER_MS)
		b->helper_timeout_ms = (int)v;
	else
		b->fetch_timeout_s = (long)v;
	return 0;
}

/* --user and --client: both or neither, as root, two different users, neither of them root. */
static int check_users(struct broker_args *a)
{
	char err[512];

	if (!a->str[S_USER] && !a->str[S_CLIENT])
		return 0;
	if (geteuid() != 0) {
		fprintf(stderr, "cove-broker: --user and --client need root (the broker opens "
				"its files as root, then drops to --user)\n");
		return -EPERM;
	}
	if (!a->str[S_USER] || !a->str[S_CLIENT]) {
		fprintf(stderr, "cove-broker: --user and --client go together: the broker's "
				"own user and the user whose cove connects to its sockets\n");
		return -EINVAL;
	}
	if (broker_user_lookup(a->str[S_USER], &a->user, err, sizeof(err)) ||
	    broker_user_lookup(a->str[S_CLIENT], &a->client, err, sizeof(err))) {
		fprintf(stderr, "cove-broker: %s\n", err);
		return -EINVAL;
	}
	if (a->user.uid == 0 || a->user.uid == a->client.uid) {
		fprintf(stderr, "cove-broker: --user must be neither root nor the --client user\n");
		return -EINVAL;
	}
	return 0;
}

/* The options into b and a: -1 to go on, else the exit status (0 after --help). */
static int parse_args(int argc, char **argv, struct broker *b, struct broker_args *a)
{
	struct option opts[S_COUNT + N_COUNT + 4];
	size_t n = 0;
	int opt;

	for (int i = 0; i < S_COUNT; i++)
		opts[n++] = (struct option){str_opt_names[i], required_argument, NULL, OPT_STR + i};
	for (int i = 0; i < N_COUNT; i++)
		opts[n++] = (struct option){num_opt_names[i], required_argument, NULL, OPT_NUM + i};
	opts[n++] = (struct option){"confine", required_argument, NULL, 'C'};
	opts[n++] = (struct option){"verbose", no_argument, NULL, 'v'};
	opts[n++] = (struct option){"help", no_argument, NULL, 'h'};
	opts[n] = (struct option){NULL, 0, NULL, 0};
	while ((opt = getopt_long(argc, argv, "vh", opts, NULL)) != -1) {
		if (opt >= OPT_STR && opt < OPT_NUM) {
			a->str[opt - OPT_STR] = optarg;
		} else if (opt >= OPT_NUM && opt < OPT_NUM + N_COUNT) {
			if (set_number(b, opt - OPT_NUM, optarg)) {
				fprintf(stderr, "cove-broker: bad number for --%s: %s\n",
					num_opt_names[opt - OPT_NUM], optarg);
				return 2;
			}
		} else if (opt == 'C') {
			if (optarg[0] != '/' || a->nr_confine == BROKER_CONFINE_MAX) {
				fprintf(stderr,
					"cove-broker: --confine takes an absolute directory, "
					"at most %d times\n",
					BROKER_CONFINE_MAX);
				return 2;
			}
			a->confine[a->nr_confine++] = optarg;
		} else if (opt == 'v') {
			a->verbose = true;
		} else {
			usage(opt == 'h' ? stdout : stderr);
			return opt == 'h' ? 0 : 2;
		}
	}
	if (optind != argc || !a->str[S_POLICY] || !a->str[S_LISTEN] || !a->str[S_CTL] ||
	    !a->str[S_AUDIT]) {
		usage(stderr);
		return 2;
	}
	if (check_users(a))
		return 2;
	if (a->str[S_TOKEN]) {
		if (hex_decode(a->str[S_TOKEN], b->token, REQ_TOKEN_BYTES)) {
			fprintf(stderr, "cove-broker: --initial-token must be %d hex digits\n",
				2 * REQ_TOKEN_BYTES);
			return 2;
		}
		b->have_token = true;
	}
	return -1;
}

int main(int argc, char **argv)
{
	struct broker_args a = {0};
	struct broker b = {.helper_timeout_ms = HELPER_TIMEOUT_MS,
			   .fetch_timeout_s = FETCH_TIMEOUT_S,
			   .epoch = 1,
			   .audit = {.fd = -1}};
	struct logger log = {.level = LOG_INFO, .out = stderr, .name = "cove-broker"};
	const char *policy, *listen_path, *ctl_path, *key_path, *egress_path;
	struct egress_server *egress = NULL;
	struct mitm_ca ca = {0};
	bool have_ca = false;
	char key_default[4096], err[512];
	uint8_t key[AUDIT_KEY_LEN];
	int gfd = -1, cfd = -1, efd = -1, r, rc = 1;

	/* First of all: no core dump and no ptrace or /proc/PID/mem by other processes of the same
	 * uid (the VMM, which parses guest input), while this process holds secrets. */
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) {
		fprintf(stderr, "cove-broker: PR_SET_DUMPABLE: %s\n", strerror(errno));
		return 1;
	}
	if (argc == 3 && !strcmp(argv[1], "verify-audit"))
		return cmd_verify(argv[2], NULL);
	if (argc == 5 && !strcmp(argv[1], "verify-audit") && !strcmp(argv[2], "--key"))
		return cmd_verify(argv[4], argv[3]);
	if (argc == 3 && !strcmp(argv[1], "check-policy"))
		return cmd_check_policy(argv[2]);
	r = parse_args(argc, argv, &b, &a);
	if (r >= 0)
		return r;
	policy = a.str[S_POLICY];
	listen_path = a.str[S_LISTEN];
	ctl_path = a.str[S_CTL];
	key_path = a.str[S_KEY];
	egress_path = a.str[S_EGRESS];
	if (a.verbose)
		log.level = LOG_DEBUG;
	b.log = &log;
	signal(SIGPIPE, SIG_IGN);
	pthread_mutex_init(&b.lock, NULL);
	if (wipe_alloc_install()) {
		broker_log(&b, LOG_ERROR, "cannot install wiping allocators in OpenSSL/libcurl");
		return 1;
	}
	if (policy_load(policy, &b.pol, err, sizeof(err))) {
		broker_log(&b, LOG_ERROR, "%s", err);
		goto out;
	}
	/* The MAC key lives beside the policy by default: outside the log and the sandbox. */
	if (!key_path) {
		if (snprintf(key_default, sizeof(key_default), "%s.audit-key", policy) >=
		    (int)sizeof(key_default)) {
			broker_log(&b, LOG_ERROR, "policy path too long");
			goto out;
		}
		key_path = key_default;
	}
	if (audit_key_load(key_path, true, key, err, sizeof(err))) {
		broker_log(&b, LOG_ERROR, "%s", err);
		goto out;
	}
	r = audit_open(&b.audit, a.str[S_AUDIT], key, err, sizeof(err));
	OPENSSL_cleanse(key, sizeof(key));
	if (r) {
		broker_log(&b, LOG_ERROR, "%s", err);
		goto out;
	}
	/* The CA key is read here, before --confine hides the sandbox's directory. */
	if (a.str[S_MITM_CA]) {
		if (open_mitm_ca(a.str[S_MITM_CA], &ca, err, sizeof(err))) {
			broker_log(&b, LOG_ERROR, "--mitm-ca-dir %s: %s", a.str[S_MITM_CA], err);
			goto out;
		}
		have_ca = true;
		b.mitm_ca = &ca;
	}
	gfd = loop_listen_unix(listen_path);
	if (gfd < 0) {
		broker_log(&b, LOG_ERROR, "listen %s: %s", listen_path, strerror(-gfd));
		goto out;
	}
	cfd = loop_listen_unix(ctl_path);
	if (cfd < 0) {
		broker_log(&b, LOG_ERROR, "ctl %s: %s", ctl_path, strerror(-cfd));
		goto out;
	}
	if (egress_path) {
		efd = loop_listen_unix(egress_path);
		if (efd < 0) {
			broker_log(&b, LOG_ERROR, "egress %s: %s", egress_path, strerror(-efd));
			goto out;
		}
	}
	/* Everything is open: the sandbox's directories go out of sight (--confine). */
	r = broker_confine(a.confine, a.nr_confine, err, sizeof(err));
	if (r) {
		broker_log(&b, r < 0 ? LOG_ERROR : LOG_WARN, "%s", err);
		if (r < 0)
			goto out;
	}
	if (a.str[S_USER]) {
		/* The sockets belong to the client (mode 0600); everything is open: drop root. */
		if (chown(listen_path, a.client.uid, a.client.gid) ||
		    chown(ctl_path, a.client.uid, a.client.gid) ||
		    (egress_path && chown(egress_path, a.client.uid, a.client.gid))) {
			broker_log(&b, LOG_ERROR, "chown sockets to --client: %s", strerror(errno));
			goto out;
		}
		if (broker_user_drop(&a.user, err, sizeof(err))) {
			broker_log(&b, LOG_ERROR, "--user %s: %s", a.str[S_USER], err);
			goto out;
		}
	}
	if (a.nr_confine && broker_drop_caps(err, sizeof(err))) {
		broker_log(&b, LOG_ERROR, "--confine: %s", err);
		goto out;
	}
	b.start_ns = broker_now_ns();
	broker_log(&b, LOG_INFO, "%zu credentials, epoch %llu, listening on %s", b.pol.ncreds,
		   (unsigned long long)b.epoch, listen_path);
	if (efd >= 0) {
		r = egress_start(&b, efd, &egress);
		if (r) {
			broker_log(&b, LOG_ERROR, "egress: %s", strerror(-r));
			goto out;
		}
		broker_log(&b, LOG_INFO, "egress: %zu rules, listening on %s%s", b.pol.egress.nrules,
			   egress_path,
			   b.mitm_ca ? "; CONNECTs to credential hosts are intercepted" : "");
	}
	r = loop_run(&b, gfd, cfd);
	/* Before the policy and the audit log go: the egress threads use them. */
	egress_stop(egress);
	egress = NULL;
	if (r) {
		broker_log(&b, LOG_ERROR, "event loop: %s", strerror(-r));
		goto out;
	}
	rc = 0;
out:
	if (gfd >= 0) {
		close(gfd);
		unlink(listen_path);
	}
	if (cfd >= 0) {
		close(cfd);
		unlink(ctl_path);
	}
	if (efd >= 0) {
		close(efd);
		unlink(egress_path);
	}
	audit_close(&b.audit);
	if (have_ca)
		mitm_ca_free(&ca);
	policy_free(&b.pol);
	curl_global_cleanup();
	return rc;
}
