/* cove-store evict: the local cache of the store kept under its bound (`cove gc` runs it). */
#ifndef COVE_CLI_STORE_CACHE_H
#define COVE_CLI_STORE_CACHE_H

/* cove store evict [--cache-max SIZE] [--dry-run] [--config FILE]: an exit status. */
int store_evict_cmd(int argc, char **argv);

#endif
