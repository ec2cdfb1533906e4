/* cove-broker: holds credentials for one sandbox and makes policy-checked requests for it.
 *   cove-broker --policy FILE --listen PATH --ctl PATH --audit FILE [--initial-epoch N]
 *               [--initial-token HEX] [--helper-timeout-ms N] [--timeout-s N]
 *               [--audit-key FILE] [--user NAME --client NAME] [-v]
 *   cove-broker verify-audit [--key KEYFILE] FILE
 *   cove-broker check-policy FILE */
#include "audit.h"
#include "broker.h"
#include "loop.h"
#include "policy.h"
#include "request.h"
#include "helper.h"
#include "fetch.h"
#include "user.h"
#include "wipe_alloc.h"

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
	fprintf(f, "usage: cove-broker --policy FILE --listen PATH --ctl PATH --audit FILE\n"
		   "                   [--initial-epoch N] [--initial-token HEX32]\n"
		   "                   [--helper-timeout-ms N] [--timeout-s N]\n"
		   "                   [--audit-key FILE] [--user NAME --client NAME] [-v]\n"
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
	printf("%s: OK, %zu credentials\n", path, p.ncreds);
	policy_free(&p);
	return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-')
		return -EINVAL;
	*out = v;
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"policy", required_argument, NULL, 'p'},
	    {"listen", required_argument, NULL, 'l'},
	    {"ctl", required_argument, NULL, 'c'},
	    {"audit", required_argument, NULL, 'a'},
	    {"initial-epoch", required_argument, NULL, 'e'},
	    {"initial-token", required_argument, NULL, 't'},
	    {"helper-timeout-ms", required_argument, NULL, 'H'},
	    {"timeout-s", required_argument, NULL, 'T'},
	    {"audit-key", required_argument, NULL, 'k'},
	    {"user", required_argument, NULL, 'u'},
	    {"client", required_argument, NULL, 'C'},
	    {"verbose", no_argument, NULL, 'v'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	const char *policy = NULL, *listen_path = NULL, *ctl_path = NULL, *audit_path = NULL;
	const char *token = NULL, *user_name = NULL, *client_name = NULL, *key_path = NULL;
	char key_default[4096];
	uint8_t key[AUDIT_KEY_LEN];
	struct broker_user user, client;
	struct broker b = {.helper_timeout_ms = HELPER_TIMEOUT_MS,
			   .fetch_timeout_s = FETCH_TIMEOUT_S,
			   .epoch = 1,
			   .audit = {.fd = -1}};
	char err[512];
	uint64_t v;
	int opt, gfd = -1, cfd = -1, r, rc = 1;

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
	while ((opt = getopt_long(argc, argv, "vh", opts, NULL)) != -1) {
		switch (opt) {
		case 'p':
			policy = optarg;
			break;
		case 'l':
			listen_path = optarg;
			break;
		case 'c':
			ctl_path = optarg;
			break;
		case 'a':
			audit_path = optarg;
			break;
		case 't':
			token = optarg;
			break;
		case 'k':
			key_path = optarg;
			break;
		case 'u':
			user_name = optarg;
			break;
		case 'C':
			client_name = optarg;
			break;
		case 'e':
		case 'H':
		case 'T':
			if (parse_u64(optarg, &v) || (opt != 'e' && (v == 0 || v > 3600000))) {
				fprintf(stderr, "cove-broker: bad number for --%s: %s\n",
					opt == 'e'   ? "initial-epoch"
					: opt == 'H' ? "helper-timeout-ms"
						     : "timeout-s",
					optarg);
				return 2;
			}
			if (opt == 'e')
				b.epoch = v;
			else if (opt == 'H')
				b.helper_timeout_ms = (int)v;
			else
				b.fetch_timeout_s = (long)v;
			break;
		case 'v':
			b.verbose = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc || !policy || !listen_path || !ctl_path || !audit_path) {
		usage(stderr);
		return 2;
	}
	if (user_name || client_name) {
		if (geteuid() != 0) {
			fprintf(stderr,
				"cove-broker: --user and --client need root (the broker opens "
				"its files as root, then drops to --user)\n");
			return 2;
		}
		if (!user_name || !client_name) {
			fprintf(stderr,
				"cove-broker: --user and --client go together: the broker's "
				"own user and the user whose cove connects to its sockets\n");
			return 2;
		}
		if (broker_user_lookup(user_name, &user, err, sizeof(err)) ||
		    broker_user_lookup(client_name, &client, err, sizeof(err))) {
			fprintf(stderr, "cove-broker: %s\n", err);
			return 2;
		}
		if (user.uid == 0 || user.uid == client.uid) {
			fprintf(stderr, "cove-broker: --user must be neither root nor the --client "
					"user\n");
			return 2;
		}
	}
	if (token) {
		if (hex_decode(token, b.token, REQ_TOKEN_BYTES)) {
			fprintf(stderr, "cove-broker: --initial-token must be %d hex digits\n",
				2 * REQ_TOKEN_BYTES);
			return 2;
		}
		b.have_token = true;
	}
	b.log = stderr;
	signal(SIGPIPE, SIG_IGN);
	if (wipe_alloc_install()) {
		fprintf(stderr,
			"cove-broker: cannot install wiping allocators in OpenSSL/libcurl\n");
		return 1;
	}
	if (policy_load(policy, &b.pol, err, sizeof(err))) {
		fprintf(stderr, "cove-broker: %s\n", err);
		goto out;
	}
	/* The MAC key lives beside the policy by default: outside the log and the sandbox. */
	if (!key_path) {
		if (snprintf(key_default, sizeof(key_default), "%s.audit-key", policy) >=
		    (int)sizeof(key_default)) {
			fprintf(stderr, "cove-broker: policy path too long\n");
			goto out;
		}
		key_path = key_default;
	}
	if (audit_key_load(key_path, true, key, err, sizeof(err))) {
		fprintf(stderr, "cove-broker: %s\n", err);
		goto out;
	}
	r = audit_open(&b.audit, audit_path, key, err, sizeof(err));
	OPENSSL_cleanse(key, sizeof(key));
	if (r) {
		fprintf(stderr, "cove-broker: %s\n", err);
		goto out;
	}
	gfd = loop_listen_unix(listen_path);
	if (gfd < 0) {
		fprintf(stderr, "cove-broker: listen %s: %s\n", listen_path, strerror(-gfd));
		goto out;
	}
	cfd = loop_listen_unix(ctl_path);
	if (cfd < 0) {
		fprintf(stderr, "cove-broker: ctl %s: %s\n", ctl_path, strerror(-cfd));
		goto out;
	}
	if (user_name) {
		/* The sockets belong to the client (mode 0600); everything is open: drop root. */
		if (chown(listen_path, client.uid, client.gid) ||
		    chown(ctl_path, client.uid, client.gid)) {
			fprintf(stderr, "cove-broker: chown sockets to --client: %s\n",
				strerror(errno));
			goto out;
		}
		if (broker_user_drop(&user, err, sizeof(err))) {
			fprintf(stderr, "cove-broker: --user %s: %s\n", user_name, err);
			goto out;
		}
	}
	b.start_ns = broker_now_ns();
	fprintf(stderr, "cove-broker: %zu credentials, epoch %llu, listening on %s\n", b.pol.ncreds,
		(unsigned long long)b.epoch, listen_path);
	r = loop_run(&b, gfd, cfd);
	if (r) {
		fprintf(stderr, "cove-broker: event loop: %s\n", strerror(-r));
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
	audit_close(&b.audit);
	policy_free(&b.pol);
	curl_global_cleanup();
	return rc;
}
