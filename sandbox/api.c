/* Control API request handler: routes, JSON validation and errno-to-HTTP mapping, with no I/O. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* GNU strerror_r: the loop thread must not share strerror's buffer */
#endif

#include "sandbox/api.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* Longer request targets get 414 before any routing work is done. */
#define API_MAX_PATH 256

/* One GET /debug/dirty_pages returns at most this many ranges (1 MiB of buffer). */
#define API_MAX_DIRTY_RANGES 65536

#define API_PAGE_SIZE 4096

/* A fault message is for humans; keep it bounded so echoing client input stays cheap. */
#define API_MAX_FAULT 512

typedef void (*api_route_fn)(const struct api_backend *be, json_t *body, struct api_response *resp);

struct api_route {
	const char *path;
	const char *method;
	api_route_fn fn;
	bool takes_body; /* body must be a JSON object; otherwise any body is ignored */
};

/* Describes one member of a request object; every listed member is required. */
struct api_field {
	const char *name;
	json_type type;
	const char *const *allowed; /* NULL-terminated enum values, or NULL for any string */
};

/*
 * Leaves resp with an empty 500 when out of memory; api_handle turns that
 * into -ENOMEM.  Takes ownership of obj.
 */
static void reply_json(struct api_response *resp, int status, json_t *obj)
{
	char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;

	json_decref(obj);
	resp->status = text ? status : 500;
	resp->body = text;
}

static void reply_empty(struct api_response *resp, int status)
{
	resp->status = status;
	resp->body = NULL;
}

static void reply_fault(struct api_response *resp, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void reply_fault(struct api_response *resp, int status, const char *fmt, ...)
{
	char msg[API_MAX_FAULT];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);

	/*
	 * Messages echo client bytes (a URL-decoded path, a truncated key) that
	 * need not be UTF-8, which JSON strings must be; degrade those to '?'
	 * rather than lose the whole message.
	 */
	json_t *str = json_string(msg);
	if (!str) {
		for (char *c = msg; *c; c++) {
			if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
				*c = '?';
		}
		str = json_string(msg);
	}
	reply_json(resp, status, str ? json_pack("{s:o}", "fault_message", str) : NULL);
}

static int errno_status(int err)
{
	switch (err) {
	case EINVAL:
		return 400;
	case EBUSY:
	case EALREADY:
		return 409;
	case ENOSYS:
	case ENOTSUP:
		return 501;
	default:
		return 500;
	}
}

/* `what` names the failed operation for the message; ret is the backend's -errno. */
static void reply_backend_error(struct api_response *resp, const char *what, int ret)
{
	char buf[128];
	int err = ret < 0 ? -ret : EIO;
	const char *text = strerror_r(err, buf, sizeof(buf));

	reply_fault(resp, errno_status(err), "%s failed: %s", what, text);
}

static const char *type_name(json_type t)
{
	switch (t) {
	case JSON_OBJECT:
		return "an object";
	case JSON_ARRAY:
		return "an array";
	case JSON_STRING:
		return "a string";
	case JSON_INTEGER:
		return "an integer";
	case JSON_REAL:
		return "a number";
	case JSON_TRUE:
	case JSON_FALSE:
		return "a boolean";
	case JSON_NULL:
		return "null";
	}
	return "an unknown type";
}

static bool type_matches(const json_t *v, json_type want)
{
	if (want == JSON_TRUE || want == JSON_FALSE)
		return json_is_boolean(v);
	return json_typeof(v) == want;
}

static void join_names(char *out, size_t len, const char *const *names, size_t n)
{
	size_t used = 0;

	out[0] = '\0';
	for (size_t i = 0; i < n && used < len; i++) {
		int w = snprintf(out + used, len - used, "%s%s", i ? ", " : "", names[i]);
		if (w < 0)
			break;
		used += (size_t)w;
	}
}

static size_t count_names(const char *const *names)
{
	size_t n = 0;

	while (names[n])
		n++;
	return n;
}

/*
 * Checks `obj` against `fields`: no unknown members, all present, right
 * types, enum strings in range.  On failure fills resp with a 400 and
 * returns -EINVAL.
 */
static int validate_object(json_t *obj, const struct api_field *fields, size_t nfields,
			   struct api_response *resp)
{
	const char *names[8];
	const char *key;
	json_t *val;
	char list[256];

	json_object_foreach(obj, key, val)
	{
		bool known = false;
		for (size_t i = 0; i < nfields; i++)
			known = known || strcmp(key, fields[i].name) == 0;
		if (!known) {
			size_t n = 0;
			for (size_t i = 0; i < nfields && n < 8; i++)
				names[n++] = fields[i].name;
			join_names(list, sizeof(list), names, n);
			reply_fault(resp, 400, "unknown field '%.64s'; allowed fields: %s", key,
				    list);
			return -EINVAL;
		}
	}

	for (size_t i = 0; i < nfields; i++) {
		const struct api_field *f = &fields[i];
		val = json_object_get(obj, f->name);
		if (!val) {
			reply_fault(resp, 400, "missing required field '%s'", f->name);
			return -EINVAL;
		}
		if (!type_matches(val, f->type)) {
			reply_fault(resp, 400, "field '%s' must be %s, got %s", f->name,
				    type_name(f->type), type_name(json_typeof(val)));
			return -EINVAL;
		}
		if (f->type != JSON_STRING || !f->allowed)
			continue;
		bool ok = false;
		for (size_t k = 0; f->allowed[k]; k++)
			ok = ok || strcmp(json_string_value(val), f->allowed[k]) == 0;
		if (!ok) {
			join_names(list, sizeof(list), f->allowed, count_names(f->allowed));
			reply_fault(resp, 400,
				    "invalid value '%.64s' for field '%s'; allowed values: %s",
				    json_string_value(val), f->name, list);
			return -EINVAL;
		}
	}
	return 0;
}

/* get_info with its result checked, since its strings go straight into JSON. */
static int fetch_info(const struct api_backend *be, struct api_vm_info *info,
		      struct api_response *resp)
{
	int r = -ENOSYS;

	memset(info, 0, sizeof(*info));
	if (be->get_info)
		r = be->get_info(be->opaque, info);
	if (r < 0) {
		reply_backend_error(resp, "get VM info", r);
		return r;
	}
	if (!info->state || !info->version || info->vcpus < 0 || info->mem_bytes > INT64_MAX) {
		reply_fault(resp, 500, "backend returned incomplete VM info");
		return -EIO;
	}
	return 0;
}

static void route_root_get(const struct api_backend *be, json_t *body, struct api_response *resp)
{
	struct api_vm_info info;

	(void)body;
	if (fetch_info(be, &info, resp) < 0)
		return;
	json_t *obj = json_pack("{s:s, s:s, s:s}", "app_name", "cove", "version", info.version,
				"state", info.state);
	if (!obj) {
		reply_fault(resp, 500, "backend returned VM info that is not valid UTF-8");
		return;
	}
	reply_json(resp, 200, obj);
}

static void route_vm_get(const struct api_backend *be, json_t *body, struct api_response *resp)
{
	struct api_vm_info info;

	(void)body;
	if (fetch_info(be, &info, resp) < 0)
		return;
	json_t *obj = json_pack("{s:s, s:i, s:I, s:s}", "state", info.state, "vcpus", info.vcpus,
				"mem_bytes", (json_int_t)info.mem_bytes, "version", info.version);
	if (!obj) {
		reply_fault(resp, 500, "backend returned VM info that is not valid UTF-8");
		return;
	}
	reply_json(resp, 200, obj);
}

static void route_vm_patch(const struct api_backend *be, json_t *body, struct api_response *resp)
{
	static const char *const states[] = {"Paused", "Resumed", NULL};
	static const struct api_field fields[] = {
	    {.name = "state", .type = JSON_STRING, .allowed = states},
	};
	struct api_vm_info info;

	if (validate_object(body, fields, 1, resp) < 0)
		return;
	bool pause = strcmp(json_string_value(json_object_get(body, "state")), "Paused") == 0;

	/*
	 * Asking for the state the VM is already in succeeds without touching
	 * the backend, so a client can retry a PATCH whose reply it lost.
	 */
	if (fetch_info(be, &info, resp) < 0)
		return;
	if (strcmp(info.state, pause ? "Paused" : "Running") == 0) {
		reply_empty(resp, 204);
		return;
	}

	int (*hook)(void *) = pause ? be->pause : be->resume;
	int r = hook ? hook(be->opaque) : -ENOSYS;
	if (r < 0) {
		reply_backend_error(resp, pause ? "pause" : "resume", r);
		return;
	}
	reply_empty(resp, 204);
}

static void route_actions_put(const struct api_backend *be, json_t *body, struct api_response *resp)
{
	static const char *const actions[] = {"SendCtrlAltDel", NULL};
	static const struct api_field fields[] = {
	    {.name = "action_type", .type = JSON_STRING, .allowed = actions},
	};

	if (validate_object(body, fields, 1, resp) < 0)
		return;
	int r = be->ctrl_alt_del ? be->ctrl_alt_del(be->opaque) : -ENOSYS;
	if (r < 0) {
		reply_backend_error(resp, "SendCtrlAltDel", r);
		return;
	}
	reply_empty(resp, 204);
}

static void route_dirty_get(const struct api_backend *be, json_t *body, struct api_response *resp)
{
	size_t nr = 0;
	uint64_t total = 0;
	bool truncated = false;
	json_t *ranges = NULL;

	(void)body;
	if (!be->dirty_pages) {
		reply_backend_error(resp, "read dirty pages", -ENOSYS);
		return;
	}

	struct api_dirty_range *buf = calloc(API_MAX_DIRTY_RANGES, sizeof(*buf));
	if (!buf) {
		reply_fault(resp, 500, "out of memory for the dirty page buffer");
		return;
	}

	int r = be->dirty_pages(be->opaque, buf, API_MAX_DIRTY_RANGES, &nr);
	if (r == -E2BIG) {
		truncated = true;
	} else if (r == -ENODATA) {
		reply_fault(resp, 409,
			    "dirty page tracking is off: start cove with --track-dirty-pages");
		goto out_buf;
	} else if (r < 0) {
		reply_backend_error(resp, "read dirty pages", r);
		goto out_buf;
	}
	if (nr > API_MAX_DIRTY_RANGES) {
		reply_fault(resp, 500,
			    "backend reported %zu dirty ranges, more than the %d it was given", nr,
			    API_MAX_DIRTY_RANGES);
		goto out_buf;
	}

	ranges = json_array();
	if (!ranges)
		goto oom;
	for (size_t i = 0; i < nr; i++) {
		if (buf[i].first_pfn > INT64_MAX || buf[i].nr_pages > INT64_MAX - total) {
			reply_fault(resp, 500, "backend returned an out-of-range dirty page range");
			goto out_ranges;
		}
		total += buf[i].nr_pages;
		json_t *pair =
		    json_pack("[I,I]", (json_int_t)buf[i].first_pfn, (json_int_t)buf[i].nr_pages);
		if (json_array_append_new(ranges, pair) < 0)
			goto oom;
	}

	json_t *obj = json_pack("{s:i, s:O, s:I, s:b}", "page_size", API_PAGE_SIZE, "ranges",
				ranges, "total_pages", (json_int_t)total, "truncated", truncated);
	if (!obj)
		goto oom;
	reply_json(resp, 200, obj);
	goto out_ranges;

oom:
	reply_fault(resp, 500, "out of memory building the dirty page list");
out_ranges:
	json_decref(ranges);
out_buf:
	free(buf);
}

/* Fields of `obj` must all be in `names`; fills a 400 otherwise. */
static int only_fields(json_t *obj, const char *const *names, struct api_response *resp)
{
	const char *key;
	json_t *val;
	char list[256];
	json_object_foreach(obj, key, val)
	{
		bool known = false;
		for (size_t i = 0; names[i]; i++)
			known = known || strcmp(key, names[i]) == 0;
		if (!known) {
			join_names(list, sizeof(list), names, count_names(names));
			reply_fault(resp, 400, "unknown field '%.64s'; allowed fields: %s", key,
				    list);
			return -EINVAL;
		}
	}
	return 0;
}

static void reply_snapshot_error(struct api_response *resp, int r, const char *msg)
{
	int status = r == -ENOENT || r == -EINVAL ? 400
		     : r == -EBUSY		  ? 409
		     : r == -ENOSYS		  ? 501
						  : 500;
	reply_fault(resp, status, "snapshot failed: %s", msg[0] ? msg : strerror(-r));
}

/*
 * PUT /snapshot/create {"snapshot_type": "Full"|"Diff", "snapshot_dir": DIR}: our chain
 * directory form.  Firecracker's "snapshot_path" is taken as the chain directory too;
 * "mem_file_path" is refused, since memory layers live inside the chain directory.
 */
static void route_snapshot_put(const struct api_backend *be, json_t *body,
			       struct api_response *resp)
{
	static const char *const names[] = {"snapshot_type", "snapshot_dir", "snapshot_path",
					    "mem_file_path", "version",	     NULL};
	if (only_fields(body, names, resp) < 0)
		return;
	json_t *type = json_object_get(body, "snapshot_type");
	json_t *dir = json_object_get(body, "snapshot_dir");
	json_t *path = json_object_get(body, "snapshot_path");
	if (!json_is_string(type) ||
	    (strcmp(json_string_value(type), "Full") && strcmp(json_string_value(type), "Diff"))) {
		reply_fault(resp, 400, "field 'snapshot_type' must be \"Full\" or \"Diff\"");
		return;
	}
	if ((dir && !json_is_string(dir)) || (path && !json_is_string(path)) || (dir && path)) {
		reply_fault(resp, 400,
			    "give the chain directory once, as a string: 'snapshot_dir'");
		return;
	}
	if (json_object_get(body, "mem_file_path")) {
		reply_fault(resp, 400,
			    "'mem_file_path' is not used: cove keeps memory layers in the "
			    "chain directory ('snapshot_dir')");
		return;
	}
	const char *d = dir ? json_string_value(dir) : path ? json_string_value(path) : NULL;
	if (d && (!*d || strlen(d) > 3800)) {
		reply_fault(resp, 400, "'snapshot_dir' must be 1 to 3800 bytes");
		return;
	}
	if (!be->snapshot) {
		reply_fault(resp, 501, "snapshots are not available");
		return;
	}
	struct api_snapshot_result r;
	char err[256] = "";
	int rc = be->snapshot(be->opaque, !strcmp(json_string_value(type), "Full"), d, &r, err,
			      sizeof(err));
	if (rc < 0) {
		reply_snapshot_error(resp, rc, err);
		return;
	}
	reply_json(resp, 200,
		   json_pack("{s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:b}", "layer_id",
			     (json_int_t)r.layer_id, "snapshot_type", r.full ? "Full" : "Diff",
			     "pages", (json_int_t)r.pages, "stored_pages", (json_int_t)r.stored,
			     "bytes", (json_int_t)r.bytes, "precopy_us", (json_int_t)r.precopy_us,
			     "pause_us", (json_int_t)r.pause_us, "write_us", (json_int_t)r.write_us,
			     "total_us", (json_int_t)r.total_us, "compacted", r.compacted, "staged",
			     r.staged));
}

/*
 * PUT /fork {"count": N, "identity": true}: N clones of this sandbox from a snapshot taken
 * now, each given a fresh identity (RNG seed, clock) before the reply says it runs.
 */
static void route_fork_put(const struct api_backend *be, json_t *body, struct api_response *resp)
{
	static const char *const names[] = {"count", "identity", NULL};
	if (only_fields(body, names, resp) < 0)
		return;
	json_t *ident = json_object_get(body, "identity");
	if (ident && !json_is_boolean(ident)) {
		reply_fault(resp, 400, "field 'identity' must be true or false");
		return;
	}
	json_t *count = json_object_get(body, "count");
	if (!json_is_integer(count) || json_integer_value(count) < 1 ||
	    json_integer_value(count) > API_MAX_FORKS) {
		reply_fault(resp, 400, "field 'count' must be an integer from 1 to %d",
			    API_MAX_FORKS);
		return;
	}
	if (!be->fork) {
		reply_fault(resp, 501, "fork is not available");
		return;
	}
	int n = (int)json_integer_value(count);
	struct api_clone *clones = calloc((size_t)n, sizeof(*clones));
	if (!clones) {
		reply_fault(resp, 500, "out of memory");
		return;
	}
	char err[256] = "";
	int rc = be->fork(be->opaque, n, !ident || json_is_true(ident), clones, err, sizeof(err));
	if (rc < 0) {
		free(clones);
		reply_snapshot_error(resp, rc, err);
		return;
	}
	json_t *arr = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(
		    arr, json_pack("{s:i,s:I,s:s,s:s,s:s,s:s,s:s}", "pid", clones[i].pid, "cid",
				   (json_int_t)clones[i].cid, "api_sock", clones[i].api_sock,
				   "vsock_uds", clones[i].vsock_uds, "snapshot_dir",
				   clones[i].snapshot_dir, "console", clones[i].console, "identity",
				   clones[i].identity));
	free(clones);
	reply_json(resp, 200, json_pack("{s:o}", "clones", arr));
}

/* The balloon's state into `bi`: 0, or -1 with the fault already in `resp`. */
static int balloon_fetch(const struct api_backend *be, struct api_response *resp, const char *what,
			 struct balloon_info *bi)
{
	int r = be->balloon_get ? be->balloon_get(be->opaque, bi) : -ENODEV;
	if (r == -ENODEV) {
		reply_fault(resp, 400, "the VM has no balloon device (cove run --balloon)");
		return -1;
	}
	if (r < 0) {
		reply_backend_error(resp, what, r);
		return -1;
	}
	return 0;
}

/* Firecracker's GET /balloon shape, plus what free page reporting gave back. */
static void route_balloon_get(const struct api_backend *be, json_t *body, struct api_response *resp)
{
	(void)body;
	struct balloon_info bi;
	if (balloon_fetch(be, resp, "balloon", &bi))
		return;
	reply_json(resp, 200,
		   json_pack("{s:I,s:I,s:I,s:b,s:b,s:b,s:I,s:I,s:I,s:I,s:I,s:I}", "amount_mib",
			     (json_int_t)(bi.target_pages / 256), "target_pages",
			     (json_int_t)bi.target_pages, "actual_pages",
			     (json_int_t)bi.actual_pages, "deflate_on_oom", bi.deflate_on_oom,
			     "free_page_reporting", bi.reporting, "stats", bi.stats_vq,
			     "reported_bytes", (json_int_t)bi.reported_bytes, "reported_ranges",
			     (json_int_t)bi.reported_ranges, "inflated_pages",
			     (json_int_t)bi.inflated_pages, "deflated_pages",
			     (json_int_t)bi.deflated_pages, "invalid", (json_int_t)bi.invalid,
			     "discard_errors", (json_int_t)bi.discard_errors));
}

/* Firecracker's names for the driver's statistics; absent ones are left out. */
static void route_balloon_stats_get(const struct api_backend *be, json_t *body,
				    struct api_response *resp)
{
	static const char *const names[BALLOON_NR_STATS] = {
	    "swap_in",		"swap_out",    "major_faults",
	    "minor_faults",	"free_memory", "total_memory",
	    "available_memory", "disk_caches", "hugetlb_allocations",
	    "hugetlb_failures"};
	(void)body;
	struct balloon_info bi;
	if (balloon_fetch(be, resp, "balloon statistics", &bi))
		return;
	json_t *o =
	    json_pack("{s:I,s:I,s:I,s:I,s:I}", "target_pages", (json_int_t)bi.target_pages,
		      "actual_pages", (json_int_t)bi.actual_pages, "target_mib",
		      (json_int_t)(bi.target_pages / 256), "actual_mib",
		      (json_int_t)(bi.actual_pages / 256), "updates", (json_int_t)bi.stats_updates);
	for (int t = 0; o && t < BALLOON_NR_STATS; t++)
		if (names[t] && bi.stats_valid & (1u << t))
			json_object_set_new(o, names[t], json_integer((json_int_t)bi.stats[t]));
	reply_json(resp, 200, o);
}

/* PATCH /balloon {"amount_mib": N}: the guest inflates (or deflates) towards N MiB. */
static void route_balloon_patch(const struct api_backend *be, json_t *body,
				struct api_response *resp)
{
	static const struct api_field fields[] = {{.name = "amount_mib", .type = JSON_INTEGER}};
	if (validate_object(body, fields, 1, resp) < 0)
		return;
	json_int_t mib = json_integer_value(json_object_get(body, "amount_mib"));
	if (mib < 0 || mib > (1 << 20)) {
		reply_fault(resp, 400, "amount_mib must be 0..1048576");
		return;
	}
	int r = be->balloon_set ? be->balloon_set(be->opaque, (uint64_t)mib) : -ENODEV;
	if (r == -ENODEV) {
		reply_fault(resp, 400, "the VM has no balloon device (cove run --balloon)");
		return;
	}
	if (r < 0) {
		reply_backend_error(resp, "balloon", r);
		return;
	}
	reply_empty(resp, 204);
}

static const struct api_route routes[] = {
    {"/balloon", "GET", route_balloon_get, false},
    {"/balloon", "PATCH", route_balloon_patch, true},
    {"/balloon/statistics", "GET", route_balloon_stats_get, false},
    {"/snapshot/create", "PUT", route_snapshot_put, true},
    {"/fork", "PUT", route_fork_put, true},
    {"/", "GET", route_root_get, false},
    {"/vm", "GET", route_vm_get, false},
    {"/vm", "PATCH", route_vm_patch, true},
    {"/actions", "PUT", route_actions_put, true},
    {"/debug/dirty_pages", "GET", route_dirty_get, false},
};

#define NR_ROUTES (sizeof(routes) / sizeof(routes[0]))

static bool path_is(const struct api_route *r, const char *path, size_t len)
{
	return strlen(r->path) == len && memcmp(r->path, path, len) == 0;
}

/* Parses a body that must be a JSON object; on failure fills resp and returns NULL. */
static json_t *parse_body(const char *body, size_t body_len, struct api_response *resp)
{
	json_error_t err;

	if (body_len == 0) {
		reply_fault(resp, 400, "request body required: expected a JSON object");
		return NULL;
	}
	/* Jansson would reject it too, but as a vague token error somewhere in the text. */
	if (memchr(body, '\0', body_len)) {
		reply_fault(resp, 400, "request body contains a NUL byte");
		return NULL;
	}
	/* DECODE_ANY so a bare string or number is reported as the wrong kind of body, not as a
	 * syntax error. */
	json_t *v = json_loadb(body, body_len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
	if (!v) {
		reply_fault(resp, 400, "invalid JSON at line %d column %d: %s", err.line,
			    err.column, err.text);
		return NULL;
	}
	if (!json_is_object(v)) {
		reply_fault(resp, 400, "request body must be a JSON object, got %s",
			    type_name(json_typeof(v)));
		json_decref(v);
		return NULL;
	}
	return v;
}

static void dispatch(const struct api_backend *be, const char *method, const char *path,
		     const char *body, size_t body_len, struct api_response *resp)
{
	const struct api_route *match = NULL;
	const char *allowed[NR_ROUTES];
	size_t nallowed = 0;
	char list[128];

	if (!method || !path) {
		reply_fault(resp, 400, "request has no method or path");
		return;
	}
	if (strnlen(path, API_MAX_PATH + 1) > API_MAX_PATH) {
		reply_fault(resp, 414, "request path longer than %d bytes", API_MAX_PATH);
		return;
	}
	if (body_len > API_MAX_BODY) {
		reply_fault(resp, 413, "request body of %zu bytes exceeds the %d byte limit",
			    body_len, API_MAX_BODY);
		return;
	}
	if (body_len && !body) {
		reply_fault(resp, 400, "request body missing");
		return;
	}

	size_t plen = strcspn(path, "?");
	for (size_t i = 0; i < NR_ROUTES; i++) {
		if (!path_is(&routes[i], path, plen))
			continue;
		allowed[nallowed++] = routes[i].method;
		if (strcmp(routes[i].method, method) == 0)
			match = &routes[i];
	}
	if (!nallowed) {
		reply_fault(resp, 404, "no such resource: %.*s", (int)plen, path);
		return;
	}
	if (!match) {
		join_names(list, sizeof(list), allowed, nallowed);
		reply_fault(resp, 405, "method %.16s not allowed on %.*s; allowed: %s", method,
			    (int)plen, path, list);
		return;
	}

	json_t *obj = NULL;
	if (match->takes_body) {
		obj = parse_body(body, body_len, resp);
		if (!obj)
			return;
	}
	match->fn(be, obj, resp);
	json_decref(obj);
}

int api_handle(const struct api_backend *be, const char *method, const char *path, const char *body,
	       size_t body_len, struct api_response *resp)
{
	resp->status = 500;
	resp->body = NULL;
	if (be->on_request)
		be->on_request(be->opaque);
	dispatch(be, method, path, body, body_len, resp);
	/* Every status but 204 carries a body; a missing one means the fault could not be built. */
	if (!resp->body && resp->status != 204) {
		resp->status = 500;
		return -ENOMEM;
	}
	return 0;
}
