/* What an image source holds, read and checked before anything is unpacked: the manifest
 * (OCI layout) or manifest.json (docker-archive), the config, and each layer's blob with the
 * digest and size it must have. */
#ifndef COVE_IMAGE_PLAN_H
#define COVE_IMAGE_PLAN_H
#include "image/digest.h"

#include <jansson.h>
#include <stdint.h>

#define PLAN_MAX_LAYERS 127 /* overlayfs' own limit on lower layers is 500; images use < 100 */
#define PLAN_MAX_JSON	(4 << 20) /* a manifest, index or config */
#define PLAN_REF_MAX	200

struct plan_layer {
	char path[160]; /* beneath the source directory */
	uint64_t size;
	char hex[DIGEST_HEX + 1];
};

struct image_plan {
	char kind[8];		  /* "oci" or "docker" */
	char key[DIGEST_HEX + 1]; /* the manifest's digest (oci), the config's (docker) */
	char ref[PLAN_REF_MAX];	  /* the name the source gives the image, or "" */
	json_t *config;		  /* the image config as the source holds it (checked later) */
	int nr_layers;
	struct plan_layer layers[PLAN_MAX_LAYERS];
};

/*
 * Reads the image in the directory dfd: an OCI image layout (oci-layout, index.json, blobs/)
 * or an unpacked docker-archive (manifest.json). `want` picks one image when the source holds
 * several (an OCI ref.name annotation, or one of a docker image's RepoTags); NULL or "" takes
 * the only one, else the linux/amd64 one of an index. Every JSON file is size-capped; every
 * blob is opened beneath dfd without following links, its digest checked (layers: when they
 * are unpacked). 0, or -errno with one line in err.
 */
int plan_read(int dfd, const char *want, struct image_plan *p, char *err, size_t errlen);
void plan_free(struct image_plan *p);

/* Opens `path` beneath dfd for reading without following any link: the fd or -errno. */
int plan_open_beneath(int dfd, const char *path);
#endif
