#!/usr/bin/env python3
"""Runs inside the KVM box (bench/density, issue 17): many sandboxes per host.

Parts (DENSITY_ONLY=launch,idle,memory,boot,pause,balloon; all by default):
  launch   one stopped 256 MiB sandbox, `cove fork BASE c-1..c-N --stopped`, then N concurrent
           `cove exec c-i -- true` (each restores its clone), no pause; wall time until every
           exec answered, failures, box CPU from /proc/stat; then PSS of every clone after
           DENSITY_IDLE_S idle and whether the clones share the layer's pages. Beside it the
           orchestrator path: N concurrent `cove restore` of one chain + `cove exec --wait`.
  idle     16 idle sandboxes (`cove create --snapshot-every off`) vs 16 idle QEMU microvm
           guests, same kernel, command line and root image: utime+stime of the VMM
           processes over DENSITY_IDLE_S, KVM exits per guest per second (debugfs).
  memory   the VMM process of a sandbox with disk, vsock, API socket and one exec session
           open: smaps minus guest RAM, shared objects mapped, private dirty.
  boot     boot_in_box.py's boot-to-ready, cove vs QEMU microvm, bzImage and PVH vmlinux.
  pause    snapshot pause (`cove snapshot --full` / `--diff` after 16 MiB dirtied).
  balloon  /work/balloon_in_box.py when bench/density added it (--with-balloon).
Writes /work/out/density.json; progress on stderr."""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

COVE = "/work/cove"
STATE, RUN = "/tmp/dens-state", "/tmp/dr"
ENV = dict(os.environ, COVE_STATE_DIR=STATE, COVE_RUN_DIR=RUN, COVE_GUEST_DIR="/work")
ROOTFS, BZIMAGE = "/work/rootfs/rootfs.ext4", "/work/kernel/bzImage"
BYHAND_CMDLINE = "console=ttyS0 reboot=k panic=-1 quiet root=/dev/vda rw init=/sbin/cove-init"
ONLY = [p for p in os.environ.get("DENSITY_ONLY", "launch,idle,memory,boot,pause,balloon")
        .split(",") if p]
SIZES = [int(x) for x in os.environ.get("DENSITY_SIZES", "8,16,32").split(",") if x]
IDLE_S = float(os.environ.get("DENSITY_IDLE_S", "60"))
IDLE_N = int(os.environ.get("DENSITY_IDLE_N", "16"))
BOOT_RUNS = int(os.environ.get("DENSITY_BOOT_RUNS", "5"))
PAUSE_RUNS = int(os.environ.get("DENSITY_PAUSE_RUNS", "5"))
ENC_SIZES = [int(x) for x in os.environ.get("DENSITY_ENC_SIZES", "8").split(",")
             if x and x != "none"]
ORCH = os.environ.get("DENSITY_ORCH", "1") == "1"
EXEC_TIMEOUT = 300
TICK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count()
T_START = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - T_START:7.1f}s] density: {msg}", file=sys.stderr, flush=True)


def cove(*args, timeout=600, check=True):
    r = subprocess.run([COVE] + list(args), capture_output=True, timeout=timeout, env=ENV,
                       stdin=subprocess.DEVNULL)
    if check and r.returncode != 0:
        raise RuntimeError(f"cove {' '.join(args)}: rc={r.returncode} "
                           f"{r.stderr.decode(errors='replace')[-400:]}")
    return r


def med(vals):
    vals = [v for v in vals if v is not None]
    return round(statistics.median(vals), 3) if vals else None


def summ(vals, nd=1):
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    return {"median": round(statistics.median(vals), nd), "mean": round(statistics.mean(vals), nd),
            "min": round(min(vals), nd), "max": round(max(vals), nd), "n": len(vals)}


# ------------------------------------------------------------------------------------------
# /proc helpers
# ------------------------------------------------------------------------------------------

def box_cpu():
    """(busy, idle) seconds of the whole box from /proc/stat's cpu line."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    busy = sum(v[:8]) - idle
    return busy / TICK, idle / TICK


def ppid_map():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        ppid = int(s[s.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def tree(pid, kids=None):
    kids = kids if kids is not None else ppid_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def cpu_ticks(pid):
    """(utime + stime, guest_time) of the process (all its threads), in ticks; None when gone.
    guest_time (time in the guest, KVM_RUN) is part of utime: the rest is the VMM's own."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    fields = s[s.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12]), int(fields[40])


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def rollup(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                m = re.match(r"(\w+):\s+(\d+) kB", line)
                if m:
                    out[m.group(1)] = int(m.group(2))
    except OSError:
        return None
    return out


def smaps(pid):
    """[(start, end, perms, path, {field: kB})] of /proc/PID/smaps."""
    maps, cur = [], None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$", line)
                if m:
                    cur = (int(m.group(1), 16), int(m.group(2), 16), m.group(3),
                           m.group(4).strip(), {})
                    maps.append(cur)
                    continue
                m = re.match(r"(\w+):\s+(\d+) kB", line)
                if m and cur:
                    cur[4][m.group(1)] = int(m.group(2))
    except OSError:
        return None
    return maps


def is_guest_ram(mp, guest_bytes):
    """Guest RAM: cove's memfd, a chain's memory layer file, or a mapping of the guest's size."""
    path = mp[3]
    return ("cove-guest-ram" in path or re.search(r"/mem-\d+", path) is not None
            or mp[1] - mp[0] == guest_bytes)


def vmm_of(pid):
    """The process of pid's tree with the largest Rss: the VMM (a jail may put a small waiting
    parent above it)."""
    best, rss = None, -1
    for p in tree(pid):
        r = rollup(p)
        if r and r.get("Rss", 0) > rss:
            best, rss = p, r.get("Rss", 0)
    return best


def sandbox_pid(name):
    try:
        with open(f"{STATE}/{name}/vmm.lock") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


KVM_DEBUG = "/sys/kernel/debug/kvm"


def kvm_debugfs():
    if not os.path.isdir(KVM_DEBUG):
        subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"],
                       capture_output=True)
    return os.path.isdir(KVM_DEBUG)


EXIT_KINDS = ("io_exits", "mmio_exits", "halt_exits", "irq_exits", "signal_exits",
              "request_irq_exits", "irq_window_exits", "halt_wakeup", "insn_emulation")


def kvm_vm_exits(name="exits"):
    """{pid: count} of debugfs counter `name` summed over the VMs each process created
    (debugfs dirs are PID-FD)."""
    out = {}
    if not os.path.isdir(KVM_DEBUG):
        return out
    for d in os.listdir(KVM_DEBUG):
        m = re.match(r"(\d+)-\d+$", d)
        if not m:
            continue
        try:
            with open(f"{KVM_DEBUG}/{d}/{name}") as f:
                out[int(m.group(1))] = out.get(int(m.group(1)), 0) + int(f.read())
        except (OSError, ValueError):
            pass
    return out


def kvm_global(name):
    try:
        with open(f"{KVM_DEBUG}/{name}") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def threads_of(pids):
    """{tid: pid} of every thread of the processes."""
    out = {}
    for p in pids:
        try:
            out.update((int(t), p) for t in os.listdir(f"/proc/{p}/task"))
        except OSError:
            pass
    return out


def thread_cpu_ns(tids):
    """{tid: (ns on a CPU, name)} of the threads ({tid: pid}), from /proc/PID/task/TID/schedstat
    (the scheduler's own count, in ns; /proc/PID/stat's ticks are 10 ms steps, too coarse once
    idle guests stopped waking); the name has a trailing number made N (iou-wrk-N)."""
    out = {}
    for t, p in tids.items():
        try:
            with open(f"/proc/{p}/task/{t}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/{p}/task/{t}/comm") as f:
                name = re.sub(r"\d+$", "N", f.read().strip())
            out[t] = (ns, name)
        except (OSError, ValueError, IndexError):
            pass
    return out


def idle_window(groups, seconds):
    """groups: {label: (pid-list, guests)}. CPU ticks (utime + stime of every thread) and KVM
    exits of each group's processes over `seconds`."""
    def snap():
        exits = kvm_vm_exits()
        kinds = {kind: kvm_vm_exits(kind) for kind in EXIT_KINDS}
        res = {}
        for label, (pids, _) in groups.items():
            tids = threads_of(pids)
            res[label] = {"ticks": [cpu_ticks(p) for p in pids], "ns": thread_cpu_ns(tids),
                          "kinds": {kind: sum(v for k, v in kinds[kind].items() if k in tids)
                                    for kind in EXIT_KINDS},
                          "exits": sum(v for k, v in exits.items() if k in tids),
                          "vms": sum(1 for k in exits if k in tids)}
        return res, kvm_global("exits"), box_cpu()
    a, ga, ca = snap()
    t0 = time.monotonic()
    time.sleep(seconds)
    b, gb, cb = snap()
    dt = time.monotonic() - t0
    out = {"seconds": round(dt, 2), "box_busy_s": round(cb[0] - ca[0], 2),
           "box_kvm_exits_per_s": round((gb - ga) / dt, 1) if ga is not None else None}
    for label, (pids, guests) in groups.items():
        pairs = [(x, y) for x, y in zip(a[label]["ticks"], b[label]["ticks"])
                 if x is not None and y is not None]
        ticks = [y[0] - x[0] for x, y in pairs]
        cpu_s = sum(ticks) / TICK
        na, nb = a[label]["ns"], b[label]["ns"]
        # Threads alive at both ends (one that ended inside the window is not counted).
        whole = [t for t in nb if t in na]
        by_thread = {}
        for t in whole:
            by_thread[nb[t][1]] = by_thread.get(nb[t][1], 0) + (nb[t][0] - na[t][0]) / 1e9
        cpu_ns_s = sum(by_thread.values())
        guest_s = sum(y[1] - x[1] for x, y in pairs) / TICK
        by_comm = {}
        for p, x, y in zip(pids, a[label]["ticks"], b[label]["ticks"]):
            if x is None or y is None:
                continue
            c = comm(p)
            e = by_comm.setdefault(c, {"processes": 0, "cpu_s": 0.0, "guest_s": 0.0})
            e["processes"] += 1
            e["cpu_s"] = round(e["cpu_s"] + (y[0] - x[0]) / TICK, 2)
            e["guest_s"] = round(e["guest_s"] + (y[1] - x[1]) / TICK, 2)
        out[label] = {"guests": guests, "processes": len(pids),
                      "alive_whole_window": len(ticks), "cpu_s_total": round(cpu_s, 2),
                      "cpu_s_schedstat": round(cpu_ns_s, 4),
                      "threads_whole_window": len(whole),
                      "cpu_s_by_thread_name": {k: round(v, 4) for k, v in
                                               sorted(by_thread.items())},
                      "guest_time_s": round(guest_s, 2),
                      "vmm_own_cpu_s": round(cpu_s - guest_s, 2),
                      "cpu_pct_of_one_cpu_total": round(100 * cpu_s / dt, 2),
                      "cpu_ms_per_guest_per_s": round(1000 * cpu_s / dt / max(guests, 1), 3),
                      "kvm_vms_seen": b[label]["vms"], "by_comm": by_comm,
                      "exit_kinds_per_guest_per_s": {
                          k: round((b[label]["kinds"][k] - a[label]["kinds"][k]) / dt
                                   / max(guests, 1), 2) for k in EXIT_KINDS},
                      "exits_per_guest_per_s": (round((b[label]["exits"] - a[label]["exits"])
                                                      / dt / max(guests, 1), 2)
                                                if b[label]["vms"] else None)}
    return out


# ------------------------------------------------------------------------------------------
# launch burst
# ------------------------------------------------------------------------------------------

def run_concurrently(argvs, timeout=EXEC_TIMEOUT):
    """Starts every argv at once; returns (wall s until the last ended, [per-command dict])."""
    res = [None] * len(argvs)
    t0 = time.monotonic()

    def one(i, argv):
        s = time.monotonic()
        try:
            p = subprocess.run(argv, capture_output=True, timeout=timeout, env=ENV,
                               stdin=subprocess.DEVNULL)
            res[i] = {"rc": p.returncode, "s": round(time.monotonic() - s, 3),
                      "err": p.stderr.decode(errors="replace")[-300:] if p.returncode else ""}
        except subprocess.TimeoutExpired:
            res[i] = {"rc": None, "s": timeout, "err": f"timeout after {timeout} s"}
    ths = [threading.Thread(target=one, args=(i, a)) for i, a in enumerate(argvs)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return time.monotonic() - t0, res


def parallel(fn, items, width=8):
    """fn over items, at most `width` at once (set-up and teardown)."""
    items = list(items)
    out = [None] * len(items)
    lock = threading.Lock()
    nxt = [0]

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(items):
                return
            try:
                out[i] = fn(items[i])
            except Exception as e:  # noqa: BLE001 (collected, reported)
                out[i] = e
    ths = [threading.Thread(target=worker) for _ in range(width)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return out


def shared(m):
    return m["Shared_Clean"] + m["Shared_Dirty"]


def clone_memory(names, guest_bytes):
    rows = []
    for n in names:
        pid = sandbox_pid(n)
        if not pid:
            rows.append({"name": n, "error": "no vmm.lock pid"})
            continue
        pids = tree(pid)
        vmm = vmm_of(pid)
        tree_pss = sum((rollup(p) or {}).get("Pss", 0) for p in pids)
        r = rollup(vmm) or {}
        layer = {"Rss": 0, "Pss": 0, "Shared_Clean": 0, "Shared_Dirty": 0, "Private_Clean": 0,
                 "Private_Dirty": 0}
        for mp in smaps(vmm) or []:
            if is_guest_ram(mp, guest_bytes):
                for k in layer:
                    layer[k] += mp[4].get(k, 0)
        rows.append({"name": n, "pid": vmm, "processes": len(pids), "tree_pss_kib": tree_pss,
                     "vmm_pss_kib": r.get("Pss"), "vmm_rss_kib": r.get("Rss"),
                     "vmm_private_dirty_kib": r.get("Private_Dirty"), "guest_ram": layer})
    ok = [x for x in rows if "error" not in x]

    def col(f):
        return [f(x) / 1024 for x in ok]
    out = {"sandboxes": len(rows), "measured": len(ok),
           "pss_mib": summ(col(lambda x: x["tree_pss_kib"]), 2),
           "vmm_only_pss_mib": summ(col(lambda x: x["vmm_pss_kib"]), 2),
           "vmm_rss_mib": summ(col(lambda x: x["vmm_rss_kib"]), 2),
           "guest_ram_rss_mib": summ(col(lambda x: x["guest_ram"]["Rss"]), 2),
           "guest_ram_pss_mib": summ(col(lambda x: x["guest_ram"]["Pss"]), 2),
           "guest_ram_shared_mib": summ(col(lambda x: shared(x["guest_ram"])), 2),
           "guest_ram_private_dirty_mib": summ(col(lambda x: x["guest_ram"]["Private_Dirty"]), 2),
           "errors": [x["error"] for x in rows if "error" in x]}
    # Shared unwritten pages: every clone maps guest-RAM pages that other processes map too
    # (Shared_Clean + Shared_Dirty: the layer files live on the box's tmpfs, whose page-cache
    # pages count as dirty), and the sum of the clones' PSS over guest RAM is well below the sum
    # of their RSS (each shared page counted once over all clones, not once per clone).
    if len(ok) >= 2:
        rss = sum(x["guest_ram"]["Rss"] for x in ok)
        pss = sum(x["guest_ram"]["Pss"] for x in ok)
        every = all(shared(x["guest_ram"]) > 0 for x in ok)
        out["share_unwritten_pages"] = {
            "every_clone_maps_shared_pages": every,
            "guest_ram_pss_over_rss": round(pss / rss, 3) if rss else None,
            "shared": every and rss > 0 and pss < 0.6 * rss}
    out["per_sandbox"] = rows
    return out


def orchestrator_burst(n, chain, run_dir):
    """N concurrent `cove restore CHAIN` (unjailed, each its own snapshot dir, vsock socket and
    CID) and `cove exec --wait` into each at once."""
    procs, argvs = [], []
    for i in range(n):
        d = f"{run_dir}/o{n}-{i}"
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        procs.append(subprocess.Popen(
            [COVE, "restore", chain, "--disk", ROOTFS, "--vsock-cid", str(100 + i),
             "--vsock-uds", f"{d}/v.sock", "--console", f"{d}/console",
             "--snapshot-dir", f"{d}/snap"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(f"{d}/err", "wb"),
            env=ENV))
        argvs.append([COVE, "exec", "--wait", str(EXEC_TIMEOUT), f"{d}/v.sock", "--", "true"])
    t0 = time.monotonic()
    c0 = box_cpu()
    wall, res = run_concurrently(argvs)
    c1 = box_cpu()
    wall = max(wall, time.monotonic() - t0)
    lost = [r for r in res if r["rc"] != 0]
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()
    errs = []
    for i in range(n):
        try:
            with open(f"{run_dir}/o{n}-{i}/err", "rb") as f:
                e = f.read().decode(errors="replace").strip()
            if e:
                errs.append(e[-200:])
        except OSError:
            pass
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"n": n, "wall_s": round(wall, 3), "lost": len(lost),
            "lost_errors": [r["err"] for r in lost][:5],
            "launches_per_s_per_box_cpu": round(n / (wall * NCPU), 3),
            "box_busy_cpu_s": round(c1[0] - c0[0], 2),
            "exec_s": summ([r["s"] for r in res], 3), "vmm_stderr": errs[:5]}


def burst(base, prefix, n, keep_rows):
    """Forks N stopped clones of the stopped sandbox `base` and execs into all of them at once;
    then idles and measures their memory; removes them."""
    guest_bytes = 256 << 20
    names = [f"{prefix}{n}-{i}" for i in range(n)]
    t0 = time.monotonic()
    for k in range(0, n, 16):
        cove("fork", base, *names[k:k + 16], "--stopped")
    fork_s = time.monotonic() - t0
    log(f"launch {prefix} N={n}: {n} stopped clones forked in {fork_s:.1f} s; exec into all")
    c0 = box_cpu()
    wall, res = run_concurrently([[COVE, "exec", nm, "--", "true"] for nm in names])
    c1 = box_cpu()
    lost = [(nm, r) for nm, r in zip(names, res) if r["rc"] != 0]
    busy = c1[0] - c0[0]
    b = {"n": n, "fork_stopped_s": round(fork_s, 2), "wall_s": round(wall, 3),
         "lost": len(lost), "lost_errors": [f"{nm}: rc={r['rc']} {r['err']}"
                                            for nm, r in lost][:8],
         "launches_per_s_per_box_cpu": round(n / (wall * NCPU), 3),
         "box_busy_cpu_s": round(busy, 2), "box_idle_cpu_s": round(c1[1] - c0[1], 2),
         "launches_per_box_busy_cpu_s": round(n / busy, 3) if busy > 0 else None,
         "exec_s": summ([r["s"] for r in res], 3)}
    log(f"launch {prefix} N={n}: wall {wall:.2f} s, lost {len(lost)}, box busy {busy:.1f} s, "
        f"{b['launches_per_s_per_box_cpu']} launches/s/CPU")
    for nm, r in lost[:4]:
        log(f"  lost {nm}: rc={r['rc']} {r['err'].strip()}")
    if IDLE_S > 0:
        log(f"launch {prefix} N={n}: {IDLE_S:.0f} s idle, then PSS")
        time.sleep(IDLE_S)
    m = clone_memory(names, guest_bytes)
    m["idle_s"] = IDLE_S
    log(f"launch {prefix} N={n}: VMM PSS {m['vmm_only_pss_mib']}, "
        f"sharing {m.get('share_unwritten_pages')}")
    if not keep_rows:
        m.pop("per_sandbox", None)
    b["memory_after_idle"] = m
    t0 = time.monotonic()
    parallel(lambda nm: cove("rm", nm, check=False), names)
    log(f"launch {prefix} N={n}: removed in {time.monotonic() - t0:.1f} s")
    return b


# A test key command (tools/key-cmd-openssl's protocol, as the e2e lifecycle tests use): XOR
# with the KEK file.
KEK_CMD = """import base64, sys
kek = open(sys.argv[1], "rb").read()
data = base64.b64decode(sys.stdin.readline())
print(base64.b64encode(bytes(b ^ kek[i % len(kek)] for i, b in enumerate(data))).decode())
"""


def part_launch_encrypted():
    """The same bursts from an encrypted chain: clones restore into private memory, pages
    decrypted through userfaultfd on first touch, so nothing is shared."""
    kd = "/tmp/dens-kek"
    os.makedirs(kd, exist_ok=True)
    with open(f"{kd}/kek.py", "w") as f:
        f.write(KEK_CMD)
    with open(f"{kd}/kek", "wb") as f:
        f.write(os.urandom(32))
    cove("create", "ebase", "--mem", "256M", "--snapshot-every", "off", "--key",
         f"key-cmd:{sys.executable} {kd}/kek.py {kd}/kek")
    cove("exec", "ebase", "--", "true")
    cove("stop", "ebase")
    out = {"what": "as bursts, from a sandbox created with --key key-cmd (a test XOR key "
           "command, as the e2e tests use)",
           "bursts": {str(n): burst("ebase", "e", n, True) for n in ENC_SIZES}}
    cove("rm", "ebase", check=False)
    return out


def part_launch():
    out = {"guest_mem": "256M", "box_vcpus": NCPU, "what":
           "cove fork base c-1..c-N --stopped, then N concurrent `cove exec c-i -- true`, no "
           "pause; wall from the start of the execs to the last one's exit"}
    log("launch: create the base sandbox")
    t0 = time.monotonic()
    cove("create", "base", "--cold", "--mem", "256M", "--snapshot-every", "off")
    cove("exec", "base", "--", "true")
    out["base_create_s"] = round(time.monotonic() - t0, 2)
    cove("stop", "base")
    out["bursts"] = {str(n): burst("base", "c", n, n == max(SIZES)) for n in SIZES}
    cove("rm", "base", check=False)
    if ENC_SIZES:
        try:
            out["encrypted"] = part_launch_encrypted()
        except Exception as e:  # noqa: BLE001: reported, the plain figures stand
            out["encrypted"] = {"error": f"{type(e).__name__}: {e}"}
            log(f"encrypted launch FAILED: {e}")
            cove("rm", "ebase", check=False)
    if ORCH:
        out["orchestrator"] = part_orchestrator()
    return out


def part_orchestrator():
    """cove run + snapshot --full by hand, then N concurrent cove restore + exec --wait."""
    d = "/tmp/dens-orch"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    p = subprocess.Popen([COVE, "run", "--kernel", BZIMAGE, "--mem", "256M", "--cmdline",
                          BYHAND_CMDLINE, "--disk", f"{ROOTFS},overlay={d}/root.ovl",
                          "--vsock-cid", "3", "--vsock-uds", f"{d}/v.sock", "--api-sock",
                          f"{d}/api.sock", "--console", f"{d}/console", "--snapshot-dir",
                          f"{d}/chain"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=ENV)
    out = {"what": "cove run + cove snapshot --full, then N concurrent `cove restore CHAIN` "
           "(unjailed, own --snapshot-dir) + `cove exec --wait 300 UDS -- true`", "bursts": {}}
    try:
        cove("exec", "--wait", "300", f"{d}/v.sock", "--", "true")
        cove("snapshot", f"{d}/api.sock", "--full")
    finally:
        p.kill()
        p.wait()
    for n in SIZES:
        r = orchestrator_burst(n, f"{d}/chain", f"{d}/runs")
        log(f"orchestrator N={n}: wall {r['wall_s']} s, lost {r['lost']}, "
            f"{r['launches_per_s_per_box_cpu']} launches/s/CPU")
        out["bursts"][str(n)] = r
    shutil.rmtree(d, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------------------
# idle cost
# ------------------------------------------------------------------------------------------

def qemu_idle_argv(cmdline, i):
    from box_vmm import qemu_microvm
    argv = qemu_microvm(BZIMAGE, "", cmdline, devices=(
        "-drive", f"id=root,file={ROOTFS},format=raw,if=none,snapshot=on",
        "-device", "virtio-blk-device,drive=root"))
    k = argv.index("-initrd")
    del argv[k:k + 2]
    return argv


def wait_console(path, pattern, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(path, "rb") as f:
                if pattern in f.read():
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def part_idle():
    kvm_debugfs()
    out = {"guests": IDLE_N, "idle_s": IDLE_S, "box_vcpus": NCPU, "kvm_debugfs":
           os.path.isdir(KVM_DEBUG)}
    names = [f"idle-{i}" for i in range(IDLE_N)]
    log(f"idle: creating {IDLE_N} sandboxes (--snapshot-every off)")
    t0 = time.monotonic()
    errs = []
    for nm in names:
        try:
            cove("create", nm, "--cold", "--mem", "256M", "--snapshot-every", "off")
        except Exception as e:  # noqa: BLE001
            errs.append(str(e)[-300:])
    out["cove_create_all_s"] = round(time.monotonic() - t0, 1)
    with open(f"{STATE}/{names[0]}/spec.json") as f:
        spec = json.load(f)
    cmdline = spec["cmdline"]
    out["cmdline"] = cmdline
    out["cove_kernel"] = spec.get("kernel")
    kids = ppid_map()
    pids = [q for p in (sandbox_pid(nm) for nm in names) if p for q in tree(p, kids)]
    out["cove_errors"] = errs
    log(f"idle: {len(pids)} cove processes up; settling 10 s, then {IDLE_S:.0f} s measured")
    time.sleep(10)
    cove_w = idle_window({"cove": (pids, IDLE_N)}, IDLE_S)
    out["cove"] = cove_w["cove"]
    out["cove_box"] = {k: cove_w[k] for k in ("seconds", "box_busy_s", "box_kvm_exits_per_s")}
    parallel(lambda nm: cove("rm", nm, check=False), names)
    log(f"idle: cove {out['cove']}")
    # QEMU microvm: same kernel and command line; the root image as virtio-blk (snapshot=on, a
    # throw-away overlay, as cove's copy-on-write top); no vsock (QEMU's is vhost-only and the
    # box has no vhost_vsock: cove-init's agent logs one error and exits).
    qd = "/tmp/dens-qemu"
    shutil.rmtree(qd, ignore_errors=True)
    os.makedirs(qd)
    qs = []
    t0 = time.monotonic()
    for i in range(IDLE_N):
        qs.append(subprocess.Popen(qemu_idle_argv(cmdline, i), stdin=subprocess.DEVNULL,
                                   stdout=open(f"{qd}/c{i}", "wb"), stderr=subprocess.STDOUT,
                                   cwd=qd))
    ready = [wait_console(f"{qd}/c{i}", b"cove-init: ready", 300) for i in range(IDLE_N)]
    out["qemu_boot_all_s"] = round(time.monotonic() - t0, 1)
    out["qemu_ready"] = sum(ready)
    out["qemu_argv"] = " ".join(qemu_idle_argv(cmdline, 0))
    log(f"idle: {sum(ready)} of {IDLE_N} QEMU guests ready; settling 10 s, then {IDLE_S:.0f} s")
    time.sleep(10)
    q_w = idle_window({"qemu": ([q.pid for q in qs], IDLE_N)}, IDLE_S)
    out["qemu"] = q_w["qemu"]
    out["qemu_box"] = {k: q_w[k] for k in ("seconds", "box_busy_s", "box_kvm_exits_per_s")}
    with open(f"{qd}/c0", "rb") as f:
        out["qemu_console_tail"] = f.read()[-400:].decode(errors="replace")
    for q in qs:
        q.kill()
    for q in qs:
        q.wait()
    shutil.rmtree(qd, ignore_errors=True)
    log(f"idle: qemu {out['qemu']}")
    c, q = out["cove"]["cpu_s_schedstat"], out["qemu"]["cpu_s_schedstat"]
    out["cpu_cove_over_qemu"] = round(c / q, 3) if q else None
    c, q = out["cove"]["cpu_s_total"], out["qemu"]["cpu_s_total"]
    out["cpu_cove_over_qemu_ticks"] = round(c / q, 3) if q else None
    return out


# ------------------------------------------------------------------------------------------
# VMM memory
# ------------------------------------------------------------------------------------------

def vmm_memory(pid, guest_bytes):
    maps = smaps(pid) or []
    tot = {"Rss": 0, "Pss": 0, "Private_Dirty": 0, "Private_Clean": 0, "Anonymous": 0}
    guest = {"Rss": 0}
    files, libs, guest_maps = set(), set(), []
    for mp in maps:
        if is_guest_ram(mp, guest_bytes):
            guest["Rss"] += mp[4].get("Rss", 0)
            guest_maps.append(mp[3] or "[anon]")
            continue
        for k in tot:
            tot[k] += mp[4].get(k, 0)
        if mp[3].startswith("/"):
            files.add(mp[3])
            if re.search(r"\.so(\.|$)", os.path.basename(mp[3])):
                libs.add(mp[3])
    r = rollup(pid) or {}
    return {"pid": pid, "rss_excl_guest_kib": tot["Rss"], "pss_excl_guest_kib": tot["Pss"],
            "private_dirty_excl_guest_kib": tot["Private_Dirty"],
            "private_excl_guest_kib": tot["Private_Dirty"] + tot["Private_Clean"],
            "anon_excl_guest_kib": tot["Anonymous"], "guest_ram_rss_kib": guest["Rss"],
            "rollup_rss_kib": r.get("Rss"), "guest_ram_mappings": sorted(set(guest_maps)),
            "files_mapped": sorted(files), "shared_objects": len(libs)}


def part_memory():
    out = {"what": "named sandbox: root disk overlay, vsock, API socket, one exec session "
           "(sleep) open; /proc/PID/smaps of the VMM minus the guest RAM mapping(s)"}
    for label in ("booted", "restored"):
        if label == "booted":
            cove("create", "mem0", "--cold", "--mem", "256M", "--snapshot-every", "off")
        else:
            cove("stop", "mem0")
        sess = subprocess.Popen([COVE, "exec", "mem0", "--", "sleep", "600"], env=ENV,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(5)
        pid = vmm_of(sandbox_pid("mem0"))
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[:2]
        m = vmm_memory(pid, 256 << 20)
        m["argv"] = [a.decode(errors="replace") for a in argv0]
        m["session_alive"] = sess.poll() is None
        out[label] = m
        log(f"memory {label}: RSS excl. guest {m['rss_excl_guest_kib']} KiB, private dirty "
            f"{m['private_dirty_excl_guest_kib']} KiB, {m['shared_objects']} shared objects")
        sess.kill()
        sess.wait()
    cove("rm", "mem0", check=False)
    return out


# ------------------------------------------------------------------------------------------
# boot, snapshot pause, balloon
# ------------------------------------------------------------------------------------------

def part_boot():
    os.environ["BENCH_RUNS"] = str(BOOT_RUNS)
    import boot_in_box as bb
    out = {"runs": BOOT_RUNS, "cmdline": bb.CMDLINE, "results": {}}
    for kname, kpath in bb.KERNELS.items():
        res = {"cove": [], "qemu": []}
        bb.one(bb.cove_argv(kpath))
        bb.one(bb.qemu_argv(kpath))
        for i in range(BOOT_RUNS):
            for vmm, argv in (("cove", bb.cove_argv(kpath)), ("qemu", bb.qemu_argv(kpath))):
                r = bb.one(argv)
                res[vmm].append(r)
                log(f"boot {kname} {vmm} run {i}: {r.get('ready_ms', r.get('error'))}")
        e = {vmm: {"ready_ms": bb.summary(res[vmm], "ready_ms"),
                   "errors": [r["error"] for r in res[vmm] if "error" in r]}
             for vmm in ("cove", "qemu")}
        c, q = e["cove"]["ready_ms"], e["qemu"]["ready_ms"]
        e["ratio_cove_over_qemu"] = round(c["median"] / q["median"], 3) if c and q else None
        out["results"][kname] = e
    return out


def part_pause():
    out = {"what": "named 256 MiB sandbox (--snapshot-every off): `cove snapshot API --full`, "
           "then per run `dd if=/dev/urandom of=/tmp/fill bs=1M count=16 conv=notrunc` in the "
           "guest and `cove snapshot API --diff`; pause_us from the reply"}
    cove("create", "snap0", "--cold", "--mem", "256M", "--snapshot-every", "off")
    api = f"{RUN}/snap0/api.sock"
    full, diff = [], []
    for i in range(PAUSE_RUNS):
        r = json.loads(cove("snapshot", api, "--full").stdout)
        full.append(r)
        cove("exec", "snap0", "--", "sh", "-c",
             "dd if=/dev/urandom of=/tmp/fill bs=1M count=16 conv=notrunc 2>/dev/null; sync")
        r = json.loads(cove("snapshot", api, "--diff").stdout)
        diff.append(r)
        log(f"pause run {i}: full {full[-1].get('pause_us')} us ({full[-1].get('pages')} "
            f"pages), diff {r.get('pause_us')} us ({r.get('pages')} pages)")
    cove("rm", "snap0", check=False)
    for label, rows in (("full", full), ("diff_16mib", diff)):
        out[label] = {"pause_ms": summ([r.get("pause_us", 0) / 1000 for r in rows], 2),
                      "write_ms": summ([r.get("write_us", 0) / 1000 for r in rows], 2),
                      "pages": [r.get("pages") for r in rows],
                      "bytes": [r.get("bytes") for r in rows]}
    return out


def part_balloon():
    if not os.path.exists("/work/balloon_in_box.py"):
        return {"note": "not measured: bench/balloon_in_box.py is absent (bench/density "
                "--with-balloon adds it when it exists)"}
    r = subprocess.run([sys.executable, "/work/balloon_in_box.py"], env=ENV, timeout=1200)
    try:
        with open("/work/out/balloon.json") as f:
            res = json.load(f)
    except (OSError, ValueError) as e:
        return {"note": f"not measured: balloon_in_box.py exited {r.returncode}, no "
                f"/work/out/balloon.json ({e})"}
    res["rc"] = r.returncode
    return res


def main():
    out = {"bench": "density", "box_vcpus": NCPU, "parts": ONLY, "sizes": SIZES,
           "idle_s": IDLE_S, "results": {}, "errors": {}, "seconds": {}}
    with open("/proc/meminfo") as f:
        out["box_mem_total_kib"] = int(f.readline().split()[1])
    shutil.rmtree(STATE, ignore_errors=True)
    parts = {"boot": part_boot, "memory": part_memory, "pause": part_pause,
             "launch": part_launch, "idle": part_idle, "balloon": part_balloon}
    for name in ("boot", "memory", "pause", "launch", "idle", "balloon"):
        if name not in ONLY:
            continue
        t0 = time.monotonic()
        log(f"--- {name}")
        try:
            out["results"][name] = parts[name]()
        except Exception as e:  # noqa: BLE001: one part failing must not lose the others
            import traceback
            out["errors"][name] = f"{type(e).__name__}: {e}"
            log(f"{name} FAILED: {traceback.format_exc()}")
        out["seconds"][name] = round(time.monotonic() - t0, 1)
        with open("/proc/loadavg") as f:
            out.setdefault("box_loadavg_after", {})[name] = f.read().split()[:3]
        os.makedirs("/work/out", exist_ok=True)
        with open("/work/out/density.json", "w") as f:
            json.dump(out, f, indent=1)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
