/* `cove rekey`: rewrap a snapshot chain's data key under a new KEK without touching its data. */
#include <getopt.h>
#include <stdbool.h>
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

/* The four provider options: which end (the old or the new provider) and which kind. */
static const struct prov_opt {
	const char *name;
	bool to;
	enum keyprov_type type;
} prov_opts[] = {
    {"from-key-cmd", false, KEYPROV_CMD},
    {"from-pkcs11", false, KEYPROV_PKCS11},
    {"to-key-cmd", true, KEYPROV_CMD},
    {"to-pkcs11", true, KEYPROV_PKCS11},
};
#define PROV_OPTS (sizeof(prov_opts) / sizeof(prov_opts[0]))

/* One end of the rewrap: its provider's type and config (NULL until given). */
struct prov_end {
	enum keyprov_type type;
	const char *config;
};

/* One provider option into its end: 0, or -1 when that end was given twice. */
static int set_prov(struct prov_end *end, const struct prov_opt *o, const char *arg)
{
	if (end->config) {
		fprintf(stderr, "cove rekey: more than one %s key provider\n",
			o->to ? "--to" : "--from");
		return -1;
	}
	end->type = o->type;
	end->config = arg;
	return 0;
}

int cmd_rekey(int argc, char **argv)
{
	struct option opts[PROV_OPTS + 2];
	struct prov_end ends[2] = {{KEYPROV_CMD, NULL}, {KEYPROV_CMD, NULL}}; /* from, to */
	int c, bad = 0;

	for (size_t i = 0; i < PROV_OPTS; i++)
		opts[i] = (struct option){prov_opts[i].name, required_argument, NULL, (int)i + 1};
	opts[PROV_OPTS] = (struct option){"help", no_argument, NULL, 'h'};
	opts[PROV_OPTS + 1] = (struct option){NULL, 0, NULL, 0};
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (c >= 1 && c <= (int)PROV_OPTS) {
			const struct prov_opt *o = &prov_opts[c - 1];

			bad |= set_prov(&ends[o->to], o, optarg);
			continue;
		}
		usage(c == 'h' ? stdout : stderr);
		return c == 'h' ? 0 : 2;
	}
	if (bad)
		return 2;
	if (optind != argc - 1 || !ends[1].config) {
		usage(stderr);
		return 2;
	}
	/* The old provider comes from the host too: DIR/keys must never name what runs. */
	if (!ends[0].config) {
		fprintf(stderr, "cove rekey: the old key provider is required (--from-key-cmd or "
				"--from-pkcs11); the chain's keys file never chooses it\n");
		return 2;
	}
	const char *dir = argv[optind];
	char err[512];
	struct keyprov *old = NULL, *new = NULL;
	int status = 1;
	if (keyprov_new(ends[0].type, ends[0].config, &old, err, sizeof(err))) {
		fprintf(stderr, "cove rekey: --from: %s\n", err);
		return 2;
	}
	if (keyprov_new(ends[1].type, ends[1].config, &new, err, sizeof(err))) {
		fprintf(stderr, "cove rekey: --to: %s\n", err);
		status = 2;
		goto out;
	}
	if (keyfile_rekey(dir, old, new, err, sizeof(err))) {
		fprintf(stderr, "cove rekey: %s\n", err);
		goto out;
	}
	printf("rewrapped %s/%s under %s; no data file was rewritten\n", dir, KEYFILE_NAME,
	       keyprov_type_name(ends[1].type));
	status = 0;
out:
	keyprov_free(old);
	keyprov_free(new);
	return status;
}
