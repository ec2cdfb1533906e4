#!/usr/bin/env python3
"""bench/store_lag.py's part inside the KVM box: one host (store.json at /work/store, radosgw
through the box's forwarded port) runs sandbox lag with a snapshot every INTERVAL s while its
guest rewrites DIRTY_KIB of random bytes in a tmpfs file once per interval (paced by the guest
clock, so every interval dirties the same amount); cove-store follow uploads each commit.

Measured, by polling every 0.1 s: when each local commit appeared (the mtime of its
chain.NNNNNNNNNN.json, which the VMM writes last; chain.json's if it was folded back), and when
the follower committed it to the store ("commit N is generation G" in store.log; the time is
store-stats.json's last_commit_ms for that generation when it matches, else when the line was
seen). The store lag of commit c = the time the store first held a generation of commit >= c
(a follower busy with an older commit sends the newest one next) - c's commit time.
usage: store_lag_in_box.py lag   (env: LAG_INTERVAL_S, LAG_DIRTY_KIB, LAG_INTERVALS, LAG_MEM)
Results in /work/out/lag.json.
"""
import json
import os
import re
import sys
import time

sys.path.insert(0, "/work")
from store_box import STATE, check, cove, run_role, tail  # noqa: E402

OUT = {}
INTERVAL_S = int(os.environ.get("LAG_INTERVAL_S", "15"))
DIRTY_KIB = int(os.environ.get("LAG_DIRTY_KIB", "12800"))
INTERVALS = int(os.environ.get("LAG_INTERVALS", "22"))
MEM = os.environ.get("LAG_MEM", "256M")
NAME = "lag"
GEN_RE = re.compile(r"chain\.(\d{10})\.json")
UP_RE = re.compile(r"commit (\d+) is generation (\d+): (\d+) blobs sent \((\d+) bytes\)")


def local_commits(chain, seen):
    """New commits in chain/: {commit: mtime (realtime s)} added to seen."""
    try:
        names = os.listdir(chain)
    except OSError:
        return
    for f in names:
        m = GEN_RE.fullmatch(f)
        if m and int(m.group(1)) not in seen:
            try:
                seen[int(m.group(1))] = os.stat(os.path.join(chain, f)).st_mtime
            except OSError:
                pass
    try:
        p = os.path.join(chain, "chain.json")
        g = int(json.load(open(p)).get("generation", 0))
        if g and g not in seen:
            seen[g] = os.stat(p).st_mtime
    except (OSError, ValueError):
        pass


def store_commits(d, seen, pos):
    """New 'commit N is generation G' lines of store.log: seen[N] = (time, G, bytes)."""
    try:
        with open(os.path.join(d, "store.log"), errors="replace") as f:
            f.seek(pos[0])
            text = f.read()
    except OSError:
        return
    cut = text.rfind("\n") + 1
    pos[0] += len(text[:cut].encode())
    now = time.time()
    found = UP_RE.findall(text[:cut])
    if not found:
        return
    try:
        st = json.load(open(os.path.join(d, "store-stats.json")))
    except (OSError, ValueError):
        st = {}
    for c, g, blobs, nbytes in found:
        t = now
        if st.get("generation") == int(g) and st.get("last_commit_ms"):
            t = st["last_commit_ms"] / 1000
        seen.setdefault(int(c), (t, int(g), int(nbytes)))


def p95(xs):
    s = sorted(xs)
    k = max(0, -(-95 * len(s) // 100) - 1)  # nearest rank
    return s[k]


def lag():
    rc, out, err, t = cove("create", NAME, "--cold", "--mem", MEM, "--snapshot-every", f"{INTERVAL_S}s")
    check(rc == 0, f"cove create {NAME}: rc={rc} {err.strip()!r}; vmm.log "
          f"{tail(os.path.join(STATE, NAME, 'vmm.log'))!r}")
    print(f"  cove create {NAME} --mem {MEM} --snapshot-every {INTERVAL_S}s: {t:.1f} s",
          flush=True)
    d = os.path.join(STATE, NAME)
    chain = os.path.join(d, "chain")
    # DIRTY_KIB of random bytes rewritten in place once per interval, paced by the guest clock
    n64 = DIRTY_KIB // 64
    script = ("mkdir -p /ram && mount -t tmpfs tmpfs /ram && "
              f"dd if=/dev/zero of=/ram/f bs=64k count={n64} 2>/dev/null; "
              "t=$(date +%s); while :; do "
              f"dd if=/dev/urandom of=/ram/f bs=64k count={n64} conv=notrunc 2>/dev/null; "
              f"echo $t > /ram/last; t=$((t+{INTERVAL_S})); n=$(date +%s); "
              "[ $t -gt $n ] && sleep $((t-n)); done")
    rc, out, err, t = cove("exec", NAME, "--detach", "--", "sh", "-c", script)
    check(rc == 0, f"{NAME}: the writer: rc={rc} {err!r}")
    t_writer = time.time()
    print(f"  writer started: {DIRTY_KIB} KiB of /dev/urandom per {INTERVAL_S} s", flush=True)
    commits, uploads, pos = {}, {}, [0]
    end = t_writer + INTERVALS * INTERVAL_S + 2
    printed = set()
    while time.time() < end:
        local_commits(chain, commits)
        store_commits(d, uploads, pos)
        for c in sorted(set(uploads) - printed):
            printed.add(c)
            tc = commits.get(c)
            print(f"  commit {c} -> generation {uploads[c][1]} ({uploads[c][2]} bytes), "
                  f"{uploads[c][0] - tc:.1f} s after its commit" if tc else
                  f"  commit {c} -> generation {uploads[c][1]}", flush=True)
        time.sleep(0.1)
    # the measured commits: those after the writer began; wait for the store to hold the last
    measured = sorted(c for c, tc in commits.items() if tc > t_writer)
    check(measured, f"{NAME}: no commit in {INTERVALS} intervals; store.log "
          f"{tail(os.path.join(d, 'store.log'))!r}")
    last = measured[-1]
    deadline = time.time() + 300
    while not any(u >= last for u in uploads) and time.time() < deadline:
        time.sleep(0.1)
        store_commits(d, uploads, pos)
    lags, rows = [], []
    for c in measured:
        ups = [u for u in uploads if u >= c]
        if not ups:
            rows.append({"commit": c, "lag_s": None})
            continue
        t_up = min(uploads[u][0] for u in ups)
        lags.append(t_up - commits[c])
        rows.append({"commit": c, "lag_s": round(t_up - commits[c], 2),
                     "uploaded_as_commit": min(ups, key=lambda u: uploads[u][0])})
    missing = [r["commit"] for r in rows if r["lag_s"] is None]
    OUT.update({
        "interval_s": INTERVAL_S, "dirty_kib_per_interval": DIRTY_KIB, "mem": MEM,
        "intervals_run": INTERVALS, "commits_measured": len(measured),
        "commits_not_in_store": missing,
        "lags": rows,
        "uploads": {str(c): {"t": v[0], "generation": v[1], "bytes": v[2]}
                    for c, v in sorted(uploads.items())},
        "commit_times": {str(c): t for c, t in sorted(commits.items())},
        "writer_start": t_writer,
    })
    if lags:
        s = sorted(lags)
        OUT.update({"p95_s": round(p95(lags), 2), "median_s": round(s[len(s) // 2], 2),
                    "max_s": round(s[-1], 2), "min_s": round(s[0], 2)})
        print(f"  store lag over {len(lags)} commits: median {OUT['median_s']} s, p95 "
              f"{OUT['p95_s']} s, max {OUT['max_s']} s", flush=True)
    rc, out, err, t = cove("stop", NAME, timeout=900)
    check(rc == 0, f"cove stop {NAME}: rc={rc} {err!r}")
    check(not missing, f"commits never in the store: {missing}")


if __name__ == "__main__":
    sys.exit(run_role({"lag": lag}, OUT))
