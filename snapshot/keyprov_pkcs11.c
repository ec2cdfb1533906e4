/*
 * The PKCS#11 provider, cove's side: the config is parsed here; the token work (dlopen of the
 * module, login, AES-GCM in the token) runs in cove-pkcs11, a helper process beside the cove
 * binary, so cove never loads a module (and can be linked statically).
 */
#include "snapshot/keyprov.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "snapshot/pkcs11_token.h"

#define FIELD_MAX PKCS11_FIELD_MAX

/* RFC 7512-style %XX escapes in attribute values. */
static int unescape(const char *s, size_t n, char *out, size_t cap)
{
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		if (ch == '%') {
			if (i + 2 >= n || !isxdigit((unsigned char)s[i + 1]) ||
			    !isxdigit((unsigned char)s[i + 2]))
				return -EINVAL;
			char hex[3] = {s[i + 1], s[i + 2], 0};
			ch = (char)strtoul(hex, NULL, 16);
			i += 2;
		}
		if (o + 1 >= cap || ch == 0)
			return -EINVAL;
		out[o++] = ch;
	}
	out[o] = 0;
	return 0;
}

int keyprov_pkcs11_parse(const char *config, struct p11_conf *c, char *err, size_t errlen)
{
	memset(c, 0, sizeof(*c));
	if (strncmp(config, "pkcs11:", 7) != 0)
		return errmsg(err, errlen, -EINVAL, "pkcs11 config must start with 'pkcs11:'");
	const char *p = config + 7;
	while (*p) {
		const char *end = strchr(p, ';');
		size_t n = end ? (size_t)(end - p) : strlen(p);
		const char *eq = memchr(p, '=', n);
		if (!eq)
			return errmsg(err, errlen, -EINVAL,
				      "pkcs11 config: '%.*s' is not key=value",
				      (int)(n > 40 ? 40 : n), p);
		size_t kl = (size_t)(eq - p);
		char *dst = NULL;
		if (kl == 6 && strncmp(p, "module", 6) == 0)
			dst = c->module;
		else if (kl == 5 && strncmp(p, "token", 5) == 0)
			dst = c->token;
		else if (kl == 6 && strncmp(p, "object", 6) == 0)
			dst = c->object;
		else if (kl == 8 && strncmp(p, "pin-file", 8) == 0)
			dst = c->pin_file;
		else if (kl == 9 && strncmp(p, "pin-value", 9) == 0)
			return errmsg(
			    err, errlen, -EINVAL,
			    "pkcs11 config: pin-value is not accepted (it would be stored "
			    "in clear); use $COVE_PKCS11_PIN or pin-file=PATH");
		else
			return errmsg(err, errlen, -EINVAL,
				      "pkcs11 config: unknown attribute '%.*s'",
				      (int)(kl > 40 ? 40 : kl), p);
		if (unescape(eq + 1, n - kl - 1, dst, FIELD_MAX))
			return errmsg(err, errlen, -EINVAL, "pkcs11 config: bad value for '%.*s'",
				      (int)kl, p);
		p += n;
		if (*p == ';')
			p++;
	}
	if (!c->token[0] || !c->object[0])
		return errmsg(err, errlen, -EINVAL,
			      "pkcs11 config needs token=LABEL and object=LABEL");
	if (strlen(c->token) > 32)
		return errmsg(err, errlen, -EINVAL, "pkcs11 token label longer than 32 bytes");
	if (!c->module[0])
		snprintf(c->module, sizeof(c->module), "%s", KEYPROV_PKCS11_DEFAULT_MODULE);
	return 0;
}

int keyprov_pkcs11_check(const char *config, char *err, size_t errlen)
{
	struct p11_conf c;
	return keyprov_pkcs11_parse(config, &c, err, errlen);
}

/*
 * cove-pkcs11 beside this executable (/proc/self/exe), or $COVE_PKCS11_HELPER: the host's own
 * environment, as the module path and PIN are (tests point it into the build tree).
 */
static int helper_path(char *path, size_t cap, char *err, size_t errlen)
{
	const char *env = getenv("COVE_PKCS11_HELPER");
	if (env && *env) {
		if (snprintf(path, cap, "%s", env) >= (int)cap)
			return errmsg(err, errlen, -ENAMETOOLONG, "COVE_PKCS11_HELPER is too long");
		return 0;
	}
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return errmsg(err, errlen, -ENOENT, "pkcs11: cannot find this executable: %s",
			      strerror(errno));
	self[n] = 0;
	char *slash = strrchr(self, '/');
	if (slash)
		*slash = 0;
	if (snprintf(path, cap, "%s/cove-pkcs11", slash ? self : ".") >= (int)cap)
		return errmsg(err, errlen, -ENAMETOOLONG, "pkcs11: helper path too long");
	return 0;
}

int keyprov_pkcs11_run(const char *config, int wrap, const uint8_t *in, size_t in_len, uint8_t *out,
		       size_t cap, size_t *out_len, char *err, size_t errlen)
{
	char path[PATH_MAX];
	const char *op = wrap ? "wrap" : "unwrap";
	int r = keyprov_pkcs11_check(config, err, errlen)
		    ?: helper_path(path, sizeof(path), err, errlen);
	if (r)
		return r;
	if (access(path, X_OK) < 0)
		return errmsg(err, errlen, -ENOENT, "pkcs11: no helper %s (%s)", path,
			      strerror(errno));
	char *argv[] = {"cove-pkcs11", (char *)op, (char *)config, NULL};
	struct keyprov_exec x = {.label = "pkcs11",
				 .name = "cove-pkcs11",
				 .op = op,
				 .path = path,
				 .argv = argv,
				 .exit_is_errno = 1};
	return keyprov_exec_run(&x, in, in_len, out, cap, out_len, err, errlen);
}
