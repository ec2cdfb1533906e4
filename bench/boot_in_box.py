#!/usr/bin/env python3
"""Runs inside the KVM box: boot-to-init of cove vs QEMU microvm on the same kernel and initramfs.

Time is taken from just before exec of the VMM to the moment cove-init's ready line shows on
the VMM's stdout. Runs alternate between the VMMs so drift hits both. Writes /work/out/boot.json.
"""
import base64
import os
import re
import select
import statistics
import subprocess
import sys
import time

from box_vmm import qemu_microvm, write_results

RUNS = int(os.environ.get("BENCH_RUNS", "7"))
COVE = "/work/cove"
KERNELS = {"bzImage": "/work/kernel/bzImage", "vmlinux": "/work/kernel/vmlinux"}
INITRD = "/work/rootfs/initramfs.cpio.gz"
CMDLINE = ("console=ttyS0 reboot=k panic=-1 quiet cove.cmd="
           + base64.b64encode(b"true").decode())
READY = re.compile(rb"cove-init: ready (\d+\.\d+)")
TIMEOUT = 120.0


def cove_argv(kernel):
    return [COVE, "run", "--kernel", kernel, "--initrd", INITRD, "--mem", "256M",
            "--cmdline", CMDLINE]


def qemu_argv(kernel):
    return qemu_microvm(kernel, INITRD, CMDLINE)


def one(argv):
    """Returns (ms to ready line, guest uptime at ready, ms to exit, exit code)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL)
    buf = b""
    t_ready = uptime = None
    deadline = t0 + TIMEOUT
    fd = p.stdout.fileno()
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            p.kill()
            break
        r, _, _ = select.select([fd], [], [], left)
        if not r:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        if t_ready is None:
            m = READY.search(buf)
            if m:
                t_ready = time.perf_counter()
                uptime = float(m.group(1))
    rc = p.wait()
    t_exit = time.perf_counter()
    err = p.stderr.read().decode(errors="replace")
    if t_ready is None:
        return {"error": f"no ready line (rc={rc}): {err[-300:]} {buf[-300:]!r}"}
    return {"ready_ms": (t_ready - t0) * 1000, "guest_uptime_s": uptime,
            "exit_ms": (t_exit - t0) * 1000, "rc": rc}


def summary(samples, key):
    vals = [s[key] for s in samples if key in s]
    if not vals:
        return None
    return {"median": round(statistics.median(vals), 1), "min": round(min(vals), 1),
            "max": round(max(vals), 1), "n": len(vals), "samples": [round(v, 1) for v in vals]}


def main():
    out = {"runs": RUNS, "what": "exec of the VMM -> 'cove-init: ready' on its console, inside the KVM box "
           "(kvm_amd under QEMU TCG); same kernel, initramfs and command line for both VMMs",
           "cmdline": CMDLINE, "results": {}}
    for kname, kpath in KERNELS.items():
        res = {"cove": [], "qemu": []}
        one(cove_argv(kpath))  # warm the page cache for both
        one(qemu_argv(kpath))
        for i in range(RUNS):
            for vmm, argv in (("cove", cove_argv(kpath)), ("qemu", qemu_argv(kpath))):
                r = one(argv)
                res[vmm].append(r)
                print(f"{kname} {vmm} run {i}: {r}", file=sys.stderr, flush=True)
        entry = {}
        for vmm in ("cove", "qemu"):
            entry[vmm] = {"ready_ms": summary(res[vmm], "ready_ms"),
                          "guest_uptime_at_ready_s": summary(res[vmm], "guest_uptime_s"),
                          "exit_ms": summary(res[vmm], "exit_ms"),
                          "errors": [r["error"] for r in res[vmm] if "error" in r]}
        c, q = entry["cove"]["ready_ms"], entry["qemu"]["ready_ms"]
        entry["ratio_cove_over_qemu"] = round(c["median"] / q["median"], 3) if c and q else None
        out["results"][kname] = entry
    return write_results("boot", out)


if __name__ == "__main__":
    sys.exit(main())
