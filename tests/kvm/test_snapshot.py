#!/usr/bin/env python3
"""Snapshots on this machine's /dev/kvm with the test guests: full and incremental layers, restore
in a new process, exactness of the incremental layer, kill -9 during a write, bad files, fork."""
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
import zlib

from covetest import (COVE, Vm, chain_file, chain_json, check, guest, main, open_fds, run_cove,
                      run_each, wait_file_bytes)

PAGE = 4096
HDR = 4096


def chain(d):
    return chain_json(d)


class Layer:
    """Reads a memory layer file the way cove wrote it (snapshot/mem_layer.h)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.hdr = f.read(HDR)
            magic, version, page, self.id, self.parent, self.ram, self.pages, bm_off, bm_len, \
                self.data_off, self.present, self.stored = struct.unpack_from("<8sIIQQQQQQQQQ",
                                                                             self.hdr)
            check(magic == b"COVEMEM\0" and version == 1 and page == PAGE, f"{path}: bad header")
            f.seek(bm_off)
            bm = f.read(bm_len)
        self.path = path
        self.set = {w * 64 + b for w, (word,) in enumerate(struct.iter_unpack("<Q", bm))
                    for b in range(64) if word >> b & 1}

    def page(self, pfn):
        with open(self.path, "rb") as f:
            f.seek(self.data_off + pfn * PAGE)
            return f.read(PAGE)


def test_restore_continues(d):
    """Paused counter: the restored process's first tick is exactly the next one."""
    with Vm(guest("counter"), extra=["--snapshot-dir", d]) as vm:
        vm.wait_output("tick 3\n")
        t = vm.pause_at_tick()
        body = vm.snapshot("Full")
        check(body["layer_id"] == 1 and body["stored_pages"] > 0, f"full layer: {body}")
        vm.stop(signal.SIGKILL)
    with Vm(None, restore=d) as r:
        r.wait_output(f"tick {t + 1}\n")
        first = re.findall(rb"tick (\d+)\n", r.out)[0]
        check(int(first) == t + 1, f"restored counter started at {first}, expected {t + 1}")
        r.wait_output(f"tick {t + 3}\n")


def test_cpu_template(d):
    """--cpu-template: the chain records the template's name and every restore applies it again
    (the KVM box's e2e test shows what it hides; PVM here does not hide CPUID from the guest)."""
    with Vm(guest("counter"), extra=["--snapshot-dir", d, "--cpu-template", "baseline-v2",
                                     "--log-level", "info"]) as vm:
        vm.wait_output("tick 2\n")
        t = vm.pause_at_tick()
        vm.snapshot("Full")
        vm.stop(signal.SIGKILL)
        err = vm.stderr()
    check("CPU template baseline-v2" in err, f"run: no template line in {err[-600:]!r}")
    states = sorted(glob.glob(os.path.join(d, "state-*")))
    check(states and b'"cpu_template":"baseline-v2"' in open(states[-1], "rb").read(),
          f"the state file does not name the template: {states}")
    with Vm(None, restore=d, extra=["--log-level", "info"]) as r:
        r.wait_output(f"tick {t + 1}\n")
        r.stop(signal.SIGKILL)
        err = r.stderr()
    check("CPU template baseline-v2" in err, f"restore: no template line in {err[-600:]!r}")
    bad = run_cove(["run", "--kernel", guest("counter"), "--cpu-template", "T2"])
    check(bad.returncode == 2 and "'T2' is not a CPU template cove has (baseline-v2)" in bad.stderr,
          f"cove run --cpu-template T2: {bad.returncode} {bad.stderr!r}")


def test_incremental_exact(d):
    """A Diff layer holds the pages stamped since the Full one (plus the guest's own stack/data),
    with their contents; restore of the chain continues the stamper."""
    base, count, stride = 0x1000000, 100, 3
    cmdline = f"stamp_base={base:#x} stamp_count={count} stamp_stride={stride} rounds=3"
    with Vm(guest("stamper"), extra=["--cmdline", cmdline, "--snapshot-dir", d]) as vm:
        vm.wait_output("stamped round 1 pages 100\n")
        full = vm.snapshot("Full")
        vm.send_input(b"n")
        vm.wait_output("stamped round 2 pages 100\n")
        diff = vm.snapshot("Diff")
        check(diff["snapshot_type"] == "Diff" and diff["layer_id"] == 2, f"diff: {diff}")
        c = chain(d)
        check([l["id"] for l in c["layers"]] == [1, 2], f"chain: {c}")
        lay = Layer(os.path.join(d, c["layers"][1]["mem"]))
        want = {(base >> 12) + (count + i) * stride for i in range(count)}
        check(want <= lay.set, f"diff misses stamped pages: {sorted(want - lay.set)[:8]}")
        extra = lay.set - want
        # The stack and .data pages of the guest, plus page tables the walk marked dirty.
        allowed = {0x9, 0xA, 0xB, 0x110, 0x111, 0x7, 0x20, 0x100}
        check(extra <= allowed, f"diff holds unexpected pages: {sorted(hex(p) for p in extra)}")
        check(diff["pages"] == len(lay.set), f"API said {diff['pages']} pages, file holds {len(lay.set)}")
        for i in (0, 57, 99):
            pfn = (base >> 12) + (count + i) * stride
            (v,) = struct.unpack_from("<Q", lay.page(pfn))
            check(v == (2 << 32 | i), f"page {pfn:#x} holds {v:#x}")
        check(full["stored_pages"] >= 100, f"full: {full}")
        vm.stop(signal.SIGKILL)
    with Vm(None, restore=d) as r:
        r.send_input(b"n")
        r.wait_output("stamped round 3 pages 100\n")


def test_kill_during_write(d):
    """kill -9 while a large layer is being written: the previous layer stays restorable."""
    count = 40000  # 160 MiB of stamped pages
    cmdline = f"stamp_base={0x1000000:#x} stamp_count={count} stamp_stride=1 rounds=3"
    with Vm(guest("stamper"), mem="1G", extra=["--cmdline", cmdline, "--snapshot-dir", d]) as vm:
        vm.wait_output(f"stamped round 1 pages {count}\n", timeout=60)
        vm.snapshot("Full")
        vm.send_input(b"n")
        vm.wait_output(f"stamped round 2 pages {count}\n", timeout=60)
        before = chain(d)
        result = {}

        def req():
            try:
                result["r"] = vm.request("PUT", "/snapshot/create", {"snapshot_type": "Diff"},
                                         timeout=60)
            except Exception as e:  # the process dies under it
                result["e"] = e
        t = threading.Thread(target=req)
        t.start()
        # Kill once the temporary layer file exists, i.e. during the write.
        end = time.monotonic() + 20
        while time.monotonic() < end and not any(f.endswith(".tmp") for f in os.listdir(d)):
            time.sleep(0.0005)
        vm.stop(signal.SIGKILL)
        t.join()
    after = chain(d)
    tmp_left = [f for f in os.listdir(d) if f.endswith(".tmp")]
    check(after == before, f"chain.json changed although the write was killed: {after['layers']}")
    check(tmp_left, "the kill landed after the write finished; the test proves nothing")
    with Vm(None, restore=d) as r:
        # Layer 1 is round 1: the stamper waits for a key to stamp round 2 again.
        r.send_input(b"n")
        r.wait_output(f"stamped round 2 pages {count}\n", timeout=60)


def expect_restore_fails(d, what, want):
    r = run_cove(["restore", d], timeout=30)
    check(r.returncode == 1, f"{what}: exit {r.returncode}, stderr {r.stderr!r}")
    # A file changed after its commit is refused by its digest first (snapshot/DIGEST.md); the
    # format checks behind it are the unit tests' and test_chain_hostile's (digests resealed).
    check((want in r.stderr or "SHA-256 does not match" in r.stderr) and
          r.stderr.count("\n") == 1,
          f"{what}: want one line with {want!r} (or the digest's), got {r.stderr!r}")
    check(r.stdout == "", f"{what}: the guest ran: {r.stdout!r}")


def test_bad_files(d):
    with Vm(guest("counter"), extra=["--snapshot-dir", d]) as vm:
        vm.wait_output("tick 2\n")
        vm.snapshot("Full")
        vm.stop(signal.SIGKILL)
    c = chain(d)
    mem = os.path.join(d, c["layers"][0]["mem"])
    state = os.path.join(d, c["layers"][0]["state"])
    keep = tempfile.mkdtemp(prefix="cove-snap-orig-")
    for f in (mem, state, chain_file(d)):
        shutil.copy2(f, keep)

    def reset():
        for f in os.listdir(keep):
            shutil.copy2(os.path.join(keep, f), d)

    # Truncated memory layer.
    with open(mem, "r+b") as f:
        f.truncate(os.path.getsize(mem) - PAGE)
    expect_restore_fails(d, "truncated layer", "truncated")
    reset()
    # One flipped byte in the state file.
    with open(state, "r+b") as f:
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 0x40]))
    expect_restore_fails(d, "corrupt state", "corrupt")
    reset()
    # Wrong version in the layer header, with a valid header CRC.
    with open(mem, "r+b") as f:
        hdr = bytearray(f.read(HDR))
        struct.pack_into("<I", hdr, 8, 99)
        struct.pack_into("<I", hdr, HDR - 4, zlib.crc32(bytes(hdr[:HDR - 4])))
        f.seek(0)
        f.write(hdr)
    expect_restore_fails(d, "wrong layer version", "version 99 is not supported")
    reset()
    # Truncated state file.
    with open(state, "r+b") as f:
        f.truncate(100)
    expect_restore_fails(d, "truncated state", "truncated")
    reset()
    # The chain's newest commit that is not JSON (its only one here), and a missing chain.
    with open(chain_file(d), "w") as f:
        f.write("{nope")
    expect_restore_fails(d, "bad chain.json", "not valid JSON")
    empty = tempfile.mkdtemp(prefix="cove-snap-empty-")
    expect_restore_fails(empty, "no chain", "no snapshot chain")
    os.rmdir(empty)
    reset()
    # After all that, the original files still restore.
    with Vm(None, restore=d) as r:
        r.wait_output("tick 3\n")
    shutil.rmtree(keep)


def test_fork(d):
    """PUT /fork starts clones that each continue the counter on their own."""
    with Vm(guest("counter"), extra=["--snapshot-dir", d]) as vm:
        vm.wait_output("tick 2\n")
        t0 = time.monotonic()
        status, body = vm.request("PUT", "/fork", {"count": 2}, timeout=60)
        dt = time.monotonic() - t0
        check(status == 200 and len(body["clones"]) == 2, f"fork: {status} {body}")
        pids = [c["pid"] for c in body["clones"]]
        try:
            for c in body["clones"]:
                check(os.path.exists(c["api_sock"]), f"clone has no API socket: {c}")
                # The parent's console (its stdout pipe here) and sockets do not leak in.
                fds = set(open_fds(c["pid"]))
                parent = {os.readlink(f"/proc/{vm.proc.pid}/fd/1")}
                check(not (fds & parent), f"clone {c['pid']} holds the parent's console: {fds}")
                out = wait_file_bytes(c["console"], b"tick", 20)
                check(b"tick" in out, f"clone {c['pid']} printed nothing in 20 s: {out[-200:]!r}")
            check(vm.alive(), "the parent died")
            print(f"fork of 2 clones: {dt * 1000:.1f} ms")
        finally:
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for c in body["clones"]:
                shutil.rmtree(c["snapshot_dir"], ignore_errors=True)
                for f in (c["console"],):
                    if os.path.exists(f):
                        os.unlink(f)


def kill_clones(clones):
    for c in clones:
        try:
            os.kill(c["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_fork_identity(d):
    """A clone's fresh identity (RNG seed, clock) is part of the fork: PUT /fork and cove fork
    (which calls it) report per clone whether it was delivered, and never pretend for a guest
    without an agent."""
    uds = d + "-v.sock"
    with Vm(guest("counter"), extra=["--snapshot-dir", d]) as vm:
        vm.wait_output("tick 1\n")
        status, body = vm.request("PUT", "/fork", {"count": 2}, timeout=60)
        check(status == 200, f"fork: {status} {body}")
        kill_clones(body["clones"])
        for c in body["clones"]:
            check(c["identity"].startswith("not delivered") and "no vsock device" in c["identity"],
                  f"PUT /fork clone identity: {c}")
        r = subprocess.run([COVE, "fork", vm.sock, "-n", "1"], capture_output=True, text=True,
                           timeout=60)
        clones = json.loads(r.stdout)["clones"]
        kill_clones(clones)
        check(r.returncode == 1 and r.stderr.count("\n") == 1 and "no vsock device" in r.stderr,
              f"cove fork without an agent: {r.returncode} {r.stderr!r}")
        check(clones[0]["identity"] == body["clones"][0]["identity"],
              f"cove fork and PUT /fork differ: {clones[0]} vs {body['clones'][0]}")
        r = subprocess.run([COVE, "fork", vm.sock, "--no-identity"], capture_output=True,
                           text=True, timeout=60)
        clones = json.loads(r.stdout)["clones"]
        kill_clones(clones)
        check(r.returncode == 0 and clones[0]["identity"] == "not requested",
              f"cove fork --no-identity: {r.returncode} {r.stderr!r} {clones}")
        status, reply = vm.request("PUT", "/fork", {"count": 1, "identity": "yes"})
        check(status == 400 and "identity" in reply["fault_message"], f"{status} {reply}")
    # A vsock device but no agent in the guest: said so, after a bounded wait.
    with Vm(guest("counter"), extra=["--snapshot-dir", d + "-2", "--vsock-cid", "9",
                                     "--vsock-uds", uds]) as vm:
        vm.wait_output("tick 1\n")
        t0 = time.monotonic()
        status, body = vm.request("PUT", "/fork", {"count": 2}, timeout=60)
        dt = time.monotonic() - t0
        check(status == 200, f"fork: {status} {body}")
        kill_clones(body["clones"])
        for c in body["clones"]:
            check(c["identity"].startswith("not delivered") and "no guest agent" in c["identity"],
                  f"clone identity with vsock but no agent: {c}")
        check(dt < 25, f"two agentless clones took {dt:.1f} s (deadlines not in parallel?)")
    for f in glob.glob(d + "-*"):
        if os.path.isdir(f):
            shutil.rmtree(f, ignore_errors=True)
        else:
            os.unlink(f)


def test_api_errors(d):
    with Vm(guest("counter")) as vm:
        vm.wait_output("tick 1\n")
        for body, want in [({"snapshot_type": "Full"}, "no snapshot directory"),
                           ({"snapshot_type": "Diff", "snapshot_dir": d}, "is not allowed"),
                           ({"snapshot_type": "Half"}, "snapshot_type"),
                           ({"snapshot_type": "Full", "mem_file_path": "/x"}, "mem_file_path"),
                           ({"snapshot_type": "Full", "bogus": 1}, "unknown field")]:
            status, reply = vm.request("PUT", "/snapshot/create", body)
            check(status == 400 and want in reply.get("fault_message", ""),
                  f"{body}: {status} {reply}")
        check(vm.alive(), "bad snapshot requests stopped the VM")
        vm.wait_output("tick 3\n")


def sums(d):
    out = {}
    for f in sorted(os.listdir(d)):
        with open(os.path.join(d, f), "rb") as fh:
            out[f] = hashlib.sha256(fh.read()).hexdigest()
    return out


def test_api_dir_confined(d):
    """The API's snapshot_dir names only --snapshot-dir or ROOT/NAME under --snapshot-root: a
    Full snapshot pointed at another sandbox's chain would remove the files it lists."""
    victim = d + "-victim"
    own = d + "-own"
    root = d + "-root"
    os.mkdir(root, 0o700)
    try:
        with Vm(guest("counter"), extra=["--snapshot-dir", victim]) as vm:
            vm.wait_output("tick 1\n")
            vm.snapshot("Full")
            vm.stop(signal.SIGKILL)
        before = sums(victim)
        with Vm(guest("counter"), extra=["--snapshot-dir", own, "--snapshot-root", root]) as vm:
            vm.wait_output("tick 1\n")
            for bad in (victim, root, root + "/../" + os.path.basename(victim), root + "/a/b",
                        root + "/.hidden", own + "/x", "/tmp"):
                for kind in ("Full", "Diff"):
                    status, reply = vm.request("PUT", "/snapshot/create",
                                               {"snapshot_type": kind, "snapshot_dir": bad})
                    msg = (reply or {}).get("fault_message", "")
                    check(status == 400 and "is not allowed" in msg and "\n" not in msg,
                          f"snapshot_dir {bad}: {status} {reply}")
            check(sums(victim) == before, "the other sandbox's chain changed")
            check(not os.path.exists(os.path.join(root, "a")), "a directory appeared under root")
            # Its own directory and ROOT/NAME work.
            for good in (own, os.path.join(root, "named")):
                status, reply = vm.request("PUT", "/snapshot/create",
                                           {"snapshot_type": "Full", "snapshot_dir": good})
                check(status == 200, f"snapshot_dir {good}: {status} {reply}")
            check(os.path.exists(os.path.join(root, "named", "chain.json")), "no chain under root")
            check(vm.alive(), "refused snapshot requests stopped the VM")
    finally:
        for x in (victim, own, root):
            shutil.rmtree(x, ignore_errors=True)


def run_all():
    run_each((test_restore_continues, test_cpu_template, test_incremental_exact, test_kill_during_write,
              test_bad_files, test_fork, test_fork_identity, test_api_errors,
              test_api_dir_confined), "cove-snap-")


if __name__ == "__main__":
    main(run_all)
