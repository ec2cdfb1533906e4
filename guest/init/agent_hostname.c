/* {"op":"hostname","name":"web-1"} -> {"ok":true}: the hostname a container's config.json names
 * (cove-oci), set after the sandbox starts and before its process runs: the VM is the container.
 * A restore's identity event sets the sandbox's name again; cove-oci asks after it. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"
#include "cove-init.h"

int hostname_handle(struct agent *ag, int fd, json_t *msg)
{
	json_t *jname = json_object_get(msg, "name");
	const char *name = json_string_value(jname);

	if (!name || json_string_length(jname) != strlen(name) || !identity_hostname_valid(name))
		return wire_reply_error(fd, "hostname: \"name\" must be 1..%d of [A-Za-z0-9.-]",
					INIT_HOSTNAME_MAX);
	/* Test mode runs on a developer's machine: never touch its hostname. */
	if (ag->test_uds)
		init_info(ag->log, "hostname: %s (test mode: the hostname is untouched)", name);
	else if (sethostname(name, strlen(name)) < 0)
		return wire_reply_error(fd, "hostname %s: %s", name, strerror(errno));
	return wire_reply_ok(fd);
}
