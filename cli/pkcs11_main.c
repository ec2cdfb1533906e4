/*
 * cove-pkcs11 wrap|unwrap CONFIG: the pkcs11 key provider's token work in a process of its own.
 * stdin: the input as one base64 line; stdout: the output in base64. On failure the exit status
 * is the errno of what failed and stderr has one line saying it (keyprov_exec_run reads both).
 * cove starts it; it loads the PKCS#11 module, which therefore never enters cove.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/base64.h"
#include "common/fd_io.h"
#include "snapshot/crypto.h"
#include "snapshot/keyprov.h"
#include "snapshot/pkcs11_token.h"

#define IN_TEXT_MAX (KEYPROV_WRAPPED_MAX * 2 + 64)

static int fail(int r, const char *msg)
{
	fprintf(stderr, "%s\n", msg);
	return r < 0 && -r < 256 ? -r : EIO;
}

int main(int argc, char **argv)
{
	static char text[IN_TEXT_MAX + 1];
	static uint8_t in[KEYPROV_WRAPPED_MAX], out[KEYPROV_WRAPPED_MAX];
	static char enc[KEYPROV_WRAPPED_MAX * 2];
	char err[512];
	size_t in_len = 0, out_len = 0;

	if (argc != 3 || (strcmp(argv[1], "wrap") && strcmp(argv[1], "unwrap")))
		return fail(-EINVAL,
			    "usage: cove-pkcs11 wrap|unwrap pkcs11:token=LABEL;object=LABEL[;...]");
	ssize_t n = read_upto(0, text, sizeof(text));
	if (n < 0)
		return fail((int)n, "pkcs11: cannot read the input");
	if ((size_t)n > IN_TEXT_MAX)
		return fail(-EMSGSIZE, "pkcs11: input too large");
	while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' '))
		n--;
	int r = b64_decode_loose(text, (size_t)n, in, sizeof(in), &in_len);
	if (r)
		return fail(r, "pkcs11: input is not base64");
	r = pkcs11_token_run(argv[2], strcmp(argv[1], "wrap") == 0, in, in_len, out, sizeof(out),
			     &out_len, err, sizeof(err));
	crypto_cleanse(in, sizeof(in));
	if (r) {
		crypto_cleanse(out, sizeof(out));
		return fail(r, err);
	}
	b64_encode(out, out_len, enc);
	crypto_cleanse(out, sizeof(out));
	r = write_full(1, enc, strlen(enc)) ?: write_full(1, "\n", 1);
	crypto_cleanse(enc, sizeof(enc));
	return r ? fail(r, "pkcs11: cannot write the output") : 0;
}
