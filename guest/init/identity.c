/* identity.c: the host's identity event after restore/fork: reseed the RNG, step the clock, new
 * epoch/token for the broker proxy. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>
#include <linux/random.h>

#include "agent.h"
#include "common/base64.h"
#include "common/hex.h"
#include "cove-init.h"

#define SEED_MIN 32
#define SEED_MAX 512

/* Mixes the seed into the kernel's pool and credits it (RNDADDENTROPY needs CAP_SYS_ADMIN). */
static int rng_add(const unsigned char *seed, size_t len)
{
	struct {
		struct rand_pool_info info;
		unsigned char buf[SEED_MAX];
	} req;
	int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC), ret = 0;

	if (fd < 0)
		return -errno;
	req.info.entropy_count = (int)(len * 8);
	req.info.buf_size = (int)len;
	memcpy(req.buf, seed, len);
	if (ioctl(fd, RNDADDENTROPY, &req) < 0)
		ret = -errno;
	/*
	 * Crediting entropy does not rekey a CRNG that is already initialised: clones of one
	 * snapshot would go on producing the same bytes until the next periodic reseed (up to a
	 * minute).  Force the reseed now.
	 */
	else if (ioctl(fd, RNDRESEEDCRNG, NULL) < 0)
		ret = -errno;
	explicit_bzero(&req, sizeof(req));
	close(fd);
	return ret;
}

static bool is_hex(const char *s)
{
	for (; *s; s++)
		if (hex_digit(*s) < 0)
			return false;
	return true;
}

/* {"op":"identity","epoch":N,"token":"hex","seed_b64":"...","time_ns":T[,"hostname":H]
 *  [,"machine_id":M]} -> {"ok":true,"new_machine":B} */
int identity_handle(struct agent *ag, int fd, json_t *msg)
{
	json_t *jepoch = json_object_get(msg, "epoch"), *jtime = json_object_get(msg, "time_ns");
	const char *token = json_string_value(json_object_get(msg, "token"));
	const char *seed64 = json_string_value(json_object_get(msg, "seed_b64"));
	json_t *jhost = json_object_get(msg, "hostname"),
	       *jmid = json_object_get(msg, "machine_id");
	const char *host = json_string_value(jhost), *mid = json_string_value(jmid);
	bool new_machine = false;
	unsigned char seed[SEED_MAX];
	size_t seed_len = 0;
	struct timespec ts;
	int ret;

	if (!json_is_integer(jepoch) || json_integer_value(jepoch) < 0)
		return wire_reply_error(fd, "identity: \"epoch\" must be an integer >= 0");
	if (!token || strlen(token) == 0 || strlen(token) > TOKEN_HEX_MAX || !is_hex(token))
		return wire_reply_error(fd, "identity: \"token\" must be 1..%d hex digits",
					TOKEN_HEX_MAX);
	if (!seed64 || b64_decode_loose(seed64, strlen(seed64), seed, sizeof(seed), &seed_len) < 0 ||
	    seed_len < SEED_MIN)
		return wire_reply_error(fd, "identity: \"seed_b64\" must be %d..%d bytes of base64",
					SEED_MIN, SEED_MAX);
	if (!json_is_integer(jtime) || json_integer_value(jtime) <= 0)
		return wire_reply_error(fd, "identity: \"time_ns\" must be a positive integer");
	if (jhost && (!host || !identity_hostname_valid(host)))
		return wire_reply_error(fd, "identity: \"hostname\" must be 1..%d of [A-Za-z0-9.-]",
					INIT_HOSTNAME_MAX);
	if (jmid && (!mid || !identity_machine_id_valid(mid)))
		return wire_reply_error(fd,
					"identity: \"machine_id\" must be %d lowercase hex "
					"digits, not all zero",
					MACHINE_ID_HEX);

	/* Test mode runs on a developer's machine: never touch its clock or RNG. */
	ret = ag->test_uds ? 0 : rng_add(seed, seed_len);
	explicit_bzero(seed, sizeof(seed));
	if (ret < 0)
		return wire_reply_error(fd, "identity: RNDADDENTROPY: %s", strerror(-ret));
	ts.tv_sec = (time_t)(json_integer_value(jtime) / 1000000000);
	ts.tv_nsec = (long)(json_integer_value(jtime) % 1000000000);
	if (!ag->test_uds && clock_settime(CLOCK_REALTIME, &ts) < 0)
		return wire_reply_error(fd, "identity: clock_settime: %s", strerror(errno));

	/* After the reseed: hooks that make keys for the new machine draw from the new pool. */
	identity_machine_apply(ag, host, mid, &new_machine);

	pthread_mutex_lock(&ag->lock);
	ag->epoch = (uint64_t)json_integer_value(jepoch);
	snprintf(ag->token, sizeof(ag->token), "%s", token);
	pthread_mutex_unlock(&ag->lock);
	if (ag->test_uds)
		init_info(ag->log, "identity: epoch %llu (test mode: clock and RNG untouched)",
			  (unsigned long long)json_integer_value(jepoch));
	else
		init_info(ag->log, "identity: epoch %llu, clock set, RNG reseeded with %zu bytes",
			  (unsigned long long)json_integer_value(jepoch), seed_len);
	json_t *reply = json_pack("{s:b,s:b}", "ok", 1, "new_machine", new_machine);
	ret = reply ? wire_msg_write(fd, reply) : -ENOMEM;
	json_decref(reply);
	return ret;
}
