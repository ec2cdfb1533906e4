#!/usr/bin/env python3
"""The cache e2e test's part inside the KVM box (tests/e2e/cache_e2e.py drives it).

One host with a real Linux guest per sandbox, a real Ceph radosgw as its store (issue 29, the
bounded cache). usage: cache_box.py cache

  - s1, s2, s3 created and stopped in that order (each stop commits a generation), r created and
    left running;
  - cove gc --dry-run --cache-max U - own(s1)/2 names s1 only and removes nothing; the same
    without --dry-run evicts s1 (the least recently used) and only it: no local tombstone, the
    store still lists s1 as stored;
  - cove exec s1 answers (pulled from the store: a miss), cove exec s2 answers (a hit);
  - cove gc with store.json's "cache_max": "1M" (no flag) evicts every stopped sandbox, never
    r: r's files are all still there (same inodes), it still runs and answers;
  - cove exec s3 answers after that (a miss), and cove start s2 pulls and starts it (a miss);
    cove ls --cache --json counts 1 hit, 3 misses, 4 evictions.
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, "/work")
from store_box import ENV, STATE, STORE_BIN, check, cove, run_role, sh, tail  # noqa: E402

OUT = {}


def create(name):
    rc, out, err, t = cove("create", name, "--cold", "--snapshot-every", "off")
    check(rc == 0, f"cove create {name}: rc={rc} {err.strip()!r}; vmm.log "
          f"{tail(os.path.join(STATE, name, 'vmm.log'))!r}")
    print(f"  cove create {name}: {t:.1f} s", flush=True)


def stop(name):
    rc, out, err, t = cove("stop", name)
    check(rc == 0 and "committed to the store" in out, f"cove stop {name}: rc={rc} {out!r} {err!r}")
    print(f"  cove stop {name}: {t:.1f} s", flush=True)


def cache():
    rc, out, err, t = cove("ls", "--cache", "--json")
    check(rc == 0, f"cove ls --cache --json: rc={rc} {err!r}")
    j = json.loads(out)
    j["by_name"] = {s["name"]: s for s in j["sandboxes"]}
    return j


def gc(*args, env=None):
    t0 = time.monotonic()
    r = subprocess.run(["/work/cove", "gc"] + list(args), capture_output=True, timeout=600,
                       env=env or ENV)
    out, err = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    print(f"  cove gc {' '.join(args)}: rc={r.returncode}, {time.monotonic() - t0:.1f} s\n    "
          + "\n    ".join(out.strip().splitlines() + err.strip().splitlines()), flush=True)
    return r.returncode, out, err


def evicted(out):
    return sorted(l.split()[4].rstrip(":") for l in out.splitlines()
                  if l.startswith("cove gc: cache: evicted "))


def files_of(name):
    """Every file under NAME's directory with its inode (a running sandbox's logs grow, and its
    lease record is replaced by rename: names only for those; its chain's files by inode)."""
    seen = {}
    for d, dirs, files in os.walk(os.path.join(STATE, name)):
        for f in files:
            p = os.path.join(d, f)
            if f.startswith("."):
                continue  # a temporary file of a write in progress
            rel = os.path.relpath(p, STATE)
            seen[rel] = os.lstat(p).st_ino if rel.startswith(f"{name}/chain/") else None
    return seen


def same_files(before, after):
    """Every file of before is still there (its chain's files the very same inodes)."""
    return [p for p, ino in before.items() if p not in after or (ino and after[p] != ino)]


def answers(name, word):
    rc, out, err, t = sh(name, f"echo {word}")
    check(rc == 0 and out.strip() == word, f"cove exec {name}: rc={rc} {out!r} {err[-1500:]!r}; "
          f"vmm.log {tail(os.path.join(STATE, name, 'vmm.log'))!r}")
    return t


def store_state(name):
    r = subprocess.run([STORE_BIN, "ls"], capture_output=True, env=ENV, timeout=120)
    check(r.returncode == 0, f"cove store ls: rc={r.returncode} {r.stderr.decode()!r}")
    for line in r.stdout.decode().splitlines()[1:]:
        f = line.split()
        if f and f[0] == name:
            return f[-1]
    return "absent"


def role_cache():
    for n in ("s1", "s2", "s3"):
        create(n)
        stop(n)
        time.sleep(1.1)  # last use (the stop's event) a second apart at least
    create("r")
    c = cache()
    own = {n: c["by_name"][n]["own_bytes"] for n in ("s1", "s2", "s3", "r")}
    OUT["usage_before"], OUT["own"] = c["usage_bytes"], own
    print(f"  usage {c['usage_bytes']} bytes; own bytes {own}; last used "
          f"{ {n: c['by_name'][n]['last_used_ms'] for n in own} }", flush=True)
    check(all(own[n] > 0 for n in own), f"a sandbox owns no bytes: {own}")
    check(c["by_name"]["r"]["state"] == "running", f"r: {c['by_name']['r']}")
    r_files = files_of("r")
    bound = c["usage_bytes"] - own["s1"] // 2
    check(bound < own["s1"] + own["s2"] + own["s3"] + own["r"] + c["usage_bytes"], "bound")
    OUT["bound1"] = bound

    # A dry run names s1 and touches nothing.
    rc, out, err = gc("--dry-run", "--cache-max", str(bound))
    check(rc == 0 and "would evict s1:" in out and "would evict s2" not in out and
          all(os.path.isdir(os.path.join(STATE, n)) for n in ("s1", "s2", "s3")),
          f"dry run: rc={rc} {out!r} {err!r}")
    # The least recently used one goes, and only it.
    rc, out, err = gc("--cache-max", str(bound))
    check(rc == 0 and evicted(out) == ["s1"], f"gc --cache-max {bound}: rc={rc} {out!r} {err!r}")
    check(not os.path.exists(os.path.join(STATE, "s1")), "s1's directory is still there")
    check(all(os.path.isdir(os.path.join(STATE, n)) for n in ("s2", "s3", "r")),
          "s2, s3 or r went too")
    check(not os.path.exists(os.path.join(STATE, ".deleted", "s1.json")),
          "eviction left a local tombstone")
    check(store_state("s1") == "stored", f"s1 in the store: {store_state('s1')}")
    after = cache()
    OUT["usage_after1"] = after["usage_bytes"]
    check(after["usage_bytes"] <= bound, f"usage {after['usage_bytes']} > bound {bound}")
    check(after["evictions"] == 1 and after["evicted_bytes"] == own["s1"],
          f"counters after one eviction: {after}")
    line = [l for l in out.splitlines() if l.startswith("cove gc: cache: evicted s1:")][0]
    check("bytes freed, last used 20" in line, f"eviction line: {line!r}")

    # s1 reconnects from the store (a miss); s2 from its local copy (a hit).
    t = answers("s1", "s1-back")
    OUT["s1_reconnect_s"] = t
    print(f"  cove exec s1 after its eviction: answered in {t:.1f} s (pulled from the store)",
          flush=True)
    stop("s1")
    t = answers("s2", "s2-here")
    print(f"  cove exec s2 (local copy): answered in {t:.1f} s", flush=True)
    stop("s2")
    c = cache()
    check(c["hits"] == 1 and c["misses"] == 1, f"after one miss and one hit: {c}")

    # The host's setting (store.json's cache_max), no flag: everything committed goes, never r.
    cfg = json.load(open(ENV["COVE_STORE"]))
    cfg["cache_max"] = "1M"
    with open("/tmp/store-1m.json", "w") as f:
        json.dump(cfg, f)
    env = dict(ENV, COVE_STORE="/tmp/store-1m.json")
    rc, out, err = gc(env=env)
    check(rc == 0 and evicted(out) == ["s1", "s2", "s3"],
          f"gc with cache_max 1M: rc={rc} {out!r} {err!r}")
    check("r kept: running" in out, f"gc did not say r is kept: {out!r}")
    gone = same_files(r_files, files_of("r"))
    check(not gone, f"r's files removed or replaced under gc: {gone}")
    print(f"  r (running): its {len(r_files)} files all still there after gc", flush=True)
    c = cache()
    check(c["by_name"]["r"]["state"] == "running" and sorted(c["by_name"]) == ["r"],
          f"after gc: {c['by_name']}")
    t = answers("r", "r-alive")
    t = answers("s3", "s3-back")
    print(f"  cove exec s3 after its eviction: answered in {t:.1f} s", flush=True)
    # cove start pulls an evicted sandbox too (a miss); an exec of it running counts nothing.
    rc, out, err, t = cove("start", "s2")
    check(rc == 0 and "running" in out, f"cove start s2 after its eviction: rc={rc} {out!r} "
          f"{err[-1500:]!r}")
    answers("s2", "s2-started")
    print(f"  cove start s2 after its eviction: {t:.1f} s", flush=True)
    c = cache()
    OUT["final"] = {k: c[k] for k in ("usage_bytes", "hits", "misses", "evictions",
                                      "evicted_bytes")}
    check(c["hits"] == 1 and c["misses"] == 3 and c["evictions"] == 4, f"final counters: {c}")
    print(f"  counters: {OUT['final']}", flush=True)


def main():
    return run_role({"cache": role_cache}, OUT)


if __name__ == "__main__":
    sys.exit(main())
