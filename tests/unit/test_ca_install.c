/* cli/ca_install.c: the guest bundle with the sandbox CA appended (idempotent, newline fixed,
 * only one PEM certificate accepted), and a sandbox without a CA needing no agent at all. */
#include "helpers.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "cli/ca_install.h"

#define PEM "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"

static void test_bundle_append(void **state)
{
	const char *old = "-----BEGIN CERTIFICATE-----\nMIIBother\n-----END CERTIFICATE-----";
	char *out;
	size_t len;

	(void)state;
	/* A missing final newline is added before ours. */
	assert_int_equal(ca_bundle_append(old, strlen(old), PEM, strlen(PEM), &out, &len), 0);
	assert_int_equal(len, strlen(old) + 1 + strlen(PEM));
	assert_memory_equal(out, old, strlen(old));
	assert_int_equal(out[strlen(old)], '\n');
	assert_memory_equal(out + strlen(old) + 1, PEM, strlen(PEM));
	/* Already there: nothing to write (a second start, or a clone of an installed disk). */
	{
		char *first = out, *again;
		size_t alen;

		assert_int_equal(ca_bundle_append(first, len, PEM, strlen(PEM), &again, &alen), 1);
		assert_null(again);
		free(first);
	}
	/* An empty bundle gets just the certificate. */
	assert_int_equal(ca_bundle_append("", 0, PEM, strlen(PEM), &out, &len), 0);
	assert_int_equal(len, strlen(PEM));
	assert_memory_equal(out, PEM, len);
	free(out);
	/* Only one PEM certificate, complete. */
	assert_int_equal(ca_bundle_append("", 0, "junk", 4, &out, &len), -EINVAL);
	assert_int_equal(ca_bundle_append("", 0, PEM PEM, 2 * strlen(PEM), &out, &len), -EINVAL);
	assert_int_equal(ca_bundle_append("", 0, PEM, strlen(PEM) - 1, &out, &len), -EINVAL);
	assert_null(out);
}

#define TPL_PEM "-----BEGIN CERTIFICATE-----\nMIIBtemplate\n-----END CERTIFICATE-----\n"

static void test_bundle_replace(void **state)
{
	const char *sys = "-----BEGIN CERTIFICATE-----\nMIIBsystem\n-----END CERTIFICATE-----\n";
	char old[512], *out;
	size_t len;

	(void)state;
	/* A sandbox made from a template: the template's CA leaves, the sandbox's comes. */
	snprintf(old, sizeof(old), "%s%s", sys, TPL_PEM);
	assert_int_equal(ca_bundle_replace(old, strlen(old), TPL_PEM, strlen(TPL_PEM), PEM,
					   strlen(PEM), &out, &len),
			 0);
	assert_int_equal(len, strlen(sys) + strlen(PEM));
	assert_memory_equal(out, sys, strlen(sys));
	assert_memory_equal(out + strlen(sys), PEM, strlen(PEM));
	assert_null(memmem(out, len, "MIIBtemplate", 12));
	free(out);
	/* Both there already (an interrupted install): only the stale one leaves. */
	snprintf(old, sizeof(old), "%s%s%s", TPL_PEM, sys, PEM);
	assert_int_equal(ca_bundle_replace(old, strlen(old), TPL_PEM, strlen(TPL_PEM), PEM,
					   strlen(PEM), &out, &len),
			 0);
	assert_int_equal(len, strlen(sys) + strlen(PEM));
	assert_null(memmem(out, len, "MIIBtemplate", 12));
	free(out);
	/* The same CA as before (a fork keeps its parent's): nothing to write. */
	snprintf(old, sizeof(old), "%s%s", sys, PEM);
	assert_int_equal(
	    ca_bundle_replace(old, strlen(old), PEM, strlen(PEM), PEM, strlen(PEM), &out, &len), 1);
	assert_null(out);
	/* What the guest had at the certificate's path is not one certificate: nothing is taken
	 * out of the bundle (the guest's bytes only ever remove themselves). */
	snprintf(old, sizeof(old), "%s", sys);
	assert_int_equal(ca_bundle_replace(old, strlen(old), sys, 10, PEM, strlen(PEM), &out, &len),
			 0);
	assert_int_equal(len, strlen(sys) + strlen(PEM));
	assert_memory_equal(out, sys, strlen(sys));
	free(out);
	assert_int_equal(ca_bundle_replace(old, strlen(old), NULL, 0, "junk", 4, &out, &len),
			 -EINVAL);
}

static void test_no_ca_nothing_to_do(void **state)
{
	char dir[] = "/tmp/cove-cai-XXXXXX", err[256] = "";
	int dfd;

	(void)state;
	assert_non_null(mkdtemp(dir));
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(dfd >= 0);
	/* No mitm-ca/ (a sandbox whose broker never ran): 0 without calling the agent. */
	assert_int_equal(sbx_ca_install(dfd, "/nonexistent/vsock.sock", err, sizeof(err)), 0);
	/* A certificate that is not one PEM certificate is refused before the guest is asked. */
	assert_int_equal(mkdirat(dfd, "mitm-ca", 0700), 0);
	{
		int fd = openat(dfd, "mitm-ca/mitm-ca.crt", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);

		assert_true(fd >= 0);
		assert_int_equal(write(fd, "nope\n", 5), 5);
		close(fd);
	}
	assert_int_equal(sbx_ca_install(dfd, "/nonexistent/vsock.sock", err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "not one PEM certificate"));
	unlinkat(dfd, "mitm-ca/mitm-ca.crt", 0);
	unlinkat(dfd, "mitm-ca", AT_REMOVEDIR);
	close(dfd);
	rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_bundle_append),
	    cmocka_unit_test(test_bundle_replace),
	    cmocka_unit_test(test_no_ca_nothing_to_do),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
