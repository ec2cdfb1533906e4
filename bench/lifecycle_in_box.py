"""Runs inside the KVM box (bench/lifecycle): what a user waits for, to the first byte of
`cove exec NAME -- echo`, for a cold `cove create`, a reconnect to a stopped sandbox and one to
an archived sandbox, at 256 MiB and 1 GiB; beside them, in the same run, the by-hand path
(`cove run` + `cove exec`, `cove restore` + `cove exec`), and at 256 MiB a create from a
template (`--from`, and the warm default from its implicit template), BURST creates from one
template at once, and the PSS per sandbox 60 s after that burst. Writes
/work/out/lifecycle.json."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

COVE = "/work/cove"
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
STATE, RUN = "/tmp/bench-life", "/tmp/bl"
ENV = dict(os.environ, COVE_STATE_DIR=STATE, COVE_RUN_DIR=RUN, COVE_GUEST_DIR="/work")
ROOTFS, BZIMAGE = "/work/rootfs/rootfs.ext4", "/work/kernel/bzImage"
CMDLINE = "console=ttyS0 reboot=k panic=-1 quiet root=/dev/vda rw init=/sbin/cove-init"


def cove(*args, timeout=600):
    r = subprocess.run([COVE] + list(args), capture_output=True, timeout=timeout, env=ENV)
    if r.returncode != 0:
        raise RuntimeError(f"cove {' '.join(args)}: rc={r.returncode} {r.stderr[-400:]!r}")
    return r.stdout


def first_byte(*args):
    """Seconds from now to the first byte `cove exec ARGS` prints."""
    t0 = time.monotonic()
    p = subprocess.Popen([COVE, "exec"] + list(args), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=ENV)
    b = p.stdout.read(1)
    took = time.monotonic() - t0
    rest, err = p.communicate(timeout=600)
    if p.returncode != 0 or not b:
        raise RuntimeError(f"cove exec {args}: rc={p.returncode} {err[-400:]!r}")
    return took


def recopy_layers(name):
    """Rewrites each memory layer of NAME's chain as a fresh copy of itself (same bytes, same
    holes, owner and mode): its pages in the page cache are then new pages. A control for the
    emulator, not a cove feature: QEMU TCG keeps the box's translated guest code keyed by the
    physical page it ran from, so a layer whose pages already ran guest code (a reconnect before)
    starts warm, and a copy of it starts cold, as the first reconnect after a create does."""
    d = os.path.join(STATE, name, "chain")
    for f in sorted(os.listdir(d)):
        if not f.startswith("mem-"):
            continue
        src_path, tmp = os.path.join(d, f), os.path.join(d, f + ".recopy")
        st = os.stat(src_path)
        src = os.open(src_path, os.O_RDONLY)
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        off = 0
        while off < st.st_size:
            try:
                data_at = os.lseek(src, off, os.SEEK_DATA)
            except OSError:
                break
            hole_at = os.lseek(src, data_at, os.SEEK_HOLE)
            while data_at < hole_at:
                chunk = os.pread(src, min(hole_at - data_at, 1 << 20), data_at)
                os.pwrite(dst, chunk, data_at)
                data_at += len(chunk)
            off = hole_at
        os.ftruncate(dst, st.st_size)
        os.fchown(dst, st.st_uid, st.st_gid)
        os.fchmod(dst, st.st_mode & 0o7777)
        os.close(src)
        os.close(dst)
        os.rename(tmp, src_path)


def lifecycle_round(mem, i):
    name = f"b{mem.lower()}-{i}"
    t0 = time.monotonic()
    cove("create", name, "--cold", "--mem", mem, "--snapshot-every", "off")
    cold = time.monotonic() - t0 + first_byte(name, "--", "echo", "x")
    cove("exec", name, "--", "sh", "-c", "dd if=/dev/urandom of=/tmp/fill bs=1M count=16 2>/dev/null")
    cove("stop", name)
    stopped = first_byte(name, "--", "echo", "x")
    # Stopped again: now the chain ends in an increment (what this reconnect wrote), as it does
    # for any sandbox that took a snapshot before its stop (every 60 s by default).
    cove("stop", name)
    again = first_byte(name, "--", "echo", "x")
    # The control: stopped once more, its layers copied to fresh pages, then reconnected.
    cove("stop", name)
    recopy_layers(name)
    recopied = first_byte(name, "--", "echo", "x")
    cove("archive", name)
    archived = first_byte(name, "--", "echo", "x")
    cove("rm", name)
    return cold, stopped, again, recopied, archived


def template_round(mem, tpl, i):
    """A create from template tpl, and a warm default create (its implicit template built
    before the rounds), each to the first byte of an exec."""
    out = []
    for name, opts in ((f"t{mem.lower()}-{i}", ("--from", tpl)),
                       (f"w{mem.lower()}-{i}", ("--mem", mem))):
        t0 = time.monotonic()
        cove("create", name, "--snapshot-every", "off", *opts)
        out.append(time.monotonic() - t0 + first_byte(name, "--", "echo", "x"))
        cove("rm", name)
    return out


def cove_pids():
    """Every process of the sandboxes: cove-vmm, its jail's processes, cove-broker."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0]
        except OSError:
            continue
        if os.path.basename(argv0).startswith(b"cove"):
            pids.append(int(d))
    return pids


def pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def burst(mem, tpl, n):
    """n creates from tpl started at once: wall time, creates/s per box CPU, and 60 s later the
    PSS of every sandbox process (guest RAM included: the VMM maps it) per sandbox."""
    import threading
    names = [f"burst{i:02d}" for i in range(n)]
    errs = []

    def one(nm):
        try:
            cove("create", nm, "--from", tpl, "--snapshot-every", "off")
        except RuntimeError as e:
            errs.append(str(e))

    threads = [threading.Thread(target=one, args=(nm,)) for nm in names]
    t0 = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.monotonic() - t0
    if errs:
        raise RuntimeError(f"{len(errs)} of {n} burst creates failed: {errs[:2]}")
    time.sleep(60)
    pids = cove_pids()
    pss = sum(pss_kib(p) for p in pids)
    for nm in names:
        cove("rm", nm)
    cpus = os.cpu_count() or 1
    return {"n": n, "wall_s": round(wall, 3), "creates_per_s": round(n / wall, 3),
            "box_cpus": cpus, "creates_per_s_per_cpu": round(n / wall / cpus, 3),
            "processes": len(pids), "pss_total_mib": round(pss / 1024, 1),
            "pss_per_sandbox_mib": round(pss / 1024 / n, 2)}


def unjailed_round(mem, i):
    """The same stop and reconnect of a sandbox created --no-jail: what the default jail costs."""
    name = f"n{mem.lower()}-{i}"
    cove("create", name, "--mem", mem, "--snapshot-every", "off", "--no-jail")
    first_byte(name, "--", "echo", "x")
    cove("exec", name, "--", "sh", "-c", "dd if=/dev/urandom of=/tmp/fill bs=1M count=16 2>/dev/null")
    cove("stop", name)
    stopped = first_byte(name, "--", "echo", "x")
    cove("rm", name)
    return stopped


def by_hand_round(mem, i):
    """Today's path: cove run + cove exec --wait; then a snapshot, and cove restore + exec."""
    d = f"/tmp/byhand-{i}"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    uds, api = f"{d}/v.sock", f"{d}/api.sock"
    t0 = time.monotonic()
    p = subprocess.Popen([COVE, "run", "--kernel", BZIMAGE, "--mem", mem, "--cmdline", CMDLINE,
                          "--disk", f"{ROOTFS},overlay={d}/root.ovl", "--vsock-cid", "3",
                          "--vsock-uds", uds, "--api-sock", api, "--track-dirty-pages",
                          "--console", f"{d}/console", "--snapshot-dir", f"{d}/chain"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    boot = time.monotonic() - t0 + first_byte("--wait", "300", uds, "--", "echo", "x")
    subprocess.run([COVE, "snapshot", api, "--full"], capture_output=True, check=True)
    p.kill()
    p.wait()
    uds2 = f"{d}/v2.sock"
    t0 = time.monotonic()
    q = subprocess.Popen([COVE, "restore", f"{d}/chain", "--disk", ROOTFS, "--vsock-cid", "3",
                          "--vsock-uds", uds2, "--console", f"{d}/console2"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    restore = time.monotonic() - t0 + first_byte("--wait", "300", uds2, "--", "echo", "x")
    q.kill()
    q.wait()
    shutil.rmtree(d, ignore_errors=True)
    return boot, restore


def main():
    shutil.rmtree(STATE, ignore_errors=True)
    results = {}
    for mem in ("256M", "1G"):
        rows = {"create_cold_s": [], "reconnect_stopped_s": [], "reconnect_stopped_again_s": [],
                "reconnect_stopped_layers_recopied_s": [], "reconnect_archived_s": [],
                "by_hand_run_exec_s": [], "by_hand_restore_exec_s": [],
                "reconnect_stopped_unjailed_s": []}
        for i in range(RUNS):
            c, s, g, rc, a = lifecycle_round(mem, i)
            b, r = by_hand_round(mem, i)
            u = unjailed_round(mem, i)
            for k, v in zip(rows, (c, s, g, rc, a, b, r, u)):
                rows[k].append(round(v, 3))
            print(f"{mem} round {i}: create {c:.2f} s, stopped {s:.2f} s (unjailed {u:.2f} s), "
                  f"stopped again {g:.2f} s, layers recopied {rc:.2f} s, archived {a:.2f} s; "
                  f"by hand: run {b:.2f} s, restore {r:.2f} s",
                  file=sys.stderr, flush=True)
        med = {k: statistics.median(v) for k, v in rows.items()}
        results[mem] = {"runs": rows, "median": med,
                        "reconnect_over_create": round(med["reconnect_stopped_s"] /
                                                       med["create_cold_s"], 3),
                        "reconnect_again_over_create": round(
                            med["reconnect_stopped_again_s"] / med["create_cold_s"], 3),
                        "recopied_over_again": round(
                            med["reconnect_stopped_layers_recopied_s"] /
                            med["reconnect_stopped_again_s"], 3),
                        "by_hand_restore_over_run": round(med["by_hand_restore_exec_s"] /
                                                          med["by_hand_run_exec_s"], 3),
                        "jailed_over_unjailed_reconnect": round(
                            med["reconnect_stopped_s"] / med["reconnect_stopped_unjailed_s"], 3)}
    # Templates at 256 MiB: an explicit one, and the implicit one the warm default builds.
    t0 = time.monotonic()
    cove("template", "create", "bench-256m", "--mem", "256M")
    tpl_build = time.monotonic() - t0
    t0 = time.monotonic()
    cove("create", "warm-first", "--mem", "256M", "--snapshot-every", "off")
    warm_build = time.monotonic() - t0
    cove("rm", "warm-first")
    trows = {"create_from_template_s": [], "create_warm_default_s": []}
    for i in range(RUNS):
        f, w = template_round("256M", "bench-256m", i)
        trows["create_from_template_s"].append(round(f, 3))
        trows["create_warm_default_s"].append(round(w, 3))
        print(f"256M template round {i}: create --from {f:.2f} s, warm default {w:.2f} s",
              file=sys.stderr, flush=True)
    tmed = {k: statistics.median(v) for k, v in trows.items()}
    b = burst("256M", "bench-256m", int(os.environ.get("BENCH_BURST", "32")))
    print(f"burst: {b}", file=sys.stderr, flush=True)
    m256 = results["256M"]["median"]
    results["templates_256M"] = {"template_create_s": round(tpl_build, 3),
                                 "first_warm_create_s": round(warm_build, 3),
                                 "runs": trows, "median": tmed, "burst": b}
    over_cold = round(tmed["create_from_template_s"] / m256["create_cold_s"], 3)
    over_rec = round(tmed["create_from_template_s"] / m256["reconnect_stopped_s"], 3)
    small, big = results["256M"]["median"], results["1G"]["median"]
    ratio = results["256M"]["reconnect_over_create"]
    growth = round(big["reconnect_stopped_s"] / small["reconnect_stopped_s"], 3)
    out = {"bench": "lifecycle", "runs": RUNS, "results": results,
           "goals": {"stopped_reconnect_over_cold_create_256M":
                     {"value": ratio, "goal": 0.15, "met": ratio <= 0.15,
                      "second_reconnect": results["256M"]["reconnect_again_over_create"],
                      "recopied_over_second": results["256M"]["recopied_over_again"],
                      "note": "value: the first reconnect after a create; second_reconnect: the "
                              "next stop and reconnect; recopied_over_second: a third after its "
                              "layer files were rewritten as copies of themselves (fresh pages, "
                              "cold QEMU TCG translations), over the second (README)"},
                     "reconnect_1G_over_256M": {"value": growth, "goal": 1.3, "met": growth <= 1.3},
                     "create_from_template_over_cold_create_256M":
                     {"value": over_cold, "goal": 0.25, "met": over_cold <= 0.25,
                      "warm_default_over_cold": round(tmed["create_warm_default_s"] /
                                                      m256["create_cold_s"], 3)},
                     "create_from_template_over_first_reconnect_256M":
                     {"value": over_rec, "goal": 1.2, "met": over_rec <= 1.2},
                     "burst_creates_per_s_per_cpu":
                     {"value": b["creates_per_s_per_cpu"], "goal": 8,
                      "met": False,
                      "why_not": "measured in the KVM box, which emulates its CPU (QEMU TCG): "
                                 "a box figure cannot show this goal met; issue 17's "
                                 "launch-burst goal is 8"},
                     "pss_per_sandbox_mib_60s_after_burst":
                     {"value": b["pss_per_sandbox_mib"], "goal": 8,
                      "met": b["pss_per_sandbox_mib"] <= 8}},
           "box_mem_mib": int(os.environ.get("BENCH_BOX_MEM_MIB", "3072"))}
    os.makedirs("/work/out", exist_ok=True)
    with open("/work/out/lifecycle.json", "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out["goals"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
