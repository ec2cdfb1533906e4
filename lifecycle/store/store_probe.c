/* The start-up probe: two create-only PUTs of one fresh key, then its delete. */
#include "lifecycle/store/store_probe.h"

#include "common/errmsg.h"
#include "common/hex.h"
#include "lifecycle/store/s3.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

int store_probe_decide(int first, const char *first_err, int second, const char *second_err,
		       char *err, size_t errlen)
{
	if (first == -EOPNOTSUPP || second == -EOPNOTSUPP)
		return errmsg(err, errlen, -EOPNOTSUPP,
			      "store probe: the store does not honour conditional create "
			      "(If-None-Match: *), which fencing depends on: %s",
			      first ? first_err : second_err);
	if (first)
		return errmsg(err, errlen, first,
			      "store probe: the first create-only PUT failed: %s", first_err);
	if (second == -EEXIST)
		return 0;
	if (!second)
		return errmsg(err, errlen, -EOPNOTSUPP,
			      "store probe: the store does not honour conditional create "
			      "(If-None-Match: *), which fencing depends on: a second create-only "
			      "PUT of the same key was accepted instead of answered 412");
	return errmsg(err, errlen, second == -EPROTO || second == -EINVAL ? -EOPNOTSUPP : second,
		      "store probe: the store does not honour conditional create "
		      "(If-None-Match: *), which fencing depends on: the second create-only PUT "
		      "got %s instead of 412",
		      second_err);
}

int store_probe(struct s3_client *c, char *err, size_t errlen)
{
	uint8_t rnd[8];
	char hex[17], key[96], e1[300] = "", e2[300] = "";
	if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
		return errmsg(err, errlen, -EIO, "store probe: getrandom failed");
	hex_encode(rnd, sizeof(rnd), hex);
	snprintf(key, sizeof(key), "probe/%d-%s", (int)getpid(), hex);
	static const char body[] = "cove store probe\n";
	int first = s3_put(c, key, body, sizeof(body) - 1, S3_IF_NONE_MATCH, e1, sizeof(e1));
	int second = first == -EOPNOTSUPP
			 ? first
			 : s3_put(c, key, body, sizeof(body) - 1, S3_IF_NONE_MATCH, e2, sizeof(e2));
	int r = store_probe_decide(first, e1, second, e2, err, errlen);
	char de[300];
	int d = s3_delete(c, key, de, sizeof(de));
	if (!r && d)
		return errmsg(err, errlen, d, "store probe: deleting the probe key: %s", de);
	return r;
}
