/* An image config's runtime defaults, checked (image/image_config.h). */
#include "image/image_config.h"

#include "common/errmsg.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

static bool plain_string(json_t *s)
{
	return json_is_string(s) && json_string_length(s) == strlen(json_string_value(s)) &&
	       json_string_length(s) <= IMAGE_CFG_MAX_STRING;
}

static int take_list(json_t *in, const char *field, bool env, json_t *out, char *err, size_t errlen)
{
	json_t *v = json_object_get(in, field), *list = json_array();
	if (!list)
		return -ENOMEM;
	if (v && !json_is_null(v) && !json_is_array(v)) {
		json_decref(list);
		return errmsg(err, errlen, -EINVAL, "the image config's %s is not a list", field);
	}
	if (json_array_size(v) > IMAGE_CFG_MAX_ITEMS) {
		json_decref(list);
		return errmsg(err, errlen, -EINVAL, "the image config's %s has more than %d items",
			      field, IMAGE_CFG_MAX_ITEMS);
	}
	size_t i;
	json_t *s;
	json_array_foreach(v, i, s)
	{
		const char *t = json_string_value(s);
		if (!plain_string(s) || (env && (!strchr(t, '=') || t[0] == '='))) {
			json_decref(list);
			return errmsg(err, errlen, -EINVAL,
				      "the image config's %s item %zu is not %s", field, i + 1,
				      env ? "NAME=VALUE" : "a plain string");
		}
		json_array_append_new(list, json_string(t));
	}
	json_object_set_new(out, field, list);
	return 0;
}

static bool user_ok(const char *u)
{
	if (strlen(u) > 64)
		return false;
	int colons = 0;
	for (const char *c = u; *c; c++) {
		if (*c == ':')
			colons++;
		else if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
			   (*c >= '0' && *c <= '9') || *c == '_' || *c == '-' || *c == '.'))
			return false;
	}
	return colons <= 1 && u[0] != ':';
}

int image_config_take(json_t *config, json_t **out, char *err, size_t errlen)
{
	if (!json_is_object(config))
		return errmsg(err, errlen, -EINVAL, "the image config is not a JSON object");
	const char *arch = json_string_value(json_object_get(config, "architecture"));
	const char *os = json_string_value(json_object_get(config, "os"));
	if (arch && strcmp(arch, "amd64"))
		return errmsg(err, errlen, -EINVAL,
			      "the image is for %.32s: cove runs linux/amd64 guests here", arch);
	if (os && strcmp(os, "linux"))
		return errmsg(err, errlen, -EINVAL, "the image is for %.32s, not linux", os);
	json_t *in = json_object_get(config, "config");
	if (in && !json_is_object(in) && !json_is_null(in))
		return errmsg(err, errlen, -EINVAL, "the image config's config is not an object");
	json_t *o = json_object();
	if (!o)
		return -ENOMEM;
	int r = take_list(in, "Env", true, o, err, errlen);
	if (!r)
		r = take_list(in, "Entrypoint", false, o, err, errlen);
	if (!r)
		r = take_list(in, "Cmd", false, o, err, errlen);
	json_t *wd = json_object_get(in, "WorkingDir"), *user = json_object_get(in, "User");
	if (!r && wd && !json_is_null(wd) &&
	    (!plain_string(wd) || (json_string_length(wd) && json_string_value(wd)[0] != '/')))
		r = errmsg(err, errlen, -EINVAL, "the image config's WorkingDir is not absolute");
	if (!r && user && !json_is_null(user) &&
	    (!plain_string(user) || !user_ok(json_string_value(user))))
		r = errmsg(err, errlen, -EINVAL,
			   "the image config's User is not NAME, UID, NAME:GROUP or UID:GID");
	if (!r) {
		json_object_set_new(o, "WorkingDir",
				    json_string(json_is_string(wd) ? json_string_value(wd) : ""));
		json_object_set_new(
		    o, "User", json_string(json_is_string(user) ? json_string_value(user) : ""));
	}
	if (r) {
		json_decref(o);
		return r;
	}
	*out = o;
	return 0;
}
