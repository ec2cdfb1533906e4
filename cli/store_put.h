/* cove store put FILE KEY: uploads one file as one object, the way layers go up. */
#ifndef COVE_CLI_STORE_PUT_H
#define COVE_CLI_STORE_PUT_H

/* An exit status; prints one JSON line (key, bytes, multipart, seconds, mib_per_s, requests,
 * retries) on success. */
int store_put_cmd(int argc, char **argv);

#endif
