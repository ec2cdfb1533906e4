/* process.rlimits of an OCI process object (oci/bundle.h): untrusted, each entry checked. */
#include "oci/bundle.h"

#include <errno.h>
#include <string.h>

#include "common/errmsg.h"

/* A limit: an integer 0..RLIMIT_VALUE_MAX (jansson's integers stop at 2^63 - 1). */
static int limit_of(json_t *e, const char *key, size_t i, uint64_t *out, char *err, size_t errlen)
{
	json_t *v = json_object_get(e, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return errmsg(err, errlen, -EINVAL,
			      "process.rlimits[%zu].%s is not an integer of at least 0", i, key);
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

int oci_rlimits_parse(json_t *j, struct oci_process *p, char *err, size_t errlen)
{
	size_t i;
	json_t *e;

	p->nrlimits = 0;
	if (!j)
		return 0;
	if (!json_is_array(j))
		return errmsg(err, errlen, -EINVAL, "process.rlimits is not an array");
	if (json_array_size(j) > RLIMITS_MAX)
		return errmsg(err, errlen, -EINVAL, "process.rlimits has more than %d entries",
			      RLIMITS_MAX);
	json_array_foreach(j, i, e)
	{
		struct rlimit_val *v = &p->rlimits[i];
		const char *type = json_string_value(json_object_get(e, "type"));
		int r;

		if (!json_is_object(e))
			return errmsg(err, errlen, -EINVAL, "process.rlimits[%zu] is not an object",
				      i);
		if (!type || (v->resource = rlimit_resource(type)) < 0)
			return errmsg(err, errlen, -EINVAL,
				      "process.rlimits[%zu].type %.40s is not a known RLIMIT_ name",
				      i, type ? type : "(missing)");
		for (size_t k = 0; k < i; k++)
			if (p->rlimits[k].resource == v->resource)
				return errmsg(err, errlen, -EINVAL,
					      "process.rlimits[%zu]: %s is there twice", i, type);
		r = limit_of(e, "soft", i, &v->soft, err, errlen)
			?: limit_of(e, "hard", i, &v->hard, err, errlen);
		if (r)
			return r;
		if (v->soft > v->hard)
			return errmsg(err, errlen, -EINVAL,
				      "process.rlimits[%zu]: %s soft limit %llu is over its hard "
				      "limit %llu",
				      i, type, (unsigned long long)v->soft,
				      (unsigned long long)v->hard);
		p->nrlimits = i + 1;
	}
	return 0;
}
