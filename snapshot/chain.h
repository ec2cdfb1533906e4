/* A snapshot chain directory: chain.json lists the layers (full base, then increments) and is the commit point. */
#ifndef COVE_CHAIN_H
#define COVE_CHAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CHAIN_FILE "chain.json"
#define CHAIN_MAX_LAYERS 256
#define CHAIN_NAME_MAX 64
#define CHAIN_MAX_BYTES (1u << 20)

struct chain_layer {
	uint64_t id, parent; /* parent 0: a full layer */
	bool full;
	char mem[CHAIN_NAME_MAX];   /* file names inside the chain directory */
	char state[CHAIN_NAME_MAX];
	uint64_t present, stored;   /* pages held / pages with data */
	uint64_t created_ns;	    /* CLOCK_REALTIME */
};

struct chain {
	char dir[4096];
	uint8_t chain_id[16];
	uint64_t ram_size;
	int nr_layers;
	struct chain_layer layers[CHAIN_MAX_LAYERS];
};

/*
 * Reads DIR/chain.json (capped, every field type- and range-checked, file names must be plain
 * names). -ENOENT when the directory has no chain yet; -EINVAL with a reason in `err`.
 */
int chain_load(const char *dir, struct chain *c, char *err, size_t errlen);
/* Pure: parses the JSON text of a chain file. */
int chain_parse(const char *text, size_t len, struct chain *c, char *err, size_t errlen);
/* Writes chain.json to a temporary name, fsyncs, renames over the old one, fsyncs the dir. */
int chain_commit(const struct chain *c, char *err, size_t errlen);
/* The newest layer, or NULL for an empty chain. */
const struct chain_layer *chain_latest(const struct chain *c);
/* Writes the hex form of the chain id into out[33]. */
void chain_id_hex(const uint8_t id[16], char out[33]);

#endif
