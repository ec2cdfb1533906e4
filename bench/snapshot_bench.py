#!/usr/bin/env python3
"""Snapshot benchmark on this machine's /dev/kvm with the test guests (stamper, counter).

1. write: pause time and write throughput of Full and Diff layers against dirty size
   (1 MiB..1 GiB), io_uring vs pwrite loop vs io_uring + O_DIRECT (COVE_SNAP_WRITER,
   COVE_SNAP_DIRECT read by cove at start), from PUT /snapshot/create's reply;
2. must_show: a 4 GiB guest that dirtied 40 MiB since the previous layer: the Diff layer's
   page bytes and its disk use (`du -k`), and its pause;
3. restore: `cove restore DIR --ready-fd N` from exec to "ok\n" and to the first console byte,
   against RAM size (256 MiB..8 GiB), next to a cold `cove run` boot of the same guest;
4. fork: PUT /fork {"count": 1|3} reply time on a running counter guest.

Prints one JSON document on stdout (progress on stderr). Python 3 standard library only.
See bench/README.md, section "Snapshots".
"""

import argparse
import datetime
import json
import os
import platform
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
from covetest import chain_json, http_json  # noqa: E402

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(SCRIPT_DIR)

MIB = 1024 * 1024
PAGE = 4096
STAMP_BASE = 0x1000000
TERM_GRACE_S = 2.0
# How long timed_restore waits for the ready line and the stamper's output (the KVM box, which
# emulates AES-NI, gets more: bench/crypto_in_box.py).
RESTORE_TIMEOUT_S = 20

# Every process we start (pid -> Popen), and fork clones (pids cove started for us).
LIVE = {}
CLONES = set()


def log(msg):
    print("[snapbench] " + msg, file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


# --------------------------------------------------------------------------
# processes, console, API


class Cove:
    """One cove process: console on a pipe (stdin too), stderr in a temp file."""

    def __init__(self, argv, env=None, pass_fds=(), api_sock=None):
        self.errf = tempfile.TemporaryFile()
        self.api_sock = api_sock
        self.out = b""
        full_env = dict(os.environ)
        full_env.pop("COVE_SNAP_WRITER", None)
        full_env.pop("COVE_SNAP_DIRECT", None)
        full_env.update(env or {})
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errf, pass_fds=pass_fds, env=full_env,
                                     start_new_session=True)
        LIVE[self.proc.pid] = self.proc
        if api_sock:
            end = time.perf_counter() + 10
            while not os.path.exists(api_sock):
                if self.proc.poll() is not None:
                    raise BenchError("cove exited (%s) before its API socket appeared: %s"
                                     % (self.proc.returncode, self.stderr()))
                if time.perf_counter() > end:
                    raise BenchError("no API socket after 10 s")
                time.sleep(0.005)

    def stderr(self):
        try:
            self.errf.seek(0)
            return self.errf.read().decode("utf-8", "replace").strip()[-1500:]
        except (OSError, ValueError):
            return ""

    def read_until(self, needle, timeout):
        """Reads the console until `needle` is in it; returns perf_counter() when it was."""
        needle = needle.encode() if isinstance(needle, str) else needle
        end = time.perf_counter() + timeout
        fd = self.proc.stdout.fileno()
        while needle not in self.out:
            left = end - time.perf_counter()
            if left <= 0:
                raise BenchError("timed out waiting for %r; console: %r" % (needle, self.out[-300:]))
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise BenchError("cove exited (%s) before %r: %s"
                                 % (self.proc.wait(), needle, self.stderr()))
            self.out += chunk
        return time.perf_counter()

    def first_byte(self, timeout):
        """Waits for the first console byte; returns when it came."""
        while not self.out:
            self._read_more(timeout)
        return time.perf_counter()

    def read_lines(self, n, timeout):
        """Reads the console until it holds n complete lines; returns when it did."""
        while self.out.count(b"\n") < n:
            self._read_more(timeout)
        return time.perf_counter()

    def _read_more(self, timeout):
        fd = self.proc.stdout.fileno()
        r, _, _ = select.select([fd], [], [], timeout)
        if not r:
            raise BenchError("timed out reading the console: %r" % self.out[-300:])
        chunk = os.read(fd, 65536)
        if not chunk:
            raise BenchError("cove exited (%s): %s" % (self.proc.wait(), self.stderr()))
        self.out += chunk

    def send(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def request(self, method, path, body=None, timeout=120):
        return http_json(self.api_sock, method, path, body, timeout=timeout)

    def snapshot(self, kind):
        status, body = self.request("PUT", "/snapshot/create", {"snapshot_type": kind})
        if status != 200:
            raise BenchError("%s snapshot: HTTP %s %s" % (kind, status, body))
        return body

    def stamp_round(self, r, count):
        """Lets a stamper guest write round r (round 1 runs on its own) and snapshots it: a
        Full layer after round 1, a Diff after the others. Returns the snapshot reply."""
        if r > 1:
            self.send(b"n")
        self.read_until("stamped round %d pages %d\n" % (r, count), 60)
        return self.snapshot("Full" if r == 1 else "Diff")

    def kill(self):
        """SIGKILL (what a crash looks like; snapshots must not depend on a clean exit)."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        LIVE.pop(self.proc.pid, None)
        self.errf.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()


def kill_clone(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    # Clones are children of the cove that forked them (it lets the kernel reap them).
    end = time.perf_counter() + 5
    while time.perf_counter() < end:
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    break
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.005)
    CLONES.discard(pid)


def kill_everything():
    for p in list(CLONES):
        kill_clone(p)
    for proc in list(LIVE.values()):
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        LIVE.pop(proc.pid, None)


def _on_signal(signum, _frame):
    log("got signal %d, killing children" % signum)
    kill_everything()
    raise SystemExit(128 + signum)


# --------------------------------------------------------------------------
# numbers


def summary(vals, nd=2):
    vals = [v for v in vals if v is not None]
    if not vals:
        return {"median": None, "n": 0}
    return {"median": round(statistics.median(vals), nd), "min": round(min(vals), nd),
            "max": round(max(vals), nd), "n": len(vals), "samples": [round(v, nd) for v in vals]}


def med(s):
    return s["median"] if s else None


def ratio(a, b, nd=3):
    if a is None or b is None or b == 0:
        return None
    return round(a / b, nd)


def guest_ram_rss_mib(pid):
    """Resident MiB of cove's guest RAM mapping(s) (memfd:cove-guest-ram) in /proc/PID/smaps."""
    tot, in_ram = 0, False
    try:
        with open("/proc/%d/smaps" % pid) as f:
            for line in f:
                p = line.split()
                if p and "-" in p[0] and ":" not in p[0]:
                    in_ram = "cove-guest-ram" in line
                elif in_ram and p and p[0] == "Rss:":
                    tot += int(p[1])
    except OSError:
        return None
    return tot // 1024


def disk_kib(path):
    """`du -k PATH` (blocks actually allocated) and the file's apparent size."""
    out = subprocess.run(["du", "-k", path], capture_output=True, text=True).stdout.split()
    return (int(out[0]) if out else None), os.stat(path).st_size


def latest_mem_layer(d):
    c = chain_json(d)
    return os.path.join(d, c["layers"][-1]["mem"])


def fs_of(path):
    """(mount point, fs type) of the file system holding path, from /proc/mounts."""
    path = os.path.realpath(path)
    best = ("", "?")
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mnt = parts[1].replace("\\040", " ")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > len(best[0]):
                best = (mnt, parts[2])
    return best


# --------------------------------------------------------------------------
# 1. Full vs Diff, writers, against dirty size

WRITERS = {
    "default": {},  # cove's own default: io_uring, O_DIRECT where the file system takes it
    "uring": {"COVE_SNAP_WRITER": "uring", "COVE_SNAP_DIRECT": "0"},
    "pwrite": {"COVE_SNAP_WRITER": "pwrite", "COVE_SNAP_DIRECT": "0"},
    "uring_direct": {"COVE_SNAP_WRITER": "uring", "COVE_SNAP_DIRECT": "1"},
}
LAYER_KEYS = ["pages", "stored_pages", "bytes", "pause_us", "write_us", "total_us", "staged"]


def stamper_argv(a, work, name, mem, count, rounds):
    d = os.path.join(work, name)
    sock = os.path.join(work, name + ".sock")
    argv = [a.cove, "run", "--kernel", os.path.join(a.guests, "stamper"), "--mem", mem,
            "--api-sock", sock, "--snapshot-dir", d, "--cmdline",
            "stamp_base=%#x stamp_count=%d stamp_stride=1 rounds=%d" % (STAMP_BASE, count, rounds)]
    return argv, d, sock


def layer_sample(reply, d):
    s = {k: reply[k] for k in LAYER_KEYS}
    du, size = disk_kib(latest_mem_layer(d))
    s["disk_kib"] = du
    s["file_size"] = size
    # Not staged: the pages were written while the VM stayed paused, inside pause_us.
    s["write_mib_per_s"] = round(reply["bytes"] / MIB / (reply["write_us"] / 1e6), 1) \
        if reply["write_us"] and reply["staged"] else None
    s["total_mib_per_s"] = round(reply["bytes"] / MIB / (reply["total_us"] / 1e6), 1) \
        if reply["total_us"] else None
    return s


# The stamper writes guest-physical addresses in a line from STAMP_BASE; RAM above 3 GiB is
# mapped at 4 GiB (the MMIO hole), so every stamped page must stay below 3 GiB.
LOW_RAM_END = 3 << 30


def diffs_that_fit(mib, want):
    return max(0, min(want, (LOW_RAM_END - STAMP_BASE) // (mib * MIB) - 1))


def one_write_proc(a, work, mib, writer, diffs):
    """Stamps `mib` MiB, Full; then `diffs` times: stamps `mib` new MiB, Diff."""
    count = mib * MIB // PAGE
    diffs = diffs_that_fit(mib, diffs)
    name = "w-%d-%s" % (mib, writer)
    argv, d, sock = stamper_argv(a, work, name, a.write_mem, count, 1 + diffs)
    stamp_to = 30 + mib / 32
    res = {"full": [], "diff": []}
    try:
        with Cove(argv, env=WRITERS[writer], api_sock=sock) as vm:
            for r in range(1, diffs + 2):
                if r > 1:
                    vm.send(b"n")
                vm.read_until("stamped round %d pages %d\n" % (r, count), stamp_to)
                before = guest_ram_rss_mib(vm.proc.pid)
                reply = vm.snapshot("Full" if r == 1 else "Diff")
                s = layer_sample(reply, d)
                s["guest_ram_rss_mib_before"] = before
                s["guest_ram_rss_mib_after"] = guest_ram_rss_mib(vm.proc.pid)
                res["full" if r == 1 else "diff"].append(s)
    finally:
        shutil.rmtree(d, ignore_errors=True)
        if os.path.exists(sock):
            os.unlink(sock)
    return res


def agg_layers(samples):
    out = {}
    for k in ("pause_us", "write_us", "total_us", "write_mib_per_s", "total_mib_per_s"):
        out[k] = summary([s[k] for s in samples], 1)
    for k in ("pages", "stored_pages", "bytes", "disk_kib"):
        out[k] = summary([s[k] for s in samples], 0)
        out[k].pop("samples", None)
    out["staged"] = sorted({s["staged"] for s in samples})
    out["guest_ram_rss_mib_before"] = [s["guest_ram_rss_mib_before"] for s in samples]
    out["guest_ram_rss_mib_after"] = [s["guest_ram_rss_mib_after"] for s in samples]
    return out


def bench_write(a, work, errors):
    raw = {}
    for rep in range(a.write_procs):
        for mib in a.sizes:
            for w in a.writers:
                if mib >= 1024 and rep >= a.write_procs_1g:
                    continue
                log("write: %d MiB, %s, process %d/%d" % (mib, w, rep + 1, a.write_procs))
                try:
                    r = one_write_proc(a, work, mib, w, a.write_diffs)
                except (BenchError, OSError) as e:
                    errors.append("write %d MiB %s: %s" % (mib, w, e))
                    log("  FAILED: %s" % e)
                    continue
                slot = raw.setdefault(str(mib), {}).setdefault(w, {"full": [], "diff": []})
                slot["full"] += r["full"]
                slot["diff"] += r["diff"]
                for kind in ("full", "diff"):
                    for s in r[kind]:
                        log("  %s: %d pages, pause %.1f ms, write %.1f ms (%s MiB/s overall)%s" % (
                            kind, s["pages"], s["pause_us"] / 1e3, s["write_us"] / 1e3,
                            s["total_mib_per_s"], "" if s["staged"] else
                            ", NOT staged: written during the pause"))
    table = {}
    for mib, per in raw.items():
        row = {}
        for w, kinds in per.items():
            row[w] = {k: agg_layers(v) for k, v in kinds.items() if v}
        # Ratios side by side (medians of the same run).
        r = {}
        for kind in ("full", "diff"):
            u = row.get("uring", {}).get(kind)
            p = row.get("pwrite", {}).get(kind)
            ud = row.get("uring_direct", {}).get(kind)
            if u and p:
                r["%s_write_us_uring_over_pwrite" % kind] = ratio(med(u["write_us"]),
                                                                  med(p["write_us"]))
                r["%s_pause_us_uring_over_pwrite" % kind] = ratio(med(u["pause_us"]),
                                                                  med(p["pause_us"]))
            if u and ud:
                r["%s_write_us_direct_over_buffered" % kind] = ratio(med(ud["write_us"]),
                                                                     med(u["write_us"]))
        u = row.get("uring", {})
        if u.get("full") and u.get("diff"):
            r["uring_pause_us_diff_over_full"] = ratio(med(u["diff"]["pause_us"]),
                                                       med(u["full"]["pause_us"]))
            r["uring_write_us_diff_over_full"] = ratio(med(u["diff"]["write_us"]),
                                                       med(u["full"]["write_us"]))
        row["ratios"] = r
        table[mib + "MiB"] = row
    return {
        "what": "stamper guest (--mem %s) stamps N MiB of new pages per round; Full after "
                "round 1, Diff after each later round; numbers from PUT /snapshot/create's "
                "reply (pause_us: vCPUs stopped; write_us: after resume, write + fdatasync + "
                "rename; bytes: page data written). %d process(es) per size and writer "
                "(%d at 1 GiB), 1 Full + %d Diff each (1 at 1 GiB: the stamped pages must stay "
                "below the 3 GiB MMIO hole), writers interleaved. staged=false: more than "
                "1 GiB (SNAP_DEFAULT_STAGE_MAX) to write, so cove wrote straight from guest "
                "RAM with the VM paused: the write is inside pause_us and write_mib_per_s is "
                "null; total_mib_per_s = bytes / total_us"
                % (a.write_mem, a.write_procs, min(a.write_procs, a.write_procs_1g),
                   a.write_diffs),
        "by_dirty_size": table,
    }


# --------------------------------------------------------------------------
# 2. must show: 4 GiB guest, 40 MiB dirtied since the previous layer


def bench_must_diff(a, work):
    mib = 40
    count = mib * MIB // PAGE
    rounds = 2 + a.must_diffs
    argv, d, sock = stamper_argv(a, work, "must", "4G", count, rounds)
    samples, full = [], None
    try:
        with Cove(argv, api_sock=sock) as vm:
            for r in range(1, rounds + 1):
                reply = vm.stamp_round(r, count)
                s = layer_sample(reply, d)
                if r == 1:
                    full = s
                elif r > 2:  # round 2's Diff follows the Full; later ones follow a Diff
                    samples.append(s)
                    log("must: Diff %d: %d bytes, du %d KiB, pause %.2f ms" % (
                        r, s["bytes"], s["disk_kib"], s["pause_us"] / 1e3))
    finally:
        shutil.rmtree(d, ignore_errors=True)
        if os.path.exists(sock):
            os.unlink(sock)
    bytes_max = max(s["bytes"] for s in samples)
    du_max = max(s["disk_kib"] for s in samples)
    pause = summary([s["pause_us"] / 1e3 for s in samples], 3)
    return {
        "what": "stamper, --mem 4G, 40 MiB (10240 pages) stamped per round; Full after round "
                "1, Diff after each round; the samples are the Diffs whose previous layer is a "
                "Diff (rounds 3..%d); default writer (io_uring, buffered)" % rounds,
        "full_layer": full,
        "diff_layers": samples,
        "diff_bytes_max": bytes_max,
        "diff_bytes_max_mib": round(bytes_max / MIB, 3),
        "diff_du_kib_max": du_max,
        "diff_du_mib_max": round(du_max / 1024, 3),
        "diff_file_size_apparent": samples[0]["file_size"],
        "under_48_mib": bytes_max < 48 * MIB and du_max < 48 * 1024,
        "pause_ms": pause,
        "write_ms": summary([s["write_us"] / 1e3 for s in samples], 3),
        "pause_under_10_ms_goal": pause["median"] is not None and pause["median"] < 10.0,
    }


# --------------------------------------------------------------------------
# 3. restore latency against RAM size


def evict(d):
    """Drops the page cache of our own layer files only (they are synced, so clean)."""
    for f in os.listdir(d):
        p = os.path.join(d, f)
        if os.path.isfile(p):
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed_restore(a, d, stamper, next_round=3, extra=()):
    """exec -> "ok\n" on --ready-fd; -> first console byte (counter: its next tick; stamper:
    we send a byte once ready and it prints its next round). `extra`: more restore options."""
    rfd, wfd = os.pipe()
    res = {}
    try:
        vm = Cove([a.cove, "restore", d, "--ready-fd", str(wfd), "--log-level", "info",
                   *extra], pass_fds=(wfd,))
    except OSError as e:
        os.close(rfd)
        os.close(wfd)
        raise BenchError("spawn: %s" % e)
    os.close(wfd)
    t0 = vm.t0
    try:
        got = b""
        end = t0 + RESTORE_TIMEOUT_S
        while b"\n" not in got:
            left = end - time.perf_counter()
            if left <= 0:
                raise BenchError("no ready line within %d s" % RESTORE_TIMEOUT_S)
            r, _, _ = select.select([rfd], [], [], left)
            if r:
                chunk = os.read(rfd, 256)
                if not chunk:
                    raise BenchError("ready fd closed without a word: %s" % vm.stderr())
                got += chunk
        t_ready = time.perf_counter()
        if got != b"ok\n":
            raise BenchError("restore said %r" % got)
        res["ready_ms"] = (t_ready - t0) * 1e3
        if stamper:
            vm.send(b"n")
            t_first = vm.first_byte(RESTORE_TIMEOUT_S)
            vm.read_until("stamped round %d " % next_round, RESTORE_TIMEOUT_S)
            res["first_byte_ms"] = (t_first - t0) * 1e3
            res["input_to_output_ms"] = (t_first - t_ready) * 1e3
        else:
            t_first = vm.first_byte(20)
            res["first_byte_ms"] = (t_first - t0) * 1e3
            t1 = vm.read_lines(1, 20)
            # The second tick: this very process's tick interval.
            res["tick_interval_ms"] = (vm.read_lines(2, 20) - t1) * 1e3
            first_line_end = vm.out.index(b"\n") + 1
            res["first_line"] = vm.out[:first_line_end].decode("utf-8", "replace").strip()
        # cove's own measure: "restored layer N of DIR: ..., T us" (files opened before it).
        m = re.search(r"restored layer .*, (\d+) us", vm.stderr())
        res["cove_restore_ms"] = int(m.group(1)) / 1e3 if m else None
    finally:
        os.close(rfd)
        vm.kill()
    return res


def timed_boot(a, mem, guest="counter"):
    """Cold `cove run` of a test guest: exec -> first console byte / end of the first line.
    counter: its first tick (one tick interval of counting); hello: prints at once."""
    with Cove([a.cove, "run", "--kernel", os.path.join(a.guests, guest), "--mem", mem]) as vm:
        t_first = vm.first_byte(20)
        t_line = vm.read_until(b"\n", 20)
        return {"first_byte_ms": (t_first - vm.t0) * 1e3, "first_tick_ms": (t_line - vm.t0) * 1e3}


def make_counter_chain(a, work, mem):
    d = os.path.join(work, "rc-" + mem)
    sock = d + ".sock"
    with Cove([a.cove, "run", "--kernel", os.path.join(a.guests, "counter"), "--mem", mem,
               "--api-sock", sock, "--snapshot-dir", d], api_sock=sock) as vm:
        vm.read_until("tick 2\n", 20)
        # Paused right after a tick: the restored counter's first output is its next tick.
        st, _ = vm.request("PATCH", "/vm", {"state": "Paused"})
        if st != 204:
            raise BenchError("pause: HTTP %s" % st)
        reply = vm.snapshot("Full")
    os.unlink(sock)
    return d, reply


def make_stamper_chain(a, work, mem):
    argv, d, sock = stamper_argv(a, work, "rs-" + mem, mem, 256, 3)
    with Cove(argv, api_sock=sock) as vm:
        vm.read_until("stamped round 1 pages 256\n", 20)
        full = vm.snapshot("Full")
        vm.send(b"n")
        vm.read_until("stamped round 2 pages 256\n", 20)
        diff = vm.snapshot("Diff")
    os.unlink(sock)
    return d, [full, diff]


def chain_fingerprint(d):
    return sorted((f, os.stat(os.path.join(d, f)).st_mtime_ns) for f in os.listdir(d))


def bench_restore(a, work, errors):
    out = {}
    for mem in a.restore_mems:
        row = {}
        log("restore: %s" % mem)
        try:
            cd, creply = make_counter_chain(a, work, mem)
            sd, sreplies = make_stamper_chain(a, work, mem)
        except (BenchError, OSError) as e:
            errors.append("restore %s setup: %s" % (mem, e))
            log("  FAILED: %s" % e)
            continue
        fp_c, fp_s = chain_fingerprint(cd), chain_fingerprint(sd)
        kinds = ("counter_warm", "stamper_warm", "counter_evicted", "boot", "boot_hello")
        samples = {k: [] for k in kinds}
        for i in range(a.restore_runs):
            # Alternate the kinds so that they see the same load.
            for kind in kinds:
                try:
                    if kind == "boot":
                        s = timed_boot(a, mem)
                    elif kind == "boot_hello":
                        s = timed_boot(a, mem, "hello")
                    else:
                        d = sd if kind.startswith("stamper") else cd
                        if kind.endswith("evicted"):
                            evict(d)
                        s = timed_restore(a, d, kind.startswith("stamper"))
                    samples[kind].append(s)
                except (BenchError, OSError) as e:
                    errors.append("restore %s %s run %d: %s" % (mem, kind, i, e))
                    log("  %s FAILED: %s" % (kind, e))
        row["counter_full_layer"] = {k: creply[k] for k in LAYER_KEYS}
        du, size = disk_kib(latest_mem_layer(cd))
        row["counter_full_layer"].update({"disk_kib": du, "file_size": size})
        row["stamper_layers"] = [{k: r[k] for k in LAYER_KEYS} for r in sreplies]
        for kind, ss in samples.items():
            agg = {}
            for k in ("ready_ms", "first_byte_ms", "input_to_output_ms", "cove_restore_ms",
                      "tick_interval_ms", "first_tick_ms"):
                vals = [s[k] for s in ss if s.get(k) is not None]
                if vals:
                    agg[k] = summary(vals, 2)
            if kind.startswith("counter") and ss:
                agg["first_line_example"] = ss[0].get("first_line")
            row[kind] = agg
        row["chain_untouched_by_restores"] = (chain_fingerprint(cd) == fp_c and
                                              chain_fingerprint(sd) == fp_s)
        cw, bt, bh = row["counter_warm"], row["boot"], row["boot_hello"]
        sw = row["stamper_warm"]
        row["ratios"] = {
            "counter_restore_first_tick_over_boot_first_tick":
                ratio(med(cw.get("first_byte_ms")), med(bt.get("first_byte_ms"))),
            "restore_ready_over_hello_boot_first_byte":
                ratio(med(cw.get("ready_ms")), med(bh.get("first_byte_ms"))),
            "stamper_restore_first_byte_over_hello_boot_first_byte":
                ratio(med(sw.get("first_byte_ms")), med(bh.get("first_byte_ms"))),
            "evicted_ready_over_warm_ready":
                ratio(med(row["counter_evicted"].get("ready_ms")), med(cw.get("ready_ms"))),
        }
        log("  ready warm %s ms, evicted %s ms, stamper %s ms (reply %s ms); hello boot first "
            "byte %s ms" % (med(cw.get("ready_ms")), med(row["counter_evicted"].get("ready_ms")),
                            med(sw.get("ready_ms")), med(sw.get("first_byte_ms")),
                            med(bh.get("first_byte_ms"))))
        shutil.rmtree(cd, ignore_errors=True)
        shutil.rmtree(sd, ignore_errors=True)
        out[mem] = row
    return {
        "what": "counter: Full layer of a counter paused right after a tick (one layer, "
                "mapped from the file); stamper: Full + 1 MiB Diff chain (the Diff is copied "
                "in), the bench sends a byte once ready and times the guest's reply. ready_ms: "
                "exec to 'ok\\n' on --ready-fd; first_byte_ms: exec to the first console byte "
                "(counter: its next tick, which needs one tick interval of guest work, see "
                "tick_interval_ms); boot: cold `cove run` of the counter to its first byte (its "
                "first tick: same tick interval); boot_hello: cold `cove run` of the hello "
                "guest, which prints at once, to its first byte (the boot reference; these "
                "test guests boot in milliseconds, unlike Linux). "
                "warm: layer files in the page cache (just written); evicted: "
                "posix_fadvise(DONTNEED) on our layer files before each restore (no global "
                "drop_caches on this shared machine; the host below this VM may still cache)",
        "by_ram_size": out,
    }


# --------------------------------------------------------------------------
# 4. fork


def one_fork(vm, n):
    t0 = time.perf_counter()
    status, body = vm.request("PUT", "/fork", {"count": n}, timeout=60)
    dt = (time.perf_counter() - t0) * 1e3
    clones = (body or {}).get("clones", []) if status == 200 else []
    for c in clones:
        CLONES.add(c["pid"])
    ticks = None
    try:
        if status != 200:
            raise BenchError("fork %d: HTTP %s %s" % (n, status, body))
        ticks = []
        for c in clones:
            with open(c["console"], "rb") as f:
                ticks.append(f.read().count(b"tick"))
    finally:
        for c in clones:
            kill_clone(c["pid"])
        for c in clones:
            shutil.rmtree(c["snapshot_dir"], ignore_errors=True)
            for p in (c["console"], c.get("api_sock")):
                if p and os.path.exists(p):
                    os.unlink(p)
    return dt, len(clones)


def bench_fork(a, work, errors):
    out = {}
    for mem in a.fork_mems:
        d = os.path.join(work, "fork-" + mem)
        sock = d + ".sock"
        row = {}
        log("fork: %s" % mem)
        try:
            with Cove([a.cove, "run", "--kernel", os.path.join(a.guests, "counter"),
                       "--mem", mem, "--api-sock", sock, "--snapshot-dir", d],
                      api_sock=sock) as vm:
                vm.read_until("tick 1\n", 20)
                # No base yet: this fork's snapshot is a Full layer.
                dt, _ = one_fork(vm, 1)
                row["first_fork_count1_full_layer_ms"] = round(dt, 2)
                s = {1: [], 3: []}
                for i in range(a.fork_runs):
                    for n in (1, 3):
                        dt, got = one_fork(vm, n)
                        if got != n:
                            raise BenchError("fork %d returned %d clones" % (n, got))
                        s[n].append(dt)
                row["count1_ms"] = summary(s[1], 2)
                row["count3_ms"] = summary(s[3], 2)
                row["ratio_count3_over_count1"] = ratio(row["count3_ms"]["median"],
                                                        row["count1_ms"]["median"])
                row["parent_alive"] = vm.proc.poll() is None
                log("  count 1: %s ms, count 3: %s ms" % (row["count1_ms"]["median"],
                                                          row["count3_ms"]["median"]))
        except (BenchError, OSError) as e:
            errors.append("fork %s: %s" % (mem, e))
            log("  FAILED: %s" % e)
        finally:
            shutil.rmtree(d, ignore_errors=True)
            if os.path.exists(sock):
                os.unlink(sock)
        out[mem] = row
    return {
        "what": "counter guest with --snapshot-dir; PUT /fork {\"count\": N} reply time (cove "
                "takes a Diff layer, spawns N `cove restore` clones and replies once every "
                "clone wrote 'ok' on its ready pipe); clones killed and their dirs removed "
                "after each fork (not timed); the first fork of a process (no base: a Full "
                "layer) is reported apart",
        "by_ram_size": out,
    }


# --------------------------------------------------------------------------


def git_commit(root):
    """HEAD's commit, read from .git without running git (as bench/run does)."""
    try:
        with open(os.path.join(root, ".git", "HEAD")) as f:
            head = f.read().strip()
        if not head.startswith("ref:"):
            return head
        ref = head[4:].strip()
        p = os.path.join(root, ".git", ref)
        if os.path.isfile(p):
            with open(p) as f:
                return f.read().strip()
        with open(os.path.join(root, ".git", "packed-refs")) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref:
                    return parts[0]
    except OSError:
        pass
    return None


def run_text(argv):
    try:
        p = subprocess.run(argv, capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
        return (p.stdout + p.stderr).decode("utf-8", "replace").strip()
    except (OSError, subprocess.SubprocessError) as e:
        return "error: %s" % e


def metadata(a, work):
    mnt, fstype = fs_of(work)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(REPO_ROOT),
        "git_note": "read from .git (working tree may have uncommitted changes)",
        "cove_path": a.cove_src,
        "cove_note": "run from a copy in the work dir (the build is replaced by others' "
                     "rebuilds; a fork clone execs /proc/self/exe)",
        "cove_version": run_text([a.cove, "version"]),
        "host_kernel": platform.release(),
        "host_cpus": os.cpu_count(),
        "host_load_avg_at_start": list(os.getloadavg()),
        "work_dir": work,
        "work_fs": {"mount": mnt, "type": fstype},
        "kvm_note": "/dev/kvm on this host is nested PVM (kvm_pvm); the test guests run on "
                    "it directly. The machine is shared (2 CPUs, 4 engineers): compare ratios "
                    "from the same run",
        "cache_note": "warm: snapshot files are read back from the page cache (no global "
                      "drop_caches on a shared machine); see restore.*.counter_evicted for "
                      "a run with our own layer files evicted",
    }


# --------------------------------------------------------------------------
# 5. encrypted vs plain snapshots (issue 7), interleaved in one run


def encrypt_summary(rows, restores):
    out = {}
    for mode in rows:
        out[mode] = {
            "diff_total_ms": summary([x["total_us"] / 1e3 for x in rows[mode]], 2),
            "diff_pause_ms": summary([x["pause_us"] / 1e3 for x in rows[mode]], 2),
            "diff_write_ms": summary([x["write_us"] / 1e3 for x in rows[mode]], 2),
            "diff_bytes": [x["bytes"] for x in rows[mode]],
            "restore_ready_ms": summary([x["ready_ms"] for x in restores[mode]], 2),
            "restore_first_output_ms": summary([x["first_byte_ms"] for x in restores[mode]], 2),
        }
    out["ratios"] = {
        "diff_total_encrypted_over_plain": ratio(out["encrypted"]["diff_total_ms"]["median"],
                                                 out["plain"]["diff_total_ms"]["median"]),
        "diff_pause_encrypted_over_plain": ratio(out["encrypted"]["diff_pause_ms"]["median"],
                                                 out["plain"]["diff_pause_ms"]["median"]),
        "restore_ready_encrypted_over_plain": ratio(
            out["encrypted"]["restore_ready_ms"]["median"],
            out["plain"]["restore_ready_ms"]["median"]),
        "restore_first_output_encrypted_over_plain": ratio(
            out["encrypted"]["restore_first_output_ms"]["median"],
            out["plain"]["restore_first_output_ms"]["median"]),
    }
    return out


def bench_encrypt(a, work, errors):
    """Stamper, --mem 4G, 40 MiB per round: Full after round 1, Diff after rounds 2..4, plain
    and encrypted (--snapshot-key key-cmd with tools/key-cmd-openssl) processes alternating,
    for each writer in turn (--encrypt-writers); then restore of each chain (encrypted: pages
    decrypted on first touch via userfaultfd). The top-level plain/encrypted/ratios are the
    first writer's; by_writer has each."""
    mib, rounds = getattr(a, "encrypt_mib", 40), 4
    count = mib * MIB // PAGE
    writers = getattr(a, "encrypt_writers", None) or ["default"]
    kek = os.path.join(work, "kek.pem")
    keycmd = os.path.join(REPO_ROOT, "tools", "key-cmd-openssl")
    r = subprocess.run([keycmd, "--genkey", kek], capture_output=True, text=True)
    if r.returncode:
        raise BenchError("key-cmd-openssl --genkey: %s" % r.stderr.strip())
    spec = "key-cmd:'%s' '%s'" % (keycmd, kek)
    rows = {w: {"plain": [], "encrypted": []} for w in writers}
    restores = {w: {"plain": [], "encrypted": []} for w in writers}
    for i in range(a.encrypt_procs):
        for w in writers:
            for mode in ("plain", "encrypted"):
                name = "enc-%s-%s-%d" % (w, mode, i)
                log("encrypt: %s" % name)
                argv, d, sock = stamper_argv(a, work, name, "4G", count, rounds + 1)
                # An encrypted chain restores only with its key provider given again (--key).
                key = ["--key", spec] if mode == "encrypted" else []
                if key:
                    argv += ["--snapshot-key", spec]
                try:
                    with Cove(argv, env=WRITERS.get(w, {}), api_sock=sock) as vm:
                        for rnd in range(1, rounds + 1):
                            reply = vm.stamp_round(rnd, count)
                            if rnd > 1:
                                rows[w][mode].append({k: reply[k] for k in LAYER_KEYS})
                        vm.kill()
                    for _ in range(a.encrypt_restores):
                        evict(d)
                        restores[w][mode].append(timed_restore(a, d, True, rounds + 1, key))
                except BenchError as e:
                    errors.append("encrypt %s: %s" % (name, e))
                finally:
                    shutil.rmtree(d, ignore_errors=True)
                    if os.path.exists(sock):
                        os.unlink(sock)
    out = {"what": bench_encrypt.__doc__.strip(), "key_provider": "key-cmd (RSA-OAEP, "
           "tools/key-cmd-openssl)", "dirty_mib": mib, "writers": writers}
    by = {w: encrypt_summary(rows[w], restores[w]) for w in writers}
    out.update(by[writers[0]])
    out["by_writer"] = by
    return out


def must_show(doc):
    m = {}
    md = doc.get("must_show_diff_40mib_4g")
    if md:
        m["diff_40mib_in_4g_guest"] = {
            "bytes_mib": md["diff_bytes_max_mib"], "du_mib": md["diff_du_mib_max"],
            "limit_mib": 48, "ok": md["under_48_mib"],
            "pause_ms_median": md["pause_ms"]["median"], "pause_goal_ms": 10,
            "pause_goal_met": md["pause_under_10_ms_goal"]}
    rs = (doc.get("restore") or {}).get("by_ram_size", {})
    lo, hi = rs.get("256M"), rs.get("8G")
    if lo and hi:
        def r(kind, key):
            return ratio(med(hi[kind].get(key)), med(lo[kind].get(key)))
        r_ready = r("counter_warm", "ready_ms")
        m["restore_8g_over_256m"] = {
            "ready_ms_256M": med(lo["counter_warm"].get("ready_ms")),
            "ready_ms_8G": med(hi["counter_warm"].get("ready_ms")),
            "ratio_ready": r_ready,
            "ratio_ready_stamper_chain": r("stamper_warm", "ready_ms"),
            "ratio_first_byte_stamper": r("stamper_warm", "first_byte_ms"),
            "ratio_first_tick_counter": r("counter_warm", "first_byte_ms"),
            "ratio_ready_evicted": r("counter_evicted", "ready_ms"),
            "ratio_cove_internal_restore": r("counter_warm", "cove_restore_ms"),
            "limit": 1.5, "ok": r_ready is not None and r_ready <= 1.5}
    en = doc.get("encrypt")
    if en:
        rt = en["ratios"]["diff_total_encrypted_over_plain"]
        m["encrypted_diff_over_plain"] = {
            "ratio_total": rt, "limit": 1.3, "ok": rt is not None and rt <= 1.3,
            "plain_ms": en["plain"]["diff_total_ms"]["median"],
            "encrypted_ms": en["encrypted"]["diff_total_ms"]["median"]}
    fk = (doc.get("fork") or {}).get("by_ram_size", {})
    for mem, row in fk.items():
        if row.get("count1_ms"):
            m["fork_%s_ms" % mem] = {"count1": row["count1_ms"]["median"],
                                     "count3": row["count3_ms"]["median"], "goal_ms": 50}
    return m


def kvm_usable():
    """True when /dev/kvm opens read-write and answers KVM_GET_API_VERSION (12)."""
    import fcntl
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return fcntl.ioctl(fd, 0xAE00) == 12
    except OSError:
        return False
    finally:
        os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cove", default=os.path.join(REPO_ROOT, "build", "cli", "cove"))
    ap.add_argument("--guests", default=os.path.join(REPO_ROOT, "build", "tests", "guests"))
    ap.add_argument("--work", default="/var/tmp",
                    help="parent of the scratch directory (a real disk, not tmpfs)")
    ap.add_argument("--out", default=os.path.join(SCRIPT_DIR, "results-snapshot.json"),
                    help="also write the JSON here ('-' for nowhere)")
    ap.add_argument("--sizes", default="1,16,64,256,1024", help="dirty sizes in MiB")
    ap.add_argument("--writers", default="uring,pwrite,uring_direct")
    ap.add_argument("--write-mem", default="4G")
    ap.add_argument("--write-procs", type=int, default=3,
                    help="processes per size and writer (1 Full + --write-diffs Diffs each)")
    ap.add_argument("--write-procs-1g", type=int, default=3, help="the same for 1 GiB")
    ap.add_argument("--write-diffs", type=int, default=2)
    ap.add_argument("--must-diffs", type=int, default=5)
    ap.add_argument("--restore-mems", default="256M,1G,4G,8G")
    ap.add_argument("--restore-runs", type=int, default=9)
    ap.add_argument("--fork-mems", default="256M,4G")
    ap.add_argument("--fork-runs", type=int, default=5)
    ap.add_argument("--encrypt-procs", type=int, default=3)
    ap.add_argument("--encrypt-restores", type=int, default=3)
    ap.add_argument("--encrypt-writers", default="default",
                    help="writers for the encrypt step, interleaved (e.g. uring_direct,pwrite)")
    ap.add_argument("--only", default="write,must,restore,fork,encrypt")
    ap.add_argument("--quick", action="store_true",
                    help="a few seconds (tools/test runs it): one 256 MiB restore, no JSON file; "
                         "without a usable /dev/kvm only the inputs are checked")
    a = ap.parse_args()
    if a.quick:
        a.only, a.restore_mems, a.restore_runs, a.out = "restore", "256M", 1, "-"
        missing = [f for f in (a.cove, os.path.join(os.path.dirname(a.cove), "cove-vmm"),
                               os.path.join(a.guests, "stamper"), os.path.join(a.guests, "counter"))
                   if not os.path.exists(f)]
        if missing or not kvm_usable():
            print(json.dumps({"quick": "inputs checked only" if missing else
                              "inputs checked only: no usable /dev/kvm on this host",
                              "errors": ["missing: %s" % f for f in missing]}, indent=2))
            return 1 if missing else 0
    a.cove = os.path.abspath(a.cove)
    a.guests = os.path.abspath(a.guests)
    a.sizes = [int(x) for x in a.sizes.split(",")]
    a.writers = [w for w in a.writers.split(",") if w]
    a.encrypt_writers = [w for w in a.encrypt_writers.split(",") if w]
    for w in a.encrypt_writers:
        if w not in WRITERS:
            ap.error("unknown writer %s (one of %s)" % (w, ", ".join(WRITERS)))
    for w in a.writers:
        if w not in WRITERS:
            ap.error("unknown writer %s (one of %s)" % (w, ", ".join(WRITERS)))
    a.restore_mems = a.restore_mems.split(",")
    a.fork_mems = a.fork_mems.split(",")
    only = set(a.only.split(","))

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _on_signal)
    if fs_of(a.work)[1] == "tmpfs":
        log("warning: %s is tmpfs: writes measure RAM, not a disk" % a.work)
    work = tempfile.mkdtemp(prefix="cove-snapbench-", dir=a.work)
    # A private copy: others rebuild build/cli/cove while we run, and a fork clone is spawned
    # from /proc/self/exe, which is gone once the file is replaced.
    a.cove_src = a.cove
    a.cove = os.path.join(work, "cove")
    shutil.copy2(a.cove_src, a.cove)
    # cove run/restore exec cove-vmm from cove's own directory: it comes along.
    shutil.copy2(os.path.join(os.path.dirname(a.cove_src), "cove-vmm"),
                 os.path.join(work, "cove-vmm"))
    doc = {"metadata": metadata(a, work), "seconds": {}}
    errors = []
    t_start = time.perf_counter()
    try:
        for f in (a.cove_src, os.path.join(a.guests, "stamper"), os.path.join(a.guests, "counter")):
            if not os.path.exists(f):
                raise SystemExit("missing: %s" % f)
        steps = [("must", "must_show_diff_40mib_4g", lambda: bench_must_diff(a, work)),
                 ("write", "write", lambda: bench_write(a, work, errors)),
                 ("restore", "restore", lambda: bench_restore(a, work, errors)),
                 ("fork", "fork", lambda: bench_fork(a, work, errors)),
                 ("encrypt", "encrypt", lambda: bench_encrypt(a, work, errors))]
        for key, name, fn in steps:
            if key not in only:
                continue
            log("== %s" % name)
            t = time.perf_counter()
            try:
                doc[name] = fn()
            except (BenchError, OSError, KeyError, ValueError) as e:
                errors.append("%s: %s: %s" % (name, type(e).__name__, e))
                log("%s FAILED: %s" % (name, e))
                doc[name] = None
            doc["seconds"][name] = round(time.perf_counter() - t, 1)
    finally:
        kill_everything()
        shutil.rmtree(work, ignore_errors=True)
    doc["seconds"]["total"] = round(time.perf_counter() - t_start, 1)
    doc["metadata"]["host_load_avg_at_end"] = list(os.getloadavg())
    doc["errors"] = errors
    doc = {"must_show": must_show(doc), **doc}
    text = json.dumps(doc, indent=2)
    print(text, flush=True)
    if a.out and a.out != "-":
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
