/* cmdline.c: reads cove-init's settings from the kernel command line, with the kernel's quoting. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/base64.h"
#include "cove-init.h"

static int is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

static char *skip_spaces(char *s)
{
	while (is_space(*s))
		s++;
	return s;
}

/*
 * Splits the next "param[=val]" off args in place and returns the rest. Same rules as the
 * kernel's next_arg() (lib/cmdline.c), so we see the words exactly as the kernel did:
 * double quotes group spaces and are removed around a whole word or around a value.
 */
char *cmdline_next(char *args, char **param, char **val)
{
	size_t i, equals = 0;
	int in_quote = 0, quoted = 0;

	if (*args == '"') {
		args++;
		in_quote = 1;
		quoted = 1;
	}
	for (i = 0; args[i]; i++) {
		if (is_space(args[i]) && !in_quote)
			break;
		if (equals == 0 && args[i] == '=')
			equals = i;
		if (args[i] == '"')
			in_quote = !in_quote;
	}

	*param = args;
	if (!equals) {
		*val = NULL;
	} else {
		args[equals] = '\0';
		*val = args + equals + 1;
		if (**val == '"') {
			(*val)++;
			if (args[i - 1] == '"')
				args[i - 1] = '\0';
		}
	}
	if (quoted && i > 0 && args[i - 1] == '"')
		args[i - 1] = '\0';

	if (args[i]) {
		args[i] = '\0';
		args += i + 1;
	} else {
		args += i;
	}
	return skip_spaces(args);
}

static int decode_cmd(const char *val, struct init_config *cfg)
{
	size_t len = strlen(val), n;
	char *cmd = malloc(len + 1);

	if (!cmd)
		return -ENOMEM;
	if (b64_decode_loose(val, len, (uint8_t *)cmd, len, &n) < 0 || n == 0 ||
	    memchr(cmd, '\0', n)) {
		free(cmd);
		return -EINVAL;
	}
	cmd[n] = '\0';
	free(cfg->shell_cmd);
	cfg->shell_cmd = cmd;
	return 0;
}

/* Words after "--" become the command; like the kernel, put "param=val" back together. */
static int collect_argv(char *rest, struct init_config *cfg)
{
	size_t n = 0, cap = 8;
	char **argv = malloc(cap * sizeof(*argv));

	if (!argv)
		return -ENOMEM;
	while (*rest) {
		char *param, *val, *word;

		rest = cmdline_next(rest, &param, &val);
		if (val) {
			size_t pl = strlen(param), vl = strlen(val);

			word = malloc(pl + vl + 2);
			if (word) {
				memcpy(word, param, pl);
				word[pl] = '=';
				memcpy(word + pl + 1, val, vl + 1);
			}
		} else {
			word = strdup(param);
		}
		if (!word)
			goto oom;
		if (n + 1 == cap) {
			char **bigger = realloc(argv, 2 * cap * sizeof(*argv));

			if (!bigger) {
				free(word);
				goto oom;
			}
			argv = bigger;
			cap *= 2;
		}
		argv[n++] = word;
	}
	argv[n] = NULL;
	if (n == 0) {
		free(argv);
		return 0;
	}
	cfg->argv = argv;
	return 0;
oom:
	while (n > 0)
		free(argv[--n]);
	free(argv);
	return -ENOMEM;
}

#define MAIN_JSON_MAX (16 * 1024)

/* cove.main=: base64 of JSON, kept as text for main_spec_parse. */
static int decode_main(const char *val, struct init_config *cfg)
{
	size_t n = 0;
	char *buf = malloc(MAIN_JSON_MAX + 1);

	if (!buf)
		return -ENOMEM;
	if (b64_decode_loose(val, strlen(val), (uint8_t *)buf, MAIN_JSON_MAX, &n) < 0 ||
	    memchr(buf, '\0', n)) {
		free(buf);
		return -EINVAL;
	}
	buf[n] = '\0';
	free(cfg->main_json);
	cfg->main_json = buf;
	return 0;
}

/*
 * Fills cfg from the text of /proc/cmdline (modified in place). Returns 0, -EINVAL when a
 * cove.* value is unusable (cfg->error names it; the other settings are still read) or
 * -ENOMEM.
 */
int cmdline_parse(char *buf, struct init_config *cfg)
{
	char *args = skip_spaces(buf);
	int ret = 0;

	memset(cfg, 0, sizeof(*cfg));
	strcpy(cfg->hostname, "cove");
	cfg->stop = INIT_STOP_REBOOT;

	while (*args) {
		char *param, *val;

		args = cmdline_next(args, &param, &val);
		if (!val && strcmp(param, "--") == 0)
			return collect_argv(args, cfg) < 0 ? -ENOMEM : ret;
		if (!val)
			continue;
		if (strcmp(param, "cove.cmd") == 0) {
			int err = decode_cmd(val, cfg);

			if (err == -ENOMEM)
				return err;
			if (err < 0 && !cfg->error) {
				cfg->error = "cove.cmd (not valid base64 of a command)";
				ret = -EINVAL;
			}
		} else if (strcmp(param, "cove.hostname") == 0) {
			if (*val && strlen(val) <= INIT_HOSTNAME_MAX) {
				strcpy(cfg->hostname, val);
			} else if (!cfg->error) {
				cfg->error = "cove.hostname (empty or longer than 64)";
				ret = -EINVAL;
			}
		} else if (strcmp(param, "cove.root") == 0) {
			if (strlen(val) == 8 && !strncmp(val, "/dev/vd", 7) && val[7] >= 'a' &&
			    val[7] <= 'z') {
				strcpy(cfg->root_dev, val);
			} else if (!cfg->error) {
				cfg->error = "cove.root (want /dev/vda../dev/vdz)";
				ret = -EINVAL;
			}
		} else if (strcmp(param, "cove.main") == 0) {
			int err = decode_main(val, cfg);

			if (err == -ENOMEM)
				return err;
			if (err < 0 && !cfg->error) {
				cfg->error = "cove.main (not base64 of at most 16 KiB)";
				ret = -EINVAL;
			}
		} else if (strcmp(param, "cove.poweroff") == 0) {
			if (strcmp(val, "halt") == 0) {
				cfg->stop = INIT_STOP_HALT;
			} else if (strcmp(val, "reboot") == 0) {
				cfg->stop = INIT_STOP_REBOOT;
			} else if (!cfg->error) {
				cfg->error = "cove.poweroff (want reboot or halt)";
				ret = -EINVAL;
			}
		}
	}
	return ret;
}

void init_config_free(struct init_config *cfg)
{
	if (cfg->argv) {
		for (char **a = cfg->argv; *a; a++)
			free(*a);
		free(cfg->argv);
	}
	free(cfg->shell_cmd);
	free(cfg->main_json);
	cfg->argv = NULL;
	cfg->shell_cmd = NULL;
	cfg->main_json = NULL;
}
