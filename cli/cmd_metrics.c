/*
 * `cove metrics [--out FILE]`: this host's sandboxes in Prometheus' text exposition format
 * (version 0.0.4), what prometheus-node-exporter's textfile collector reads. Local files only:
 * no store traffic, so a cron job can run it every few seconds. --out writes FILE atomically
 * (a temporary file beside it, then rename), as the textfile collector asks.
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"
#include "common/clock.h"
#include "lifecycle/launch.h"
#include "lifecycle/name.h"
#include "lifecycle/root.h"
#include "lifecycle/state.h"
#include "lifecycle/store_stats.h"
#include "lifecycle/vmm_args.h"

#define MAX_SANDBOXES 65536

/* The per-sandbox gauges, in struct row's gauge[] order; a value < 0 is not emitted. */
enum { G_RSS, G_SNAPSHOT_AGE, G_STORE_LAG, G_STORE_GEN, G_COUNT };
static const struct {
	const char *name, *help;
} gauges[G_COUNT] = {
    [G_RSS] = {"cove_vmm_resident_bytes",
	       "Resident set size of the sandbox's VMM process (running or paused sandboxes)."},
    [G_SNAPSHOT_AGE] = {"cove_snapshot_age_seconds",
			"Seconds since the sandbox's newest committed snapshot layer."},
    [G_STORE_LAG] = {"cove_store_lag_seconds",
		     "Seconds since this host last committed a generation of the sandbox to the "
		     "store."},
    [G_STORE_GEN] = {"cove_store_generation",
		     "The newest generation of the sandbox this host committed to the store."},
};

struct row {
	char name[SBX_NAME_MAX + 1];
	enum sbx_state state;
	int64_t gauge[G_COUNT];
	struct store_stats st;
};

/* The VMM's resident set (VmRSS of /proc/PID/status), or -1. */
static int64_t vmm_rss(int dfd)
{
	pid_t pid = sbx_vmm_pid(dfd);
	if (pid <= 0)
		return -1;
	char path[64], line[256];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return -1;
	long long kb = -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %lld kB", &kb) == 1)
			break;
	fclose(f);
	return kb < 0 ? -1 : kb * 1024;
}

static int64_t snapshot_age(int dfd, int64_t now_ms)
{
	struct stat st;
	if (fstatat(dfd, SBX_CHAIN "/chain.json", &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -1;
	int64_t t = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
	return now_ms > t ? (now_ms - t) / 1000 : 0;
}

struct rows {
	struct row *v;
	size_t n, cap;
	int64_t now_ms;
};

static int add_row(const char *name, int sfd, void *arg)
{
	struct rows *rs = arg;
	if (rs->n == rs->cap) {
		size_t nc = rs->cap ? rs->cap * 2 : 16;
		struct row *nr = nc <= MAX_SANDBOXES ? realloc(rs->v, nc * sizeof(*nr)) : NULL;
		if (!nr)
			return -ENOMEM;
		rs->v = nr;
		rs->cap = nc;
	}
	struct row *w = &rs->v[rs->n];
	memset(w, 0, sizeof(*w));
	memcpy(w->name, name, strnlen(name, SBX_NAME_MAX)); /* a checked name */
	if (sbx_state_read(sfd, &w->state, NULL))
		return 0; /* not a sandbox cove made (no event log): not listed */
	store_stats_load(sfd, &w->st);
	int64_t now = rs->now_ms;
	w->gauge[G_RSS] = vmm_rss(sfd);
	w->gauge[G_SNAPSHOT_AGE] = snapshot_age(sfd, now);
	w->gauge[G_STORE_LAG] = w->st.last_commit_ms <= 0    ? -1
				: now > w->st.last_commit_ms ? (now - w->st.last_commit_ms) / 1000
							     : 0;
	w->gauge[G_STORE_GEN] = w->st.generation ? (int64_t)w->st.generation : -1;
	rs->n++;
	return 0;
}

/* Every sandbox under the state root (none without one). 0 or -ENOMEM. */
static int collect(struct rows *rs)
{
	struct sbx_root r;
	if (sbx_root_open(&r, false, NULL, 0))
		return 0;
	int ret = sbx_root_each(&r, add_row, rs);
	sbx_root_close(&r);
	return ret;
}

static void head(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One series per sandbox of the counter at `off` in struct store_stats. */
static void counter(FILE *f, const struct row *rows, size_t n, const char *name, size_t off,
		    const char *help)
{
	head(f, name, "counter", help);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s{sandbox=\"%s\"} %llu\n", name, rows[i].name,
			(unsigned long long)*(const uint64_t *)((const char *)&rows[i].st + off));
}

static void emit(FILE *f, const struct row *rows, size_t n)
{
	head(f, "cove_sandboxes", "gauge", "Sandboxes on this host by state.");
	for (int s = SBX_CREATING; s <= SBX_DELETED; s++) {
		size_t c = 0;
		for (size_t i = 0; i < n; i++)
			c += rows[i].state == (enum sbx_state)s;
		fprintf(f, "cove_sandboxes{state=\"%s\"} %zu\n", sbx_state_name((enum sbx_state)s),
			c);
	}
	head(f, "cove_sandbox_info", "gauge", "1 for each sandbox, labelled with its state.");
	for (size_t i = 0; i < n; i++)
		fprintf(f, "cove_sandbox_info{sandbox=\"%s\",state=\"%s\"} 1\n", rows[i].name,
			sbx_state_name(rows[i].state));
	for (size_t g = 0; g < sizeof(gauges) / sizeof(gauges[0]); g++) {
		head(f, gauges[g].name, "gauge", gauges[g].help);
		for (size_t i = 0; i < n; i++)
			if (rows[i].gauge[g] >= 0)
				fprintf(f, "%s{sandbox=\"%s\"} %lld\n", gauges[g].name,
					rows[i].name, (long long)rows[i].gauge[g]);
	}
#define C(name, field, help) counter(f, rows, n, name, offsetof(struct store_stats, field), help)
	C("cove_store_uploaded_bytes_total", uploaded_bytes,
	  "Blob bytes this host uploaded to the store for the sandbox.");
	C("cove_store_uploaded_blobs_total", uploaded_blobs,
	  "Blobs this host uploaded to the store for the sandbox.");
	C("cove_store_commits_total", commits, "Generations this host committed for the sandbox.");
	C("cove_store_upload_errors_total", upload_errors,
	  "Uploads of a generation that failed or were refused (then tried again).");
	C("cove_store_fetched_bytes_total", fetched_bytes,
	  "Blob bytes this host fetched from the store for the sandbox.");
	C("cove_store_fetch_errors_total", fetch_errors,
	  "Fetches of a generation from the store that failed.");
	C("cove_lease_renewals_total", renewals, "Lease renewals that succeeded.");
	C("cove_lease_renewal_failures_total", renewal_failures,
	  "Lease renewals that failed (the store out of reach, or the lease moved on).");
	C("cove_lease_takeovers_total", takeovers,
	  "Times this host took the sandbox's lease over from another host.");
	C("cove_lease_lost_total", leases_lost,
	  "Times this host's lease moved to another host while its VM ran (the VM was ended).");
#undef C
}

int cmd_metrics(int argc, char **argv)
{
	const char *out = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--out") && i + 1 < argc) {
			out = argv[++i];
		} else {
			bool help = !strcmp(argv[i], "--help");
			fprintf(
			    help ? stdout : stderr,
			    "usage: cove metrics [--out FILE]\n"
			    "  this host's sandboxes in Prometheus text format (node-exporter's "
			    "textfile collector: --out DIR/cove.prom, written atomically)\n");
			return help ? 0 : 2;
		}
	}
	struct rows rs = {.now_ms = realtime_ms()};
	if (collect(&rs)) {
		fprintf(stderr, "cove metrics: out of memory\n");
		free(rs.v);
		return 1;
	}
	struct row *rows = rs.v;
	size_t n = rs.n;
	char tmp[4200];
	FILE *f = stdout;
	if (out) {
		if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp.%d", out, (int)getpid()) >=
		    sizeof(tmp)) {
			fprintf(stderr, "cove metrics: --out path too long\n");
			free(rows);
			return 2;
		}
		int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		f = fd >= 0 ? fdopen(fd, "w") : NULL;
		if (!f) {
			fprintf(stderr, "cove metrics: %s: %s\n", tmp, strerror(errno));
			if (fd >= 0)
				close(fd);
			free(rows);
			return 1;
		}
	}
	emit(f, rows, n);
	free(rows);
	if (!out)
		return fflush(stdout) ? 1 : 0;
	int bad = ferror(f) | fflush(f) | fsync(fileno(f));
	bad |= fclose(f);
	if (bad || rename(tmp, out) < 0) {
		fprintf(stderr, "cove metrics: %s: %s\n", out, strerror(errno));
		unlink(tmp);
		return 1;
	}
	return 0;
}
