/* cmdline_test.c: checks cove-init's kernel command line parsing; guest/rootfs/build runs it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cove-init.h"

static int failures;

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

static int parse(const char *text, struct init_config *cfg)
{
	static char buf[4096];

	snprintf(buf, sizeof(buf), "%s", text);
	return cmdline_parse(buf, cfg);
}

static void test_defaults(void)
{
	struct init_config cfg;

	CHECK(parse("console=ttyS0 reboot=k panic=-1 quiet\n", &cfg) == 0);
	CHECK(strcmp(cfg.hostname, "cove") == 0);
	CHECK(cfg.shell_cmd == NULL);
	CHECK(cfg.argv == NULL);
	CHECK(cfg.stop == INIT_STOP_REBOOT);
	init_config_free(&cfg);
}

static void test_cmd_and_hostname(void)
{
	struct init_config cfg;

	/* "echo hi; uname -r" */
	CHECK(parse("console=ttyS0 cove.cmd=ZWNobyBoaTsgdW5hbWUgLXI= cove.hostname=box7 "
		    "cove.poweroff=halt\n",
		    &cfg) == 0);
	CHECK(cfg.shell_cmd && strcmp(cfg.shell_cmd, "echo hi; uname -r") == 0);
	CHECK(strcmp(cfg.hostname, "box7") == 0);
	CHECK(cfg.stop == INIT_STOP_HALT);
	init_config_free(&cfg);

	/* unpadded and URL-safe alphabets: "a?>" is YT8+ / YT8- */
	CHECK(parse("cove.cmd=YT8-", &cfg) == 0);
	CHECK(cfg.shell_cmd && strcmp(cfg.shell_cmd, "a?>") == 0);
	init_config_free(&cfg);
	CHECK(parse("cove.cmd=aGk", &cfg) == 0);
	CHECK(cfg.shell_cmd && strcmp(cfg.shell_cmd, "hi") == 0);
	init_config_free(&cfg);
}

static void test_bad_values(void)
{
	struct init_config cfg;

	CHECK(parse("cove.cmd=not*base64 cove.hostname=ok", &cfg) == -EINVAL);
	CHECK(cfg.error && strstr(cfg.error, "cove.cmd"));
	CHECK(strcmp(cfg.hostname, "ok") == 0);
	init_config_free(&cfg);
	CHECK(parse("cove.cmd=A", &cfg) == -EINVAL); /* 6 bits: no whole byte */
	init_config_free(&cfg);
	CHECK(parse("cove.cmd=AA==", &cfg) == -EINVAL); /* decodes to a NUL byte */
	init_config_free(&cfg);
	CHECK(parse("cove.cmd=", &cfg) == -EINVAL);
	init_config_free(&cfg);
	CHECK(parse("cove.poweroff=maybe", &cfg) == -EINVAL);
	init_config_free(&cfg);
	CHECK(
	    parse("cove.hostname=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
		  &cfg) == -EINVAL);
	CHECK(strcmp(cfg.hostname, "cove") == 0);
	init_config_free(&cfg);
}

static void test_dashes(void)
{
	struct init_config cfg;

	CHECK(parse("console=ttyS0 -- sh -c \"echo hi there\" A=\"x y\" last\n", &cfg) == 0);
	CHECK(cfg.argv != NULL);
	if (cfg.argv) {
		CHECK(strcmp(cfg.argv[0], "sh") == 0);
		CHECK(strcmp(cfg.argv[1], "-c") == 0);
		CHECK(strcmp(cfg.argv[2], "echo hi there") == 0);
		CHECK(strcmp(cfg.argv[3], "A=x y") == 0);
		CHECK(strcmp(cfg.argv[4], "last") == 0);
		CHECK(cfg.argv[5] == NULL);
	}
	init_config_free(&cfg);

	/* cove.* after "--" belongs to the command, not to us */
	CHECK(parse("-- cove.hostname=x", &cfg) == 0);
	CHECK(strcmp(cfg.hostname, "cove") == 0);
	CHECK(cfg.argv && strcmp(cfg.argv[0], "cove.hostname=x") == 0);
	init_config_free(&cfg);

	CHECK(parse("quiet --   \n", &cfg) == 0);
	CHECK(cfg.argv == NULL);
	init_config_free(&cfg);
}

static void test_quoted_param(void)
{
	struct init_config cfg;

	/* a quoted value with spaces is one parameter and does not hide what follows */
	CHECK(parse("foo=\"a b -- c\" cove.hostname=h", &cfg) == 0);
	CHECK(strcmp(cfg.hostname, "h") == 0);
	CHECK(cfg.argv == NULL);
	init_config_free(&cfg);
}

static void test_image_root(void)
{
	struct init_config cfg;

	/* eyJhcmd2IjpbIi9hcHAiXX0= is {"argv":["/app"]} */
	CHECK(parse("root=/dev/vda cove.root=/dev/vda cove.main=eyJhcmd2IjpbIi9hcHAiXX0=", &cfg) ==
	      0);
	CHECK(strcmp(cfg.root_dev, "/dev/vda") == 0);
	CHECK(cfg.main_json && strcmp(cfg.main_json, "{\"argv\":[\"/app\"]}") == 0);
	init_config_free(&cfg);
	CHECK(parse("cove.root=/dev/sda1", &cfg) == -EINVAL);
	CHECK(cfg.root_dev[0] == '\0');
	init_config_free(&cfg);
	CHECK(parse("cove.root=/dev/vd", &cfg) == -EINVAL);
	init_config_free(&cfg);
	CHECK(parse("cove.main=*notbase64*", &cfg) == -EINVAL);
	CHECK(cfg.main_json == NULL);
	init_config_free(&cfg);
	CHECK(parse("cove.main=AA==", &cfg) == -EINVAL); /* a NUL byte */
	init_config_free(&cfg);
}

int main(void)
{
	test_image_root();
	test_defaults();
	test_cmd_and_hostname();
	test_bad_values();
	test_dashes();
	test_quoted_param();
	if (failures) {
		fprintf(stderr, "cmdline_test: %d failure(s)\n", failures);
		return 1;
	}
	printf("cmdline_test: ok\n");
	return 0;
}
