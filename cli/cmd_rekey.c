/* `cove rekey`: rewrap a snapshot chain's data key under a new KEK without touching its data. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "snapshot/keyfile.h"
#include "snapshot/keyprov.h"

static void usage(FILE *out)
{
	fprintf(
	    out,
	    "usage: cove rekey DIR (--from-key-cmd CMD | --from-pkcs11 CONFIG)\n"
	    "                      (--to-key-cmd CMD | --to-pkcs11 CONFIG)\n"
	    "Unwrap the data key in DIR/keys with the old key provider (it must be the one the "
	    "file\n"
	    "records; the file never chooses it) and wrap it with the new one. Layer and state\n"
	    "files are not rewritten.\n"
	    "CONFIG: pkcs11:token=LABEL;object=LABEL[;module=PATH][;pin-file=PATH]\n"
	    "        (PIN from $COVE_PKCS11_PIN or pin-file; see snapshot/CRYPTO.md)\n");
}

/* One provider option: its type and config, or an error when given twice. */
static int set_prov(enum keyprov_type *type, const char **config, enum keyprov_type t,
		    const char *arg, const char *what)
{
	if (*config) {
		fprintf(stderr, "cove rekey: more than one %s key provider\n", what);
		return -1;
	}
	*type = t;
	*config = arg;
	return 0;
}

int cmd_rekey(int argc, char **argv)
{
	enum { FROM_CMD = 1, FROM_P11, TO_CMD, TO_P11 };
	static const struct option opts[] = {
	    {"from-key-cmd", required_argument, NULL, FROM_CMD},
	    {"from-pkcs11", required_argument, NULL, FROM_P11},
	    {"to-key-cmd", required_argument, NULL, TO_CMD},
	    {"to-pkcs11", required_argument, NULL, TO_P11},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	enum keyprov_type from_t = KEYPROV_CMD, to_t = KEYPROV_CMD;
	const char *from = NULL, *to = NULL;
	int c, bad = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case FROM_CMD:
			bad |= set_prov(&from_t, &from, KEYPROV_CMD, optarg, "--from");
			break;
		case FROM_P11:
			bad |= set_prov(&from_t, &from, KEYPROV_PKCS11, optarg, "--from");
			break;
		case TO_CMD:
			bad |= set_prov(&to_t, &to, KEYPROV_CMD, optarg, "--to");
			break;
		case TO_P11:
			bad |= set_prov(&to_t, &to, KEYPROV_PKCS11, optarg, "--to");
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (bad)
		return 2;
	if (optind != argc - 1 || !to) {
		usage(stderr);
		return 2;
	}
	/* The old provider comes from the host too: DIR/keys must never name what runs. */
	if (!from) {
		fprintf(stderr, "cove rekey: the old key provider is required (--from-key-cmd or "
				"--from-pkcs11); the chain's keys file never chooses it\n");
		return 2;
	}
	const char *dir = argv[optind];
	char err[512];
	struct keyprov *old = NULL, *new = NULL;
	int status = 1;
	if (keyprov_new(from_t, from, &old, err, sizeof(err))) {
		fprintf(stderr, "cove rekey: --from: %s\n", err);
		return 2;
	}
	if (keyprov_new(to_t, to, &new, err, sizeof(err))) {
		fprintf(stderr, "cove rekey: --to: %s\n", err);
		status = 2;
		goto out;
	}
	if (keyfile_rekey(dir, old, new, err, sizeof(err))) {
		fprintf(stderr, "cove rekey: %s\n", err);
		goto out;
	}
	printf("rewrapped %s/%s under %s; no data file was rewritten\n", dir, KEYFILE_NAME,
	       keyprov_type_name(to_t));
	status = 0;
out:
	keyprov_free(old);
	keyprov_free(new);
	return status;
}
