#!/usr/bin/env python3
"""Runs inside the KVM box: guest-side disk throughput of cove vs QEMU microvm.

Both VMMs boot the same kernel with the initramfs as root and one raw 256 MiB test disk
(/tmp/disk.img, on the box's tmpfs) as their only virtio-blk disk, so it is /dev/vda in both.
Inside the guest busybox dd moves data with O_DIRECT (iflag=direct / oflag=direct, so the
guest page cache is out of the way) and the time is read from /proc/uptime (10 ms ticks)
around each dd. Figures: sequential 1 MiB writes and reads (128 MiB), sequential 4 KiB
direct reads and writes (16 MiB; the small-block figure: random 4 KiB reads would need one dd
process per block in busybox sh, which would measure fork/exec, not the disk).
QEMU uses its default -drive cache mode (writeback, thread pool AIO); cove uses io_uring.
Runs alternate between the VMMs so drift hits both. "cove_overlay" is cove with the same disk
as the base of a fresh copy-on-write overlay (devices/OVERLAY.md; synchronous I/O, copy-up). Writes /work/out/disk.json.
"""
import base64
import json
import os
import re
import statistics
import subprocess
import sys

from box_vmm import qemu_microvm, write_results

RUNS = int(os.environ.get("BENCH_RUNS", "1"))
COVE = "/work/cove"
KERNEL = "/work/kernel/bzImage"
INITRD = "/work/rootfs/initramfs.cpio.gz"
DISK = "/tmp/disk.img"
DISK_MIB = 256
OVERLAY = "/tmp/disk.ovl"  # cove_overlay: a fresh copy-on-write overlay over DISK each run
TIMEOUT = 180.0  # a run takes ~15 s in the box; a hang is recorded, not waited out

# (name, dd arguments, MiB moved)
TESTS = [
    ("seq_write_1M", "if=/dev/zero of=/dev/vda bs=1M count=128 oflag=direct conv=fsync", 128),
    ("seq_read_1M", "if=/dev/vda of=/dev/null bs=1M count=128 iflag=direct", 128),
    ("seq_read_4k", "if=/dev/vda of=/dev/null bs=4k count=4096 iflag=direct", 16),
    ("seq_write_4k", "if=/dev/zero of=/dev/vda bs=4k count=4096 oflag=direct conv=fsync", 16),
]
SCRIPT = "t() { read a b < /proc/uptime; echo $a; }; " + " ".join(
    f"echo BEGIN {name}; s=$(t); dd {args} 2>/dev/null; rc=$?; e=$(t); echo BENCH {name} $rc $s $e;"
    for name, args, _ in TESTS)
CMDLINE = ("console=ttyS0 reboot=k panic=-1 quiet cove.cmd="
           + base64.b64encode(SCRIPT.encode()).decode())
LINE = re.compile(r"BENCH (\S+) (\d+) (\d+\.\d+) (\d+\.\d+)")


def cove_argv():
    return [COVE, "run", "--kernel", KERNEL, "--initrd", INITRD, "--mem", "256M",
            "--disk", DISK, "--cmdline", CMDLINE]


def cove_overlay_argv():
    return [COVE, "run", "--kernel", KERNEL, "--initrd", INITRD, "--mem", "256M",
            "--disk", DISK + ",overlay=" + OVERLAY, "--cmdline", CMDLINE]


def qemu_argv():
    return qemu_microvm(KERNEL, INITRD, CMDLINE,
                        ["-drive", f"id=d0,file={DISK},format=raw,if=none",
                         "-device", "virtio-blk-device,drive=d0"])


def fresh_disk():
    # Same starting state for every run: a fully allocated image of random-ish data.
    with open(DISK, "wb") as f:
        block = os.urandom(1 << 20)
        for _ in range(DISK_MIB):
            f.write(block)


def one(argv):
    fresh_disk()
    for p in (OVERLAY, OVERLAY + ".map"):
        if os.path.exists(p):
            os.unlink(p)
    try:
        r = subprocess.run(argv, capture_output=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        return {"error": f"timeout after {TIMEOUT}s; console tail {(e.stdout or b'')[-1500:]!r}"}
    out = r.stdout.decode(errors="replace")
    res = {}
    for m in LINE.finditer(out):
        name, rc, s, e = m.group(1), int(m.group(2)), float(m.group(3)), float(m.group(4))
        mib = next(t[2] for t in TESTS if t[0] == name)
        if rc != 0:
            res[name] = {"error": f"dd exited {rc}"}
            continue
        secs = max(e - s, 0.01)  # /proc/uptime ticks are 10 ms
        res[name] = {"mib_s": round(mib / secs, 2), "seconds": round(e - s, 2)}
    if len(res) != len(TESTS):
        res["error"] = f"rc={r.returncode} {r.stderr.decode(errors='replace')[-300:]} {out[-600:]!r}"
    return res


def summary(samples, name):
    vals = [s[name]["mib_s"] for s in samples if name in s and "mib_s" in s[name]]
    if not vals:
        return None
    return {"median_mib_s": round(statistics.median(vals), 2), "min": min(vals), "max": max(vals),
            "n": len(vals), "samples": vals}


def merge(paths):
    """Host side: one JSON from the per-box raw samples (bench/disk runs one box per round)."""
    raw = {"cove": [], "qemu": [], "cove_overlay": []}
    boxes_failed = 0
    for p in paths:
        try:
            with open(p) as f:
                r = json.load(f)["raw"]
        except (OSError, ValueError, KeyError):
            boxes_failed += 1
            continue
        for vmm in raw:
            raw[vmm] += r.get(vmm, [])
    out = summarize(raw, len(paths))
    out["boxes_failed"] = boxes_failed
    return out


def summarize(raw, runs):
    out = {"runs": runs,
           "what": "guest-side busybox dd with O_DIRECT on a raw 256 MiB virtio-blk disk (/dev/vda, "
                   "image on the box's tmpfs), initramfs root, inside the KVM box (kvm_amd under "
                   "QEMU TCG); time from /proc/uptime (10 ms) around each dd; seq_*_4k is the "
                   "small-block figure (sequential, not random, 4 KiB requests)",
           "tests": {t[0]: t[1] for t in TESTS}, "results": {}}
    for name, _, _ in TESTS:
        c, q = summary(raw["cove"], name), summary(raw["qemu"], name)
        o = summary(raw["cove_overlay"], name)
        out["results"][name] = {
            "cove": c, "qemu": q, "cove_overlay": o,
            "ratio_cove_over_qemu": round(c["median_mib_s"] / q["median_mib_s"], 3)
            if c and q and q["median_mib_s"] else None,
            "ratio_cove_overlay_over_cove": round(o["median_mib_s"] / c["median_mib_s"], 3)
            if c and o and c["median_mib_s"] else None}
    out["errors"] = {vmm: [r["error"] for r in raw[vmm] if "error" in r] for vmm in raw}
    return out


def main():
    if sys.argv[1:2] == ["--merge"]:
        out = merge(sys.argv[2:])
        print(json.dumps(out, indent=1))
        return 0
    raw = {"cove": [], "qemu": [], "cove_overlay": []}
    for i in range(RUNS):
        for vmm, argv in (("cove", cove_argv()), ("qemu", qemu_argv()),
                          ("cove_overlay", cove_overlay_argv())):
            r = one(argv)
            raw[vmm].append(r)
            print(f"{vmm} run {i}: {r}", file=sys.stderr, flush=True)
    out = summarize(raw, RUNS)
    out["raw"] = raw
    return write_results("disk", out)


if __name__ == "__main__":
    sys.exit(main())
