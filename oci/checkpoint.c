/* cove-oci's checkpoint record, written and checked (oci/checkpoint.h). */
#include "oci/checkpoint.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common/errmsg.h"

json_t *oci_ckpt_json(const struct oci_ckpt *c)
{
	return json_pack("{s:i,s:s,s:s,s:I,s:i,s:I}", "cove_checkpoint", OCI_CKPT_VERSION, "root",
			 c->root, "session", c->session, "mem_bytes", (json_int_t)c->mem_bytes,
			 "vcpus", c->vcpus, "created_ms", (json_int_t)c->created_ms);
}

/* An image name as cove's image cache keeps them: [A-Za-z0-9._:@/-], no empty, "." or ".."
 * component, not absolute. */
static bool root_ok(const char *s)
{
	size_t n = strlen(s), comp = 0;
	if (!n || n >= sizeof(((struct oci_ckpt *)0)->root) || s[0] == '/')
		return false;
	for (size_t i = 0; i <= n; i++) {
		char ch = s[i];
		if (ch == '/' || ch == '\0') {
			if (comp == 0 || (comp == 1 && s[i - 1] == '.') ||
			    (comp == 2 && s[i - 1] == '.' && s[i - 2] == '.'))
				return false;
			comp = 0;
			continue;
		}
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || strchr("._:@-", ch)))
			return false;
		comp++;
	}
	return true;
}

/* An agent's session id: "s" and 1..10 digits. */
static bool session_ok(const char *s)
{
	size_t n = strlen(s);
	if (n < 2 || n > 11 || s[0] != 's')
		return false;
	for (size_t i = 1; i < n; i++)
		if (s[i] < '0' || s[i] > '9')
			return false;
	return true;
}

int oci_ckpt_parse(const char *text, size_t len, struct oci_ckpt *c, char *err, size_t errlen)
{
	json_error_t je;
	json_t *j;
	int ret = 0;

	memset(c, 0, sizeof(*c));
	if (len > OCI_CKPT_MAX)
		return errmsg(err, errlen, -E2BIG, "checkpoint record: larger than %d bytes",
			      OCI_CKPT_MAX);
	j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!j)
		return errmsg(err, errlen, -EINVAL, "checkpoint record: not JSON (line %d: %.80s)",
			      je.line, je.text);
	json_t *ver = json_object_get(j, "cove_checkpoint"), *root = json_object_get(j, "root"),
	       *ses = json_object_get(j, "session"), *mem = json_object_get(j, "mem_bytes"),
	       *cpus = json_object_get(j, "vcpus"), *cr = json_object_get(j, "created_ms");
	if (!json_is_object(j) || !json_is_integer(ver) ||
	    json_integer_value(ver) != OCI_CKPT_VERSION)
		ret = errmsg(err, errlen, -EINVAL,
			     "checkpoint record: not a cove checkpoint of version %d",
			     OCI_CKPT_VERSION);
	else if (!json_is_string(root) || !root_ok(json_string_value(root)))
		ret = errmsg(err, errlen, -EINVAL,
			     "checkpoint record: root is not a cove image name");
	else if (!json_is_string(ses) || !session_ok(json_string_value(ses)))
		ret = errmsg(err, errlen, -EINVAL,
			     "checkpoint record: session is not an exec session id");
	else if (!json_is_integer(mem) || json_integer_value(mem) < (16 << 20) ||
		 json_integer_value(mem) > (1LL << 40) || json_integer_value(mem) % 4096)
		ret = errmsg(err, errlen, -EINVAL,
			     "checkpoint record: mem_bytes is not 16 MiB..1 TiB in pages");
	else if (!json_is_integer(cpus) || json_integer_value(cpus) < 1 ||
		 json_integer_value(cpus) > 64)
		ret = errmsg(err, errlen, -EINVAL, "checkpoint record: vcpus is not 1..64");
	else if (cr && (!json_is_integer(cr) || json_integer_value(cr) < 0))
		ret = errmsg(err, errlen, -EINVAL, "checkpoint record: created_ms is not a time");
	if (!ret) {
		snprintf(c->root, sizeof(c->root), "%s", json_string_value(root));
		snprintf(c->session, sizeof(c->session), "%s", json_string_value(ses));
		c->mem_bytes = (uint64_t)json_integer_value(mem);
		c->vcpus = (int)json_integer_value(cpus);
		c->created_ms = cr ? json_integer_value(cr) : 0;
	}
	json_decref(j);
	return ret;
}
