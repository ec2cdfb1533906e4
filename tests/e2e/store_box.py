#!/usr/bin/env python3
"""The store e2e test's part inside the KVM box (tests/e2e/store_e2e.py drives it).

One box run is one host: its own state root, run directory and cache, and nothing shared with
the other host but the store (a real Ceph radosgw on the host's loopback, reached through the
box's one forwarded port, 10.0.2.100). usage: store_box.py a|b

  a: host A creates three sandboxes (plain s1 with 100 MiB in guest RAM and a file on its disk,
     plain s2, encrypted s3 under a key-cmd KEK), waits for a periodic upload of s1, stops all
     three (each stop commits a final generation) and writes what it saw to /work/out/a.json.
     The box, and with it host A's state root, is gone when the run ends.
  b: host B, empty: 20 concurrent `cove exec s2`, then `cove exec s1` reads both files back,
     then s3 with its KEK revoked (refused) and granted again; results in /work/out/b.json.
"""
import concurrent.futures
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time

COVE = "/work/cove"
STORE_BIN = "/work/cove-store"
STATE = "/tmp/cove-state"
RUN = "/tmp/cove-run"
ENV = dict(os.environ, COVE_STATE_DIR=STATE, COVE_RUN_DIR=RUN, COVE_GUEST_DIR="/work",
           COVE_STORE="/work/store/store.json")
KEK_CMD = "key-cmd:python3 /work/store/kek.py /work/store/kek"
OUT = {}


class Failure(Exception):
    pass


def check(ok, what):
    if not ok:
        raise Failure(what)


def cove(*args, timeout=600):
    t0 = time.monotonic()
    try:
        r = subprocess.run([COVE] + list(args), capture_output=True, timeout=timeout, env=ENV)
    except subprocess.TimeoutExpired:
        raise Failure(f"cove {' '.join(args)[:120]} timed out after {timeout} s")
    return (r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace"),
            time.monotonic() - t0)


def sh(name, script, timeout=600):
    return cove("exec", name, "--", "sh", "-c", script, timeout=timeout)


def log_mark(what):
    """One unsigned GET of a key named WHAT: radosgw logs its path (and refuses it), so the
    host can tell which of its logged requests fell between two marks."""
    import ssl
    import urllib.error
    import urllib.request
    cfg = json.load(open(ENV["COVE_STORE"]))
    ctx = ssl.create_default_context(cafile=cfg["ca_file"])
    ctx.check_hostname = False
    try:
        urllib.request.urlopen(f"{cfg['endpoint']}/{cfg['bucket']}/cove-e2e-mark-{what}",
                               context=ctx, timeout=30).read()
    except urllib.error.HTTPError:
        pass  # 403 or 404: the request is in radosgw's log either way


def tail(path, n=1500):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError as e:
        return f"({e})"


def newest(name):
    """The newest committed generation of NAME in the store (cove store ls), 0 if none."""
    r = subprocess.run([STORE_BIN, "ls"], capture_output=True, env=ENV, timeout=120)
    check(r.returncode == 0, f"cove store ls: rc={r.returncode} {r.stderr.decode()!r}")
    for line in r.stdout.decode().splitlines()[1:]:
        f = line.split()
        if f and f[0] == name:
            return int(f[1])
    return 0


def cove_ls():
    rc, out, err, t = cove("ls", "--json")
    check(rc == 0, f"cove ls --json: rc={rc} {err!r}")
    return {e["name"]: e for e in json.loads(out)["sandboxes"]}


def create(name, *opts):
    rc, out, err, t = cove("create", name, "--cold", *opts)
    check(rc == 0, f"cove create {name}: rc={rc} {err.strip()!r}; vmm.log "
          f"{tail(os.path.join(STATE, name, 'vmm.log'))!r}")
    print(f"  cove create {name}: {t:.1f} s", flush=True)


def host_a():
    create("s1", "--mem", "384M", "--snapshot-every", "20s")
    # 100 MiB of random bytes in guest RAM (tmpfs), and a file on the guest's disk.
    rc, out, err, t = sh("s1", "mkdir -p /ram && mount -t tmpfs -o size=200m tmpfs /ram && "
                         "head -c 104857600 /dev/urandom > /ram/big && "
                         "head -c 3000000 /dev/urandom > /disk-file && "
                         f"for i in 1 2 3 4; do echo {os.environ['PLAIN_MARK']}-$i; done "
                         "> /ram/plain && sync && sha256sum /ram/big /disk-file", timeout=900)
    check(rc == 0, f"s1: writing the files: rc={rc} {err!r}")
    sums = {os.path.basename(p): h for h, p in (l.split() for l in out.splitlines())}
    print(f"  s1: 100 MiB in RAM and 3 MB on disk written ({t:.1f} s): {sums}", flush=True)
    # A periodic upload after the writes: the follower commits each new layer; two newer
    # generations than the one before the writes means one taken after them.
    g0 = newest("s1")
    deadline = time.monotonic() + 600
    g = g0
    while g < g0 + 2 and time.monotonic() < deadline:
        time.sleep(2)
        g = newest("s1")
    check(g >= g0 + 2, f"s1: no periodic upload after the writes (generations {g0} -> {g}); "
          f"store.log {tail(os.path.join(STATE, 's1', 'store.log'))!r}")
    print(f"  s1: periodic uploads committed generations {g0 + 1}..{g}", flush=True)
    OUT["s1_periodic_gen"] = g
    create("s2", "--snapshot-every", "off")
    rc, out, err, t = sh("s2", "echo s2-was-here > /s2-file && sync")
    check(rc == 0, f"s2: rc={rc} {err!r}")
    create("s3", "--snapshot-every", "off", "--key", KEK_CMD)
    mark = os.environ["SECRET_MARK"]
    rc, out, err, t = sh("s3", f"mkdir -p /ram && mount -t tmpfs tmpfs /ram && "
                         f"for i in 1 2 3 4; do echo {mark}-$i; done > /ram/secret && "
                         f"echo {mark}-disk > /secret-disk && sync && cat /ram/secret")
    check(rc == 0 and mark in out, f"s3: rc={rc} {err!r}")
    for name in ("s1", "s2", "s3"):
        rc, out, err, t = cove("stop", name)
        check(rc == 0, f"cove stop {name}: rc={rc} {err!r}")
        OUT[f"{name}_final_gen"] = newest(name)
        print(f"  cove stop {name}: {t:.1f} s, generation {OUT[name + '_final_gen']} committed",
              flush=True)
    OUT["sums"] = sums
    ls = cove_ls()
    for name in ("s1", "s2", "s3"):
        st = ls[name].get("store") or {}
        check(ls[name]["state"] == "stopped" and st.get("newest") == OUT[f"{name}_final_gen"]
              and 0 <= st.get("lag_s", -1) < 600, f"cove ls after the stops: {ls[name]}")
    print(f"  cove ls: store lag s1 {ls['s1']['store']['lag_s']} s, s2 "
          f"{ls['s2']['store']['lag_s']} s, s3 {ls['s3']['store']['lag_s']} s", flush=True)
    # With a store, archive means "only in the store".
    rc, out, err, t = cove("archive", "s2")
    check(rc == 0 and not os.path.exists(os.path.join(STATE, "s2")),
          f"cove archive s2: rc={rc} {out!r} {err!r}")
    ls = cove_ls()
    check(ls["s2"]["state"] == "remote" and ls["s2"]["store"]["newest"] >= OUT["s2_final_gen"],
          f"cove ls after cove archive s2: {ls.get('s2')}")
    OUT["s2_final_gen"] = ls["s2"]["store"]["newest"]
    print(f"  cove archive s2: {out.strip()} ({t:.1f} s); cove ls says remote", flush=True)
    for name in ("s1", "s2", "s3"):
        print(f"  {name} store.log: {tail(os.path.join(STATE, name, 'store.log'), 600)!r}")
    shutil.rmtree(STATE)
    shutil.rmtree(RUN, ignore_errors=True)


def host_b():
    check(not os.path.exists(STATE), "host B's state root is not empty")
    want = json.load(open("/work/a.json"))
    ls = cove_ls()
    check(sorted(ls) == ["s1", "s2", "s3"] and all(
        e["state"] == "remote" and e["store"]["newest"] == want[f"{n}_final_gen"]
        for n, e in ls.items()), f"cove ls on host B before any exec: {ls}")
    print("  cove ls on host B: s1, s2, s3 remote (only in the store)", flush=True)
    # 20 concurrent execs of a sandbox this host has never seen.
    t0 = time.monotonic()
    log_mark("s2-begin")
    with concurrent.futures.ThreadPoolExecutor(20) as ex:
        res = list(ex.map(lambda i: sh("s2", f"cat /s2-file; echo n={i}"), range(20)))
    log_mark("s2-end")
    # The client's own retries (a GET that failed and was sent again), which the host's
    # count of fetches per blob allows for.
    OUT["s2_retries"] = [l for r in res for l in r[2].splitlines() if "; retry " in l]
    bad = [(i, r[0], r[2][-1500:]) for i, r in enumerate(res)
           if r[0] != 0 or r[1].split() != ["s2-was-here", f"n={i}"]]
    check(not bad, f"s2: concurrent execs failed: {bad[:3]}")
    OUT["s2_concurrent_s"] = time.monotonic() - t0
    with open(os.path.join(STATE, "s2", "events.jsonl")) as f:
        ev = [json.loads(l) for l in f if l.endswith("\n")]
    OUT["s2_events"] = ev
    print(f"  s2: 20 concurrent execs answered in {OUT['s2_concurrent_s']:.1f} s; "
          f"events {[(e.get('to'), e.get('cause')) for e in ev]}", flush=True)
    # s1: both files, by digest.
    rc, out, err, t = sh("s1", "sha256sum /ram/big /disk-file")
    check(rc == 0, f"s1: exec on host B: rc={rc} {err!r}; vmm.log "
          f"{tail(os.path.join(STATE, 's1', 'vmm.log'))!r}")
    sums = {os.path.basename(p): h for h, p in (l.split() for l in out.splitlines())}
    check(sums == want["sums"], f"s1: digests on host B {sums} != host A's {want['sums']}")
    print(f"  s1: both files read back on host B with host A's digests ({t:.1f} s)", flush=True)
    # s3: its KEK revoked on this host, then granted.
    os.rename("/work/store/kek", "/work/store/kek.revoked")
    rc, out, err, t = sh("s3", "cat /ram/secret")
    check(rc == 67 and err.count("\n") == 1, f"s3 with the KEK revoked: rc={rc} "
          f"{out!r} {err!r}")
    OUT["s3_revoked"] = [rc, err.strip()]
    print(f"  s3, KEK revoked: rc={rc}: {err.strip()}", flush=True)
    os.rename("/work/store/kek.revoked", "/work/store/kek")
    rc, out, err, t = sh("s3", "cat /ram/secret /secret-disk")
    mark = os.environ["SECRET_MARK"]
    check(rc == 0 and out.split() == [f"{mark}-{i}" for i in (1, 2, 3, 4)] + [f"{mark}-disk"],
          f"s3 with the KEK granted: rc={rc} {out!r} {err!r}")
    print("  s3, KEK granted again: the secret read back", flush=True)
    # cove rm here writes the store's tombstone: a third host (a state root of its own) is
    # then told the sandbox was removed, exit 66.
    rc, out, err, t = cove("rm", "s2")
    check(rc == 0, f"cove rm s2: rc={rc} {err!r}")
    ENV["COVE_STATE_DIR"], ENV["COVE_RUN_DIR"] = "/tmp/host-c-state", "/tmp/host-c-run"
    rc, out, err, t = sh("s2", "true")
    check(rc == 66 and "removed" in err and err.count("\n") == 1, f"exec of a removed sandbox on host C: rc={rc} {err!r}")
    print(f"  cove rm s2 on host B; host C: exit 66: {err.strip()}", flush=True)
    ENV["COVE_STATE_DIR"], ENV["COVE_RUN_DIR"] = STATE, RUN
    for name in ("s1", "s3"):
        cove("stop", name)
    lease_checks()
    foreground_checks()
    partition_checks()
    race_checks()
    metrics_checks()


HOST_C = dict(ENV, COVE_STATE_DIR="/tmp/hc-state", COVE_RUN_DIR="/tmp/hc-run",
              COVE_STORE="/work/store/store-c.json")


def cove_c(*args, timeout=600):
    try:
        r = subprocess.run([COVE] + list(args), capture_output=True, timeout=timeout,
                           env=HOST_C)
    except subprocess.TimeoutExpired:
        procs_diag()
        raise Failure(f"host C: cove {' '.join(args)[:120]} timed out after {timeout} s")
    return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")


def sdk_connect(env, name):
    """cove.Sandbox.connect(NAME) in a fresh Python with ENV (the SDK from /work/sdk, cove from
    /work/cove): [error class, status, message, detail] of what it raised, or None."""
    code = ("import json, sys, cove\n"
            "try:\n    cove.Sandbox.connect(sys.argv[1])\n    print('null')\n"
            "except cove.CoveError as e:\n"
            "    print(json.dumps([type(e).__name__, e.status, e.message,\n"
            "                      getattr(e, 'detail', None)]))\n")
    r = subprocess.run([sys.executable, "-c", code, name], capture_output=True, timeout=900,
                       env=dict(env, PYTHONPATH="/work/sdk", COVE=COVE))
    check(r.returncode == 0, f"the SDK's connect of {name}: rc={r.returncode} "
          f"{r.stderr.decode(errors='replace')[-800:]!r}")
    return json.loads(r.stdout)


def procs_of(pred):
    """Pids whose command line (NUL-separated args) satisfies pred."""
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if pred([a.decode(errors="replace") for a in args]):
                out.append(int(p))
    return out


def descendants(pid):
    kids = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(p))
    out, todo = [], [pid]
    while todo:
        q = todo.pop()
        out.append(q)
        todo += kids.get(q, [])
    return out


def local_commit(name):
    """The newest commit of NAME's chain on host B (generation files, else chain.json's)."""
    d = os.path.join(STATE, name, "chain")
    best = 0
    for f in os.listdir(d) if os.path.isdir(d) else []:
        m = re.fullmatch(r"chain\.(\d{10})\.json", f)
        if m:
            best = max(best, int(m.group(1)))
    try:
        best = max(best, int(json.load(open(os.path.join(d, "chain.json"))).get("generation", 0)))
    except (OSError, ValueError):
        pass
    return best


def uploaded_commit(name):
    """The newest commit of NAME its follower has committed to the store (its store.log)."""
    found = re.findall(r"commit (\d+) is generation (\d+)", tail(os.path.join(STATE, name,
                                                                            "store.log"), 20000))
    return max((int(c) for c, g in found), default=0)


def gens_disk(n):
    """x writes its disk every interval: its chain must commit n times in n intervals (past the
    15 frozen layers a disk once held: they are merged as they go, devices/OVERLAY.md), and the
    store must follow. The follower uploads the newest commit each time; a box slower to upload
    than to snapshot (QEMU TCG emulates AES and SHA for every byte) sends several commits as one
    generation, then catches up: that is checked, not one generation per commit."""
    c0, g0, t0 = local_commit("x"), newest("x"), time.monotonic()
    deadline = t0 + n * 3 * 4
    c = c0
    while c < c0 + n and time.monotonic() < deadline:
        time.sleep(1)
        c = local_commit("x")
    took = time.monotonic() - t0
    if c < c0 + n or os.environ.get("STORE_BOX_DIAG"):
        for f in ("store.log", "events.jsonl", "vmm.log"):
            print(f"  x/{f}: {tail(os.path.join(STATE, 'x', f), 2500)!r}", flush=True)
    check(c >= c0 + n, f"x: only {c - c0} commits in {took:.0f} s (a 3 s interval)")
    t1 = time.monotonic()
    while uploaded_commit("x") < c0 + n and time.monotonic() - t1 < 600:
        time.sleep(1)
    caught = time.monotonic() - t1
    up, g = uploaded_commit("x"), newest("x")
    check(up >= c0 + n, f"x: the store has commit {up} of the chain's {c0 + n} after "
          f"{caught:.0f} s: {tail(os.path.join(STATE, 'x', 'store.log'), 1500)!r}")
    OUT["disk_generations"] = {"commits": c - c0, "seconds": round(took, 1),
                               "generations": g - g0, "store_caught_up_s": round(caught, 1)}
    print(f"  x writing its disk every second at a 3 s interval: {c - c0} commits in {took:.1f} s "
          f"({took / 3:.1f} intervals); the store had commit {up} {caught:.1f} s later, as "
          f"generations {g0 + 1}..{g}", flush=True)


def lease_checks():
    """One host runs a sandbox (issue 30): host B runs x; host C (a state root and store.json
    of its own, host id host-c) is refused while B's lease holds; every process of host B's x
    is killed with kill -9 and its directory removed; C takes over once the lease expires."""
    create("x", "--snapshot-every", "3s")
    # A counter in RAM every second (renamed into place: a reader never sees it empty), and a
    # new block of its disk written and synced each time.
    rc, out, err, t = cove("exec", "x", "--detach", "--", "sh", "-c",
                           "mkdir -p /ram && mount -t tmpfs tmpfs /ram && i=0; "
                           "while :; do i=$((i+1)); echo $i > /ram/n.t; mv /ram/n.t /ram/n; "
                           "dd if=/dev/urandom of=/disk-$((i % 50)) bs=64k count=1 2>/dev/null; "
                           "sync; sleep 1; done")
    check(rc == 0, f"x: the counter: rc={rc} {err!r}")
    # Host C asks at once (x has no generation in the store yet: the lease answers), and again
    # once x's periodic snapshots are in the store (C fetches it, and the lease refuses).
    for when in ("before its first generation", "after its periodic generations"):
        rc, out, err = cove_c("exec", "x", "--", "cat", "/ram/n")
        lines = err.strip().splitlines()
        held = json.loads(lines[0]) if len(lines) == 1 and lines[0].startswith("{") else None
        check(rc == 75 and held and held["error"] == "held" and held["host"] == "host-b",
              f"host C's exec of x while host B runs it ({when}): rc={rc} {err!r}")
        rc, out, err2 = cove_c("ls", "--json")
        st_c = ({e["name"]: e["state"] for e in json.loads(out)["sandboxes"]}
                if rc == 0 else {})
        check(st_c.get("x") in ("remote", "stopped"), f"x on host C: {st_c} {err2!r}")
        OUT["held"] = held
        print(f"  host C, while host B runs x ({when}): exit 75, {err.strip()}", flush=True)
        # The SDK on host C: Sandbox.connect (cove start) raises HeldElsewhere with cove's own
        # line, whether host C has a copy of x or not.
        got = sdk_connect(HOST_C, "x")
        check(got and got[0] == "HeldElsewhere" and got[1] == 75 and
              isinstance(got[3], dict) and got[3].get("host") == "host-b" and
              got[3].get("sandbox") == "x",
              f"the SDK on host C while host B runs x ({when}): {got}")
        print(f"  the SDK on host C ({when}): cove.Sandbox.connect('x') raised HeldElsewhere "
              f"(status 75, held by {got[3]['host']})", flush=True)
        if when.startswith("before"):
            gens_disk(int(os.environ.get("STORE_BOX_GENS", "18")))
    rc, out, err, t = cove("exec", "x", "--", "cat", "/ram/n")
    check(rc == 0, f"x on host B: rc={rc} {err!r}")
    n_kill = int(out.strip())
    with open(os.path.join(STATE, "x", "vmm.lock")) as f:
        waiter = int(f.read().strip() or 0)
    victims = set(descendants(waiter)) if waiter > 0 else set()
    victims |= set(procs_of(lambda a: len(a) > 2 and a[0].endswith("cove-store") and
                            a[1] == "follow" and a[2] == "x"))
    try:
        expires_ms = json.load(open(os.path.join(STATE, "x", "store-lease.json")))["expires_ms"]
    except (OSError, ValueError, KeyError):
        expires_ms = 0
    for p in victims:
        try:
            os.kill(p, 9)
        except ProcessLookupError:
            pass
    t_kill = time.monotonic()
    wall_kill = time.time()
    time.sleep(0.5)
    shutil.rmtree(os.path.join(STATE, "x"), ignore_errors=True)
    g_kill = newest("x")  # host B's follower is dead: nothing commits x now
    print(f"  host B died: kill -9 of {len(victims)} processes (VMM, jail, lease keeper), "
          f"its copy of x removed; the counter was {n_kill}, generation {g_kill} the newest",
          flush=True)
    refusals = 0
    while True:
        rc, out, err = cove_c("exec", "x", "--", "cat", "/ram/n")
        if rc != 75:
            break
        refusals += 1
        check(time.monotonic() - t_kill < 180, "host C never took x over")
        time.sleep(1)
    took = time.monotonic() - t_kill
    if rc != 0:
        for d in ("/tmp/hc-state/x", "/tmp/hc-state/x/chain"):
            print(f"  {d}: {sorted(os.listdir(d)) if os.path.isdir(d) else '-'}")
        print("  chain.json: " + tail("/tmp/hc-state/x/chain/chain.json", 3000))
        print("  vmm.log: " + tail("/tmp/hc-state/x/vmm.log", 2000))
    check(rc == 0, f"host C's takeover of x: rc={rc} {err!r}")
    n_after = int(out.strip())
    lost = n_kill - n_after
    # What is checked: C restored the newest generation committed before the kill, and
    # committed the next one under its own lease before the guest ran. How much work that
    # loses (the interval plus the upload time: a figure, not a check, since it grows with the
    # machine's load) is reported.
    with open("/tmp/hc-state/x/events.jsonl") as f:
        why = [json.loads(l).get("cause", "") for l in f if l.endswith("\n")]
    check(f"fetched generation {g_kill} from the store" in why,
          f"host C did not restore x's newest generation {g_kill}: {why}")
    check(newest("x") > g_kill, f"host C's takeover committed no generation after {g_kill}")
    check(0 <= lost, f"x restored on host C has counter {n_after}, above {n_kill} at the kill")
    # The lease B's keeper last wrote expired this long after the kill (+ the allowed skew).
    expiry_s = max(0.0, expires_ms / 1000 - wall_kill) if expires_ms else None
    OUT["takeover"] = {"after_kill_s": round(took, 1), "refused_first": refusals,
                       "lease_expiry_after_kill_s": None if expiry_s is None else
                       round(expiry_s, 1),
                       "counter_at_kill": n_kill, "counter_restored": n_after,
                       "work_lost_s": lost, "interval_s": 3}
    print(f"  host C took x over {took:.1f} s after the kill ({refusals} refusals while the "
          f"lease held), from generation {g_kill}: counter {n_after} restored, {n_kill} at the "
          f"kill: {lost} s of work lost (interval 3 s; the issue's goal: <= 13 s)", flush=True)
    rc, out, err = cove_c("stop", "x")
    check(rc == 0, f"cove stop x on host C: rc={rc} {err!r}")


def fg_diag():
    """What every process in the box is doing, and fg's logs (a hang under cove up)."""
    procs_diag()
    for f in ("events.jsonl", "vmm.log", "store.log"):
        print(f"  fg/{f}: {tail(os.path.join(STATE, 'fg', f), 1200)!r}", flush=True)


def procs_diag():
    """What every process in the box is doing (a hang)."""
    for pid in procs_of(lambda a: bool(a)):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")[:150]
            wchan = open(f"/proc/{pid}/wchan").read()
            stat = open(f"/proc/{pid}/stat").read().split()[2]
            print(f"    {pid} {stat} {wchan} {cmd.decode(errors='replace')}", flush=True)
        except OSError:
            pass


def foreground_checks():
    """What a scheduler's task does (docs/SCHEDULERS.md): `cove up fg` in the foreground, work
    done in the sandbox, SIGTERM; exit 0 once the final generation is committed and the lease
    released, so another host (C) takes the sandbox up at once with the work in it."""
    create("fg", "--snapshot-every", "off")
    rc, out, err, t = cove("stop", "fg")
    check(rc == 0, f"cove stop fg: rc={rc} {err!r}")
    g0 = newest("fg")
    print(f"  cove stop fg: {t:.1f} s, generation {g0} committed; cove up fg", flush=True)
    t0 = time.monotonic()
    p = subprocess.Popen([COVE, os.environ.get("COVE_FG_CMD", "up"), "fg"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    # Its first line once the guest answers (read without blocking: a hang is reported).
    first, buf, fd = "", b"", p.stdout.fileno()
    for i in range(60):
        if i and i % 10 == 0:
            print(f"  (cove up fg: no line after {i} s)", flush=True)
        r, _, _ = select.select([fd], [], [], 1)
        if r:
            d = os.read(fd, 4096)
            buf += d
            if b"\n" in buf or not d:
                first = buf.decode(errors="replace").split("\n")[0].strip()
                break
        if p.poll() is not None:
            break
    if not first:
        print(f"  cove up fg: partial output {buf!r}", flush=True)
        fg_diag()
        p.kill()
    up_s = time.monotonic() - t0
    if "running" not in first:
        p.kill()
        raise Failure(f"cove up fg: {first!r}; stderr {p.stderr.read()[-800:]!r}")
    print(f"  cove up fg: {first!r}", flush=True)
    try:
        rc, out, err, t = sh("fg", "echo fg-work > /fg-file && sync", timeout=40)
    except Failure:
        fg_diag()
        raise
    check(rc == 0, f"exec in fg under cove up: rc={rc} {err!r}")
    t0 = time.monotonic()
    p.send_signal(15)
    try:
        out, err = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        p.kill()
        raise Failure("cove up fg: no exit within 300 s of SIGTERM")
    term_s = time.monotonic() - t0
    check(p.returncode == 0, f"cove up fg after SIGTERM: exit {p.returncode}, {out!r} {err!r}")
    g1 = newest("fg")
    check(g1 > g0, f"cove up fg: no generation committed after SIGTERM ({g0} -> {g1})")
    OUT["foreground"] = {"up_s": round(up_s, 1), "sigterm_to_exit_s": round(term_s, 1),
                         "generation": g1}
    print(f"  cove up fg: running in {up_s:.1f} s; SIGTERM to exit 0 in {term_s:.1f} s "
          f"(generation {g0} -> {g1} committed, lease released)", flush=True)
    rc, out, err = cove_c("exec", "fg", "--", "cat", "/fg-file")
    check(rc == 0 and out.strip() == "fg-work",
          f"host C right after cove up's exit: rc={rc} {out!r} {err!r}")
    print("  host C exec'd fg at once (no lease to wait for): the work is there", flush=True)
    rc, out, err = cove_c("stop", "fg")
    check(rc == 0, f"cove stop fg on host C: rc={rc} {out!r} {err!r}")


def api_state(sock):
    """The VM's state from its API socket (GET /vm), or None when it does not answer."""
    import socket
    try:
        with socket.socket(socket.AF_UNIX) as c:
            c.settimeout(5)
            c.connect(sock)
            c.sendall(b"GET /vm HTTP/1.1\r\nHost: cove\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                d = c.recv(65536)
                if not d:
                    break
                data += d
        return json.loads(data.split(b"\r\n\r\n", 1)[1]).get("state")
    except (OSError, ValueError, IndexError):
        return None


def store_reachable(port):
    """A TLS handshake with the store through 10.0.2.100:PORT completes."""
    import socket
    import ssl
    ctx = ssl.create_default_context(cafile="/work/store/ca.pem")
    ctx.check_hostname = False
    try:
        with socket.create_connection(("10.0.2.100", port), timeout=5) as raw:
            with ctx.wrap_socket(raw):
                return True
    except (OSError, ssl.SSLError):
        return False


def takeover_diag():
    """Lines on host B's y while a takeover exec waits: its VMM threads' state and wait
    channel, its API state, its event log, its keeper's lines other than commits and the end of
    its guest console."""
    lines = []
    try:
        with open(os.path.join(STATE, "y", "vmm.lock")) as f:
            vpid = int(f.read().split()[0])
        for p in descendants(vpid):
            for task in os.listdir(f"/proc/{p}/task"):
                try:
                    with open(f"/proc/{p}/task/{task}/comm") as f:
                        comm = f.read().strip()
                    with open(f"/proc/{p}/task/{task}/wchan") as f:
                        wchan = f.read().strip()
                    with open(f"/proc/{p}/task/{task}/stat") as f:
                        stt = f.read().rsplit(")", 1)[1].split()
                    lines.append(f"thread {p}/{task} {comm} {stt[0]} {wchan} "
                                 f"utime {stt[11]} stime {stt[12]}")
                except OSError:
                    pass
    except (OSError, ValueError, IndexError) as e:
        lines.append(f"no VMM: {e}")
    lines.append(f"API state {api_state(os.path.join(RUN, 'y', 'api.sock'))!r}")
    lines.append(f"events {tail(os.path.join(STATE, 'y', 'events.jsonl'), 1200)!r}")
    try:
        with open(os.path.join(STATE, "y", "store.log"), errors="replace") as f:
            lines.append(f"keeper {[l.rstrip() for l in f if ' is generation ' not in l][-20:]}")
    except OSError as e:
        lines.append(f"keeper: {e}")
    lines.append(f"vmm.log {tail(os.path.join(STATE, 'y', 'vmm.log'), 1500)!r}")
    lines.append(f"console {tail(os.path.join(STATE, 'y', 'console.log'), 3000)!r}")
    return lines


def partition_checks():
    """A host cut off from the store (issue 30): host C runs y; its relay to the store is cut
    (the host side does it when host B asks by a marked GET); C's VM must pause before its lease
    can expire; host B takes y over once it has and the guest goes on; the relay heals: C's VM
    ends, and its late push of what it snapshotted after the cut is refused."""
    cport = int(json.load(open(HOST_C["COVE_STORE"]))["endpoint"].rsplit(":", 1)[1])
    rc, out, err = cove_c("create", "y", "--cold", "--snapshot-every", "3s")
    check(rc == 0, f"cove create y on host C: rc={rc} {err!r}")
    rc, out, err = cove_c("exec", "y", "--detach", "--", "sh", "-c",
                          "mkdir -p /ram && mount -t tmpfs tmpfs /ram && i=0; "
                          "while :; do i=$((i+1)); echo $i > /ram/n.t; mv /ram/n.t /ram/n; "
                          "sleep 1; done")
    check(rc == 0, f"y: the counter: rc={rc} {err!r}")
    # A generation whose snapshot was surely taken after the counter began: two past the one
    # the store had then (the next may hold a snapshot paused before the exec returned; a
    # loaded machine's follower can lag several intervals behind).
    g0 = newest("y")
    deadline = time.monotonic() + 180
    while newest("y") < max(g0 + 2, 2) and time.monotonic() < deadline:
        time.sleep(1)
    check(newest("y") >= max(g0 + 2, 2),
          f"y: no periodic generation past {g0} from host C in 180 s")
    lease = json.load(open("/tmp/hc-state/y/store-lease.json")) \
        if os.path.exists("/tmp/hc-state/y/store-lease.json") else {}
    rc, out, err = cove_c("exec", "y", "--", "cat", "/ram/n")
    check(rc == 0, f"y on host C: rc={rc} {err!r}")
    n_before, t_before = int(out.strip()), time.monotonic()
    log_mark("cut-c")
    t0 = time.monotonic()
    while store_reachable(cport) and time.monotonic() - t0 < 30:
        time.sleep(0.2)
    t_cut = time.monotonic()
    check(not store_reachable(cport), "host C's relay was not cut within 30 s of asking")
    gen_at_cut = newest("y")
    log = "/tmp/hc-state/y/store.log"
    # What the keeper logged since the cut, whole: its retries' warnings can push a line out of
    # any tail within seconds on a loaded machine.
    log_off = os.path.getsize(log) if os.path.exists(log) else 0

    def since_cut():
        try:
            with open(log, errors="replace") as f:
                f.seek(log_off)
                return f.read()
        except OSError as e:
            return f"({e})"
    api = [os.path.join(d, "api.sock") for d in ("/tmp/hc-run/y",) if os.path.isdir(d)]
    paused_at = None
    while time.monotonic() - t_cut < 30 and paused_at is None:
        if "VM paused" in since_cut():
            paused_at = time.monotonic()
        time.sleep(0.2)
    check(paused_at is not None, f"host C's VM of y did not pause within 30 s of the cut: "
          f"{[l for l in since_cut().splitlines() if 'retry' not in l][-8:]!r}")
    # LEASE.md rule 2: asked for before the expiry (at expiry - skew - 3 s), and carried out
    # before another host may take over (expiry + skew: 1 s here), however loaded the box.
    m = re.findall(r"expires in (-?\d+) ms: VM paused \(asked (-?\d+) ms before expiry\)",
                   since_cut())
    check(m and int(m[-1][1]) > 0, f"host C asked for y's pause after its lease expired: {m}")
    check(int(m[-1][0]) > -1000, f"host C's VM of y was paused after another host could take "
          f"it over (expiry + 1 s skew): {m}")
    def paused_state():
        """"Paused" by the API, or "SIGSTOP" when the keeper's backstop stopped every VMM
        process of y (its API cannot answer then): LEASE.md, renew."""
        if "stopped (SIGSTOP) instead" not in since_cut():
            return api_state(api[0]) if api else None
        # The process vmm.lock names (a jailed VMM's waiter) and its descendants.
        try:
            with open("/tmp/hc-state/y/vmm.lock") as f:
                vmms = [int(f.read().split()[0])]
        except (OSError, ValueError, IndexError) as e:
            return f"no VMM pid in vmm.lock: {e}"
        for pid in vmms:
            for task in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") \
                    else []:
                try:
                    with open(f"/proc/{pid}/task/{task}/children") as f:
                        vmms += [int(c) for c in f.read().split() if int(c) not in vmms]
                except OSError:
                    pass
        states = []
        for pid in vmms:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                states.append("gone")
        return "SIGSTOP" if all(x == "T" for x in states) else f"stopped? {vmms} {states}"

    st = paused_state()
    check(st in ("Paused", "SIGSTOP"), f"host C's y: its API says {st!r}")
    # A command on host C meanwhile must not resume it: its lease is in doubt.
    rc, out, err = cove_c("exec", "y", "--", "cat", "/ram/n", timeout=120)
    doubt = err.strip().splitlines()[-1] if err.strip() else ""
    check(rc == 75 and '"lease-in-doubt"' in doubt,
          f"cove exec y on host C while its lease is in doubt: rc={rc} {out!r} {err!r}")
    st2 = paused_state()
    check(st2 == st, f"host C's y after a refused exec: {st2!r} (before: {st!r})")
    print(f"  cove exec y on host C meanwhile: exit 75, {doubt}; the VM stays paused",
          flush=True)
    print(f"  host C cut off {t_cut - t0:.1f} s after asking; its VM paused "
          f"{paused_at - t_cut:.1f} s after the cut: asked {int(m[-1][1])} ms and done "
          f"{int(m[-1][0])} ms before its lease expired (paused: {st})", flush=True)
    # Host B takes y over once the lease has expired.
    refusals, diag = 0, []
    while True:
        with concurrent.futures.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(sh, "y", "cat /ram/n")
            try:
                rc, out, err, t = fut.result(timeout=90)
            except concurrent.futures.TimeoutError:
                # A takeover exec still waiting after 90 s (it failed so three runs in a row
                # on 2026-12-07): what B's VM does while it waits, not after it gave up.
                diag = takeover_diag()
                rc, out, err, t = fut.result()
        if rc != 75 or time.monotonic() - t_cut > 180:
            break
        refusals += 1
        time.sleep(1)
    took = time.monotonic() - t_cut
    for line in diag if rc != 0 else []:
        print(f"  y on host B, 90 s into the takeover exec: {line}", flush=True)
    check(rc == 0, f"host B's takeover of y: rc={rc} {err!r}; vmm.log "
          f"{tail(os.path.join(STATE, 'y', 'vmm.log'))!r}; store.log "
          f"{tail(os.path.join(STATE, 'y', 'store.log'), 1500)!r}")
    n_b, t_take = int(out.strip()), t
    # Nothing C did after the cut is in what B restored: B fetched a generation the store had
    # at the cut (C cannot push once cut off), and the counter B read is at most C's before the
    # cut plus the seconds until the cut, plus the seconds B's guest can have run before the
    # read (at most the whole takeover exec: a loaded box took 13 s there once).
    with open(os.path.join(STATE, "y", "events.jsonl")) as f:
        why = [json.loads(l).get("cause", "") for l in f if l.endswith("\n")]
    fetched = [int(m.group(1)) for w in why
               for m in [re.match(r"fetched generation (\d+) from the store", w)] if m]
    check(fetched and fetched[-1] <= gen_at_cut,
          f"host B restored y from generation {fetched} (the store had {gen_at_cut} at the cut)")
    bound = n_before + int(t_cut - t_before) + 2 + int(t_take + 1)
    check(n_b <= bound, f"y on host B: counter {n_b}, host C's was {n_before} "
          f"{t_cut - t_before:.1f} s before the cut, B's takeover exec took {t_take:.1f} s")
    time.sleep(3)
    rc, out, err, t = sh("y", "cat /ram/n")
    check(rc == 0 and int(out.strip()) > n_b, f"y on host B does not go on: {out!r} {err!r}")
    print(f"  host B took y over {took:.1f} s after the cut ({refusals} refusals while C's lease "
          f"held), from generation {fetched[-1]}: counter {n_b} (C's was {n_before} just before "
          f"the cut; the exec took {t_take:.1f} s), then "
          f"{out.strip()}: the guest goes on", flush=True)
    # The relay comes back: C learns the lease moved on and ends its VM. Its VMM now: the
    # process vmm.lock names, alive and holding the lock before the heal.
    try:
        with open("/tmp/hc-state/y/vmm.lock") as f:
            c_vmm = int(f.read().split()[0])
    except (OSError, ValueError, IndexError) as e:
        raise Failure(f"host C's y: no VMM pid in vmm.lock before the heal: {e}")
    check(os.path.exists(f"/proc/{c_vmm}") and vmm_lock_held("/tmp/hc-state/y/vmm.lock"),
          f"host C's VMM of y (pid {c_vmm}) is not running before the heal")
    log_mark("heal-c")
    t1 = time.monotonic()
    while not store_reachable(cport) and time.monotonic() - t1 < 30:
        time.sleep(0.2)
    ended = None
    while time.monotonic() - t1 < 60 and ended is None:
        if "ending this host's VM" in since_cut():
            ended = time.monotonic() - t1
        time.sleep(0.2)
    check(ended is not None, f"host C's VM of y was not ended after the heal: "
          f"{[l for l in since_cut().splitlines() if 'retry' not in l][-8:]!r}")
    def c_vmm_alive():
        try:
            with open(f"/proc/{c_vmm}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    t2 = time.monotonic()
    while (c_vmm_alive() or vmm_lock_held("/tmp/hc-state/y/vmm.lock")) and \
            time.monotonic() - t2 < 10:
        time.sleep(0.2)
    check(not c_vmm_alive() and not vmm_lock_held("/tmp/hc-state/y/vmm.lock"),
          f"host C's VMM of y (pid {c_vmm}) still runs, or its vmm.lock is still held")
    rc, out, err, t = cove("stop", "y")
    check(rc == 0, f"cove stop y on host B: rc={rc} {err!r}")
    # A late push of C's copy (its chain may hold snapshots taken after the cut) is refused,
    # and commits nothing.
    g_before = newest("y")
    r = subprocess.run([STORE_BIN, "push", "y"], capture_output=True, env=HOST_C, timeout=300)
    perr = r.stderr.decode(errors="replace").strip() or "(no message)"
    check(r.returncode != 0 and "lease moved on" in perr and newest("y") == g_before,
          f"host C's late push of y: rc={r.returncode} {perr!r}")
    print(f"  the relay healed: host C ended its VM {ended:.1f} s later; its late push was "
          f"refused: {perr.splitlines()[-1]}", flush=True)
    OUT["partition"] = {"epoch_c": lease.get("epoch", 0), "gen_at_cut": gen_at_cut,
                        "pause_after_cut_s": round(paused_at - t_cut, 1),
                        "pause_asked_before_expiry_ms": int(m[-1][1]),
                        "pause_before_expiry_ms": int(m[-1][0]),
                        "takeover_after_cut_s": round(took, 1), "counter_c": n_before,
                        "counter_b": n_b}


def vmm_lock_held(path):
    """A VMM holds its sandbox's vmm.lock exclusively for its life (lifecycle/lock.c)."""
    import fcntl
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def race_checks():
    """20 `cove exec fg` at once, 10 on host B and 10 on host C, for a sandbox that runs nowhere
    (both hosts have a stopped copy, the store the newest): one host's lease write lands, its
    execs answer; the other host's exit 75 naming the winner (they neither forward nor retry,
    docs/SCHEDULERS.md). One VMM runs."""
    def one(i):
        env = ENV if i % 2 == 0 else HOST_C
        r = subprocess.run([COVE, "exec", "fg", "--", "sh", "-c", f"cat /fg-file; echo n={i}"],
                           capture_output=True, timeout=600, env=env)
        return ("host-b" if i % 2 == 0 else "host-c", r.returncode,
                r.stdout.decode(errors="replace").split(), r.stderr.decode(errors="replace"))
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(20) as ex:
        res = list(ex.map(one, range(20)))
    took = time.monotonic() - t0
    won = {h for h, rc, out, err in res if rc == 0}

    def verdict(ok, what):
        """A failed check prints every exec's result and both hosts' lease, events and store
        log first: a race lost under load is read from them, not guessed."""
        if ok:
            return
        for i, (h, rc, out, err) in enumerate(res):
            print(f"  exec {i} on {h}: rc={rc} out={out} err={err[-300:]!r}", flush=True)
        for root in (STATE, "/tmp/hc-state"):
            for f in ("store-lease.json", "events.jsonl", "store.log"):
                p = os.path.join(root, "fg", f)
                if os.path.exists(p):
                    print(f"  {p}: {tail(p, 3000)!r}", flush=True)
        check(False, what)
    verdict(len(won) == 1, f"fg: execs answered on {sorted(won) or 'no host'}")
    winner = won.pop()
    for i, (h, rc, out, err) in enumerate(res):
        if h == winner:
            verdict(rc == 0 and out == ["fg-work", f"n={i}"],
                    f"exec {i} on {h}: {rc} {out} {err!r}")
        else:
            lines = err.strip().splitlines()
            held = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
            verdict(rc == 75 and held.get("host") == winner,
                    f"exec {i} on {h} (the loser): rc={rc} {err!r}")
    running = [h for h, root in (("host-b", STATE), ("host-c", "/tmp/hc-state"))
               if vmm_lock_held(os.path.join(root, "fg", "vmm.lock"))]
    verdict(running == [winner], f"fg: a VMM runs on {running}, the lease is {winner}'s")
    print(f"  20 execs of fg at once on hosts B and C: {winner} won the lease and answered its "
          f"10, the other host's 10 exited 75 naming it, in {took:.1f} s; one VMM runs "
          f"({winner}'s)", flush=True)
    OUT["race"] = {"winner": winner, "seconds": round(took, 1)}
    rc, out, err = (cove_c if winner == "host-c" else
                    lambda *a: cove(*a)[:3])("stop", "fg")
    check(rc == 0, f"cove stop fg on {winner}: rc={rc} {err!r}")


def prom_samples(text):
    """{(name, frozenset(labels)): value} of Prometheus text, comments skipped."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r'([a-z_]+)(?:\{(.*)\})? (\S+)', line)
        check(m is not None, f"cove metrics: a line that is not a sample: {line!r}")
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def metrics_checks():
    """`cove metrics` (issue 30) with host B's sandboxes in every state a host with a store
    keeps (archived and removed ones live only in the store): s1 running, s3 paused, y crashed
    (its VMM killed), fg stopped. The file goes to the host, whose Prometheus scrapes it
    through node-exporter's textfile collector (store_e2e.py)."""
    for name in ("s1", "s3", "y"):
        rc, out, err, t = cove("start", name)
        check(rc == 0, f"cove start {name} for the metrics: rc={rc} {err!r}")
    rc, out, err, t = cove("pause", "s3")
    check(rc == 0, f"cove pause s3: rc={rc} {err!r}")
    with open(os.path.join(STATE, "y", "vmm.lock")) as f:
        pid = int(f.read().split()[0])
    os.kill(pid, 9)
    time.sleep(1)
    rc, out, err, t = cove("ls", "--json")
    states = {e["name"]: e["state"] for e in json.loads(out)["sandboxes"]
              if e["state"] != "remote"}
    check(states.get("s1") == "running" and states.get("s3") == "paused" and
          states.get("y") == "crashed" and states.get("fg") == "stopped",
          f"host B's sandboxes for the metrics: {states}")
    rc, out, err, t = cove("metrics", "--out", "/work/out/cove.prom")
    check(rc == 0, f"cove metrics: rc={rc} {err!r}")
    text = open("/work/out/cove.prom").read()
    m = prom_samples(text)
    want = {}
    for st in states.values():
        want[st] = want.get(st, 0) + 1
    for st in ("creating", "running", "paused", "stopped", "crashed", "archived", "deleted"):
        got = m.get(("cove_sandboxes", frozenset({("state", st)})))
        check(got == want.get(st, 0), f"cove_sandboxes{{state={st}}}: {got}, cove ls: {want}")

    def one(name, sbx):
        return m.get((name, frozenset({("sandbox", sbx)})))
    rss = one("cove_vmm_resident_bytes", "s1")
    check(rss and rss > 1 << 20 and one("cove_vmm_resident_bytes", "fg") is None,
          f"VMM RSS: s1 {rss}, fg {one('cove_vmm_resident_bytes', 'fg')}")
    check((one("cove_store_fetched_bytes_total", "s1") or 0) > 0,
          f"s1 was fetched from the store here: {one('cove_store_fetched_bytes_total', 's1')}")
    check((one("cove_lease_takeovers_total", "y") or 0) >= 1,
          f"host B took y over: {one('cove_lease_takeovers_total', 'y')}")
    check((one("cove_store_commits_total", "fg") or 0) >= 1 and
          one("cove_store_lag_seconds", "fg") is not None,
          f"fg's commits here: {one('cove_store_commits_total', 'fg')}, "
          f"lag {one('cove_store_lag_seconds', 'fg')}")
    OUT["metrics"] = {"states": states, "lines": len(text.splitlines()),
                      "fetched_s1": one("cove_store_fetched_bytes_total", "s1")}
    print(f"  cove metrics: {len(text.splitlines())} lines; sandboxes by state {want}; s1's "
          f"VMM {rss / 2**20:.1f} MiB resident, fetched "
          f"{one('cove_store_fetched_bytes_total', 's1'):.0f} bytes; y taken over "
          f"{one('cove_lease_takeovers_total', 'y'):.0f} time(s)", flush=True)


def run_role(roles, out):
    """Runs the role sys.argv[1] names; what it recorded in `out`, and ok, go to
    /work/out/ROLE.json for the host side. The exit status: 0 when every check held."""
    what = sys.argv[1]
    os.makedirs("/work/out", exist_ok=True)
    try:
        roles[what]()
        ok = True
    except Failure as e:
        print(f"FAIL: host {what}: {e}", flush=True)
        ok = False
    with open(f"/work/out/{what}.json", "w") as f:
        json.dump(dict(out, ok=ok), f)
    return 0 if ok else 1


def main():
    return run_role({"a": host_a, "b": host_b, "lease": lease_checks, "fg": foreground_checks,
                     "partition": partition_checks,
                     "fgrace": lambda: (foreground_checks(), race_checks()),
                     "fgm": lambda: (foreground_checks(), race_checks(), metrics_checks())}, OUT)


if __name__ == "__main__":
    sys.exit(main())
