/*
 * libFuzzer target: the S3 client's XML reply parsers (lifecycle/store/s3_xml.c), the bytes a
 * store sends back: error bodies, CreateMultipartUpload, CompleteMultipartUpload,
 * ListObjectsV2 and ListMultipartUploads. Whatever parses must respect the caps.
 */
#include <libxml/parser.h>
#include <stdio.h>

#include "fuzz.h"
#include "lifecycle/store/s3_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *body = (const char *)data;
	char code[64], id[S3_UPLOAD_ID_MAX + 1], err[300];
	bool retry;
	if (!s3_xml_error_code(body, size, code, sizeof(code)) && strlen(code) >= sizeof(code))
		abort();
	if (!s3_xml_upload_id(body, size, id, sizeof(id), err, sizeof(err)) && !id[0])
		abort();
	s3_xml_complete(body, size, &retry, err, sizeof(err));
	struct s3_list_page p;
	if (!s3_xml_list_objects(body, size, 4, &p, err, sizeof(err))) {
		if (p.n > 4 || (p.truncated && !p.next_token[0]))
			abort();
		for (size_t i = 0; i < p.n; i++)
			if (!p.entries[i].key[0] || strlen(p.entries[i].key) > S3_KEY_MAX)
				abort();
		s3_list_page_free(&p);
	}
	struct s3_upload_entry ups[4];
	size_t n = 0;
	char nk[S3_KEY_MAX + 1] = "", ni[S3_UPLOAD_ID_MAX + 1] = "";
	if (!s3_xml_list_uploads(body, size, 4, ups, &n, &retry, nk, ni, err, sizeof(err)) && n > 4)
		abort();
	return 0;
}
