/* One sandbox as JSON: name, state, since_ms, vcpus, mem_bytes, disk_bytes, chain_bytes,
 * last_snapshot_age_s, encrypted, cache {hits, misses} (docs/CLI.md, "JSON output"). */
#ifndef COVE_CLI_SANDBOX_JSON_H
#define COVE_CLI_SANDBOX_JSON_H

#include <jansson.h>

/* dfd: the sandbox's directory. NULL when its spec or state cannot be read. */
json_t *sbx_describe_json(int dfd, const char *name);

#endif
