/* Where an image comes from, opened as a directory: an OCI image layout, an OCI archive or a
 * docker-archive (unpacked into cove's work directory), or an image in local
 * containers-storage (copied out as an OCI layout by skopeo). */
#ifndef COVE_IMAGE_SOURCE_H
#define COVE_IMAGE_SOURCE_H
#include "common/log.h"
#include "image/plan.h"

#include <limits.h>
#include <stdint.h>

struct image_source {
	int dfd;		   /* the layout or docker-archive directory */
	int workfd;		   /* the work directory `tmp` is in, or -1 */
	char tmp[64];		   /* what this source made in the work directory, or "" */
	char want[PLAN_REF_MAX];   /* the image the spec names within the source, or "" */
	char kind[24];		   /* "oci-layout", "oci-archive", "docker-archive", ... */
	char label[PATH_MAX + 32]; /* the spec as given, for image.json */
};

/*
 * SPEC: a path (a directory: an OCI layout or an unpacked docker-archive; a file: a tar of
 * either), or TRANSPORT:WHAT as skopeo writes them: oci:DIR[:REF], oci-archive:FILE[:REF],
 * docker-archive:FILE[:REF], containers-storage:REF. Archives are unpacked into a new
 * directory beneath workfd (regular files and directories only, beneath it, at most max_bytes),
 * which source_close removes. 0, or -errno with one line in err.
 */
int source_open(const char *spec, int workfd, uint64_t max_bytes, struct image_source *s,
		struct logger *log, char *err, size_t errlen);
void source_close(struct image_source *s);
#endif
