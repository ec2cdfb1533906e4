#!/usr/bin/env python3
"""The lazy-restore e2e test's part inside the KVM box (tests/e2e/lazy_e2e.py drives it).

One box, two hosts: host A (state root /tmp/cove-state, host id host-a) and host B (its own
state root, run directory and image cache, host id host-b), sharing only the store (a real Ceph
radosgw on the machine's loopback, through the box's forwarded port). usage: lazy_box.py ab

  A: x, a 1 GiB sandbox, gets 192 MiB of random bytes in guest RAM (tmpfs) and their SHA-256;
     z, 512 MiB, gets 160 MiB. Both stop: each stop commits a generation to the store.
  B, empty: `cove exec x -- true` pulls x lazily and answers while most of the chain is still in
     the store (store-lazy.json still there; the bytes fetched so far recorded). Then radosgw is
     killed for 10 s (the host does it on a marked GET) while the guest reads all 192 MiB back:
     the read waits and the SHA-256 matches host A's. The fetch completes; x stops and its next
     start maps the whole copy.
  Templates across hosts (issue 31): A makes template tx (pushed to the store); B, which has
     none, creates tb1 and tb2 --from tx: the first create fetches tx once (its store-stats),
     the second fetches nothing, and both sandboxes' memory layers are hard links of B's copy.
  z on B with a 5 s fetch timeout, radosgw away for 25 s: the reading exec fails, the VM stops
     with one line naming the store, and once radosgw is back the next exec reads z's 160 MiB
     with host A's SHA-256.
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, "/work")
from store_box import COVE, STORE_BIN, check, log_mark, run_role, tail  # noqa: E402

OUT = {}
A = dict(os.environ, COVE_STATE_DIR="/tmp/cove-state", COVE_RUN_DIR="/tmp/cove-run",
         COVE_GUEST_DIR="/work", COVE_STORE="/work/store/store.json")
B = dict(A, COVE_STATE_DIR="/tmp/cove-state-b", COVE_RUN_DIR="/tmp/cove-run-b",
         COVE_STORE="/work/store/store-b.json")


def cove(env, *args, timeout=900):
    t0 = time.monotonic()
    r = subprocess.run([COVE] + list(args), capture_output=True, timeout=timeout, env=env)
    return (r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace"),
            time.monotonic() - t0)


def sh(env, name, script, timeout=900):
    return cove(env, "exec", name, "--", "sh", "-c", script, timeout=timeout)


def sdir(env, name):
    return os.path.join(env["COVE_STATE_DIR"], name)


def fetched(env, name):
    try:
        with open(os.path.join(sdir(env, name), "store-stats.json")) as f:
            return json.load(f).get("fetched_bytes", 0)
    except (OSError, ValueError):
        return 0


def lazy_pending(env, name):
    return os.path.exists(os.path.join(sdir(env, name), "store-lazy.json"))


def store_newest(env, name):
    r = subprocess.run([STORE_BIN, "ls"], capture_output=True, env=env, timeout=120)
    for line in r.stdout.decode().splitlines()[1:]:
        f = line.split()
        if f and f[0] == name:
            return int(f[1])
    return 0


def fill(name, mem, mib):
    rc, out, err, t = cove(A, "create", name, "--cold", "--mem", mem, "--snapshot-every", "off")
    check(rc == 0, f"A: cove create {name}: rc={rc} {err.strip()!r}; vmm.log "
          f"{tail(os.path.join(sdir(A, name), 'vmm.log'))!r}")
    rc, out, err, t = sh(A, name, f"mkdir -p /ram && mount -t tmpfs -o size={mib + 16}m tmpfs "
                         f"/ram && head -c {mib * 1048576} /dev/urandom > /ram/data && "
                         "sha256sum /ram/data")
    check(rc == 0, f"A: {name}: writing {mib} MiB: rc={rc} {err!r}")
    OUT[f"{name}_sum"] = out.split()[0]
    print(f"  A: {name} ({mem}) holds {mib} MiB of random bytes in RAM ({t:.1f} s)", flush=True)
    rc, out, err, t = cove(A, "stop", name)
    check(rc == 0, f"A: cove stop {name}: rc={rc} {err!r}")
    print(f"  A: cove stop {name}: {t:.1f} s (generation committed)", flush=True)


def layers(env, name):
    """The chain's memory layers here: name, apparent size, MiB of data (for the log)."""
    d = os.path.join(sdir(env, name), "chain")
    out = []
    for n in sorted(os.listdir(d)):
        if n.startswith("mem-"):
            st = os.stat(os.path.join(d, n))
            out.append(f"{n}:{st.st_blocks * 512 / 2**20:.0f}MiB")
    return " ".join(out)


def read_sum(env, name, timeout=900):
    return sh(env, name, "sha256sum /ram/data", timeout=timeout)


def templates_ab():
    rc, out, err, t = cove(A, "template", "create", "tx")
    check(rc == 0 and "tx: template pushed to the store" in out,
          f"A: cove template create tx: rc={rc} {out!r} {err[-600:]!r}")
    print(f"  A: cove template create tx: {t:.1f} s, pushed to the store", flush=True)
    tdir = os.path.join(B["COVE_STATE_DIR"], ".templates", "tx")
    check(not os.path.exists(tdir), "B has template tx before any create")
    took, got = [], []
    for n in ("tb1", "tb2"):
        rc, out, err, t = cove(B, "create", n, "--from", "tx", "--snapshot-every", "off")
        check(rc == 0, f"B: cove create {n} --from tx: rc={rc} {out!r} {err[-600:]!r}; vmm.log "
              f"{tail(os.path.join(sdir(B, n), 'vmm.log'))!r}")
        took.append(t)
        with open(os.path.join(tdir, "store-stats.json")) as f:
            got.append(json.load(f).get("fetched_bytes", 0))
        rc, out, err, t = sh(B, n, "hostname")
        check(rc == 0 and out.strip() == n, f"B: exec in {n}: rc={rc} {out!r} {err!r}")
    check(got[0] > 0 and got[1] == got[0],
          f"B: template tx fetched {got[0]} bytes by the first create, {got[1]} after the second")
    chain = os.path.join(tdir, "chain")
    mems = [f for f in os.listdir(chain) if f.startswith("mem-")]
    check(mems, f"B's copy of tx has no memory layer: {os.listdir(chain)}")
    for f in mems:
        ino = os.stat(os.path.join(chain, f)).st_ino
        for n in ("tb1", "tb2"):
            check(os.stat(os.path.join(sdir(B, n), "chain", f)).st_ino == ino,
                  f"B: {n}'s {f} is not the template's file")
    OUT["template_fetched"] = got[0]
    OUT["template_creates_s"] = [round(t, 2) for t in took]
    print(f"  B: cove create tb1, tb2 --from tx (A's template, not on B): {took[0]:.1f} s "
          f"(fetched tx once: {got[0] / 2**20:.1f} MiB), {took[1]:.1f} s (nothing fetched); "
          f"both share B's copy of its memory layers ({', '.join(mems)})", flush=True)
    for n in ("tb1", "tb2"):
        cove(B, "rm", n)


def host_ab():
    templates_ab()
    fill("x", "1G", 192)
    # z's data is large enough that its fetch is still under way after its first exec (with
    # 48 MiB the whole copy sometimes arrived during that exec, and the outage found nothing
    # left to fetch).
    fill("z", "512M", 160)
    # Host A is gone (its copies too: the box's disk is its RAM).
    subprocess.run(["rm", "-rf", A["COVE_STATE_DIR"], A["COVE_RUN_DIR"]], check=True)
    # Host B: nothing of x here. The first exec pulls it and answers before the rest arrives.
    rc, out, err, t = cove(B, "exec", "x", "--", "true")
    got, pending = fetched(B, "x"), lazy_pending(B, "x")
    check(rc == 0, f"B: first cove exec x: rc={rc} {err!r}; vmm.log "
          f"{tail(os.path.join(sdir(B, 'x'), 'vmm.log'))!r}")
    OUT["first_exec_s"] = round(t, 2)
    OUT["fetched_before_first_exec"] = got
    OUT["pending_after_first_exec"] = pending
    OUT["x_gen_b"] = store_newest(B, "x")  # host B's takeover: the files it pulled
    print(f"  B: first cove exec x answered in {t:.1f} s having fetched {got / 2**20:.1f} MiB; "
          f"layers still arriving: {pending}", flush=True)
    check(pending, "B: the copy was whole before the first exec answered")
    # radosgw away for 10 s while the guest reads all of its data back.
    log_mark("bounce-10")
    rc, out, err, t = read_sum(B, "x")
    check(rc == 0, f"B: reading x's data across the outage: rc={rc} {err!r}; vmm.log "
          f"{tail(os.path.join(sdir(B, 'x'), 'vmm.log'))!r}")
    OUT["x_sum_b"] = out.split()[0]
    OUT["read_all_s"] = round(t, 1)
    log = tail(os.path.join(sdir(B, "x"), "store.log"), 200000)
    OUT["retries_logged"] = log.count("tried again")
    print(f"  B: the guest read its 192 MiB back in {t:.1f} s across the outage "
          f"({OUT['retries_logged']} fetch retries logged)", flush=True)
    deadline = time.monotonic() + 600
    while lazy_pending(B, "x") and time.monotonic() < deadline:
        time.sleep(1)
    check(not lazy_pending(B, "x"), f"B: x's fetch never completed: {log[-1500:]!r}")
    OUT["fetched_total"] = fetched(B, "x")
    rc, out, err, t = cove(B, "stop", "x")
    check(rc == 0, f"B: cove stop x: rc={rc} {err!r}")
    print(f"  B: cove stop x: {t:.1f} s; layers {layers(B, 'x')}", flush=True)
    rc, out, err, t = read_sum(B, "x")
    check(rc == 0 and out.split()[0] == OUT["x_sum_b"],
          f"B: x restarted from its whole copy: rc={rc} {out!r} {err!r}")
    OUT["warm_exec_s"] = round(t, 1)
    print(f"  B: x whole ({OUT['fetched_total'] / 2**20:.1f} MiB fetched in all), stopped and "
          f"read back again from the local copy ({t:.1f} s)", flush=True)
    rc, out, err, t = cove(B, "stop", "x")
    print(f"  B: cove stop x again: {t:.1f} s (rc={rc}); layers {layers(B, 'x')}", flush=True)
    # z: a store away past the fetch timeout stops the VM with one line; the next exec works.
    zb = dict(B, COVE_LAZY_FETCH_TIMEOUT_S="5")
    rc, out, err, t = cove(zb, "exec", "z", "--", "true")
    check(rc == 0, f"B: first cove exec z: rc={rc} {err!r}")
    check(lazy_pending(B, "z"), f"B: z's copy was whole after its first exec ({t:.1f} s, "
          f"{fetched(B, 'z') / 2**20:.1f} MiB fetched): nothing left for the outage to stop")
    log_mark("bounce-25")
    rc, out, err, t = read_sum(zb, "z", timeout=300)
    vmm = tail(os.path.join(sdir(B, "z"), "vmm.log"), 20000)
    lines = [l for l in vmm.splitlines() if "could not be fetched from the store" in l]
    OUT["z_failed_rc"] = rc
    OUT["z_stop_line"] = lines[-1] if lines else ""
    check(rc != 0 and len(lines) == 1,
          f"B: z with the store away past its timeout: rc={rc} {out!r}; vmm.log {vmm[-1500:]!r}")
    print(f"  B: z stopped after {t:.1f} s (rc={rc}): {lines[0][:200]}", flush=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if subprocess.run([STORE_BIN, "ls"], env=B, capture_output=True).returncode == 0:
            break
        time.sleep(2)
    rc, out, err, t = read_sum(B, "z")
    check(rc == 0, f"B: z after the store came back: rc={rc} {err!r}; vmm.log "
          f"{tail(os.path.join(sdir(B, 'z'), 'vmm.log'))!r}")
    OUT["z_sum_b"] = out.split()[0]
    print(f"  B: z read back once the store was there again ({t:.1f} s)", flush=True)


def first_exec(env, name):
    rc, out, err, t = cove(env, "exec", name, "--", "true")
    check(rc == 0, f"cove exec {name} ({env['COVE_STATE_DIR']}): rc={rc} {err!r}; vmm.log "
          f"{tail(os.path.join(sdir(env, name), 'vmm.log'))!r}")
    return t


def bench():
    """bench/fleet's reconnect figures: x (1 GiB) touches 100 MiB, stops; a warm host (A, whose
    copy is current) and cold hosts (B: nothing; C: the fleet's images cached, not x; D: as C,
    but every layer fetched whole before the start, COVE_LAZY_PULL=0) reconnect, each timed to
    its first exec answered, in turn, RUNS rounds."""
    runs = int(os.environ.get("LAZY_BENCH_RUNS", "3"))
    fill("w", "256M", 8)  # another sandbox of the same images: host C caches them through it
    C = dict(B, COVE_STATE_DIR="/tmp/cove-state-c", COVE_RUN_DIR="/tmp/cove-run-c",
             COVE_STORE="/work/store/store-c.json")
    first_exec(C, "w")
    cove(C, "stop", "w")
    D = dict(C, COVE_STATE_DIR="/tmp/cove-state-d", COVE_RUN_DIR="/tmp/cove-run-d",
             COVE_LAZY_PULL="0")  # host C's cache, every layer fetched whole before the start
    subprocess.run(["mkdir", "-p", D["COVE_STATE_DIR"]], check=True)
    subprocess.run(["cp", "-a", os.path.join(C["COVE_STATE_DIR"], ".images"),
                    D["COVE_STATE_DIR"]], check=True)
    warm, cold, cold_img, before, before_img, eager = [], [], [], [], [], []
    gens = {}
    for i in range(runs):
        name = f"x{i}"
        fill(name, "1G", 100)
        warm.append(first_exec(A, name))  # host A's copy is the newest: nothing to fetch
        cove(A, "stop", name)
        for env, times, got in ((B, cold, before), (C, cold_img, before_img), (D, eager, [])):
            if env is B:
                subprocess.run(["rm", "-rf", os.path.join(env["COVE_STATE_DIR"], ".images")])
            times.append(first_exec(env, name))
            got.append(fetched(env, name))
            gens.setdefault(name, store_newest(env, name))  # the files the first cold host pulled
            check(got[-1] > 0, f"{name}: no fetch recorded on {env['COVE_STATE_DIR']}")
            # The rest arrives before the next host is timed (no transfer behind its figure).
            deadline = time.monotonic() + 600
            while lazy_pending(env, name) and time.monotonic() < deadline:
                time.sleep(1)
            cove(env, "stop", name)
            subprocess.run(["rm", "-rf", sdir(env, name)])  # the box's disk is its RAM
        subprocess.run(["rm", "-rf", sdir(A, name)])
        print(f"  round {i + 1}: warm {warm[-1]:.2f} s, cold {cold[-1]:.2f} s "
              f"({before[-1] / 2**20:.1f} MiB before the exec), cold with images "
              f"{cold_img[-1]:.2f} s ({before_img[-1] / 2**20:.1f} MiB), the same fetched "
              f"whole first {eager[-1]:.2f} s", flush=True)
    OUT.update(warm_s=warm, cold_s=cold, cold_images_s=cold_img, fetched_before=before,
               fetched_before_images=before_img, cold_images_whole_fetch_s=eager, gens=gens)


def main():
    return run_role({"ab": host_ab, "bench": bench}, OUT)


if __name__ == "__main__":
    sys.exit(main())
