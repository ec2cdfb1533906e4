#!/usr/bin/env python3
"""Runs inside the KVM box: vsock round-trip latency and random 4 KiB virtio-blk IOPS, cove vs
QEMU microvm.

Each VMM boots our kernel with the initramfs as root and two virtio-blk disks: a small read-only
ext4 image with the static helpers (bench/randio_guest.c, bench/vsock_bench_guest.c) and a raw
256 MiB test disk (/tmp/io.img on the box's tmpfs, refilled with random data before every run).
The guest finds the test disk by its size (the order of virtio-mmio devices differs between the
VMMs), runs randio_guest (O_DIRECT pread then pwrite at random 4 KiB-aligned offsets, fixed seed,
queue depth 1, CLOCK_MONOTONIC around each phase, the write phase ends with fdatasync), then
starts vsock_bench_guest listening on port 5000 (echoes everything back) for two connections:
  1. latency: N ping-pongs of a 64-byte message (perf_counter_ns around sendall + recv of 64 bytes);
  2. throughput: M 64-byte messages sent back to back (one sendall each) by one thread while
     another reads the echo; messages/s = M / time until the last echoed byte arrived.
cove: host side through the --vsock-uds Unix socket ("CONNECT 5000\\n" -> "OK <n>\\n").
QEMU: -device vhost-vsock-device,guest-cid=3 and an AF_VSOCK socket to (3, 5000); this needs
/dev/vhost-vsock, i.e. the vhost_vsock module and its dependencies, which bench/io adds to the
box (/work/mods, loaded here with insmod) because kvm-box only loads kvm-amd.
Writes /work/out/io.json. `--merge FILES...` (host side) merges per-box results.
"""
import base64
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

# covetest.py sits beside this file in the KVM box (/work) and in tests/lib in the tree.
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
from box_vmm import qemu_microvm, write_results  # noqa: E402
from covetest import recv_exact, vsock_connect  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "1"))
PINGS = int(os.environ.get("BENCH_PINGS", "2000"))
STREAM_MSGS = int(os.environ.get("BENCH_STREAM_MSGS", "20000"))
OPS = int(os.environ.get("BENCH_OPS", "4000"))
SEED = 12345
COVE = "/work/cove"
KERNEL = "/work/kernel/bzImage"
INITRD = "/work/rootfs/initramfs.cpio.gz"
HELPERS = "/work/io-helpers.ext4"
MODS = "/work/mods"
MOD_ORDER = ["vhost_iotlb", "vhost", "vsock", "vmw_vsock_virtio_transport_common", "vhost_vsock"]
DISK = "/tmp/io.img"
DISK_MIB = 256
UDS = "/tmp/cove-io-vsock.sock"
PORT = 5000
CID = 3
TIMEOUT = 80.0  # one VMM run takes ~20 s in the box; a hang is recorded, not waited out
MSG = 64

SCRIPT = (
    "T=; H=; for d in vda vdb; do s=$(cat /sys/block/$d/size); "
    f"if [ $s = {DISK_MIB * 2048} ]; then T=/dev/$d; else H=/dev/$d; fi; done; "
    "mount -t ext4 -o ro $H /mnt || echo IO_ERROR mount; "
    f"/mnt/randio_guest $T {DISK_MIB} {OPS} {SEED}; echo RANDIO_DONE $?; "
    f"/mnt/vsock_bench_guest {PORT} 2; echo VSOCK_DONE $?")
CMDLINE = ("console=ttyS0 reboot=k panic=-1 quiet cove.cmd="
           + base64.b64encode(SCRIPT.encode()).decode())
RANDIO = re.compile(r"RANDIO (read|write) (\d+) (\d+)")


def cove_argv():
    return [COVE, "run", "--kernel", KERNEL, "--initrd", INITRD, "--mem", "256M",
            "--disk", HELPERS + ",ro", "--disk", DISK, "--vsock-cid", str(CID),
            "--vsock-uds", UDS, "--cmdline", CMDLINE]


def qemu_argv(vsock):
    devices = ["-drive", f"id=h,file={HELPERS},format=raw,if=none,readonly=on",
               "-device", "virtio-blk-device,drive=h",
               "-drive", f"id=d0,file={DISK},format=raw,if=none",
               "-device", "virtio-blk-device,drive=d0"]
    if vsock:
        devices += ["-device", f"vhost-vsock-device,guest-cid={CID}"]
    return qemu_microvm(KERNEL, INITRD, CMDLINE, devices)


def load_vhost_vsock():
    """insmod vhost_vsock and its dependencies; returns None or an error string."""
    if os.path.exists("/dev/vhost-vsock"):
        return None
    for m in MOD_ORDER:
        path = os.path.join(MODS, m + ".ko")
        if not os.path.exists(path):
            return f"{path} missing (bench/io could not fetch the box kernel's modules)"
        r = subprocess.run(["insmod", path], capture_output=True, text=True)
        if r.returncode != 0 and "File exists" not in r.stderr:
            return f"insmod {m}: {r.stderr.strip()}"
    for _ in range(20):
        if os.path.exists("/dev/vhost-vsock"):
            return None
        time.sleep(0.1)
    return "/dev/vhost-vsock did not appear after loading vhost_vsock"


def fresh_disk():
    with open(DISK, "wb") as f:
        block = os.urandom(1 << 20)
        for _ in range(DISK_MIB):
            f.write(block)


class Console:
    """Collects the VMM's stdout in a thread; wait_for(regex) blocks until it shows up."""

    def __init__(self, proc):
        self.proc, self.buf, self.cv = proc, b"", threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while True:
            b = self.proc.stdout.read1(65536) if hasattr(self.proc.stdout, "read1") else self.proc.stdout.read(4096)
            with self.cv:
                if not b:
                    self.cv.notify_all()
                    return
                self.buf += b
                self.cv.notify_all()

    def text(self):
        with self.cv:
            return self.buf.decode(errors="replace")

    def wait_for(self, pat, deadline):
        with self.cv:
            while True:
                m = re.search(pat, self.buf.decode(errors="replace"))
                if m:
                    return m
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    return None
                self.cv.wait(0.5)


def connect_cove(deadline):
    return vsock_connect(UDS, PORT, deadline)[0]


def connect_qemu(deadline):
    while time.monotonic() < deadline:
        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
        s.settimeout(30)
        try:
            s.connect((CID, PORT))
            return s
        except (ConnectionRefusedError, ConnectionResetError, socket.timeout, OSError):
            s.close()
            time.sleep(0.2)
    raise TimeoutError("AF_VSOCK connect to the guest never succeeded")


def pct(vals, p):
    v = sorted(vals)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def vsock_tests(connect, deadline):
    res = {}
    s = connect(deadline)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20) if s.family == socket.AF_UNIX else None
    msg = bytes(range(MSG))
    for _ in range(20):  # warm-up
        s.sendall(msg)
        recv_exact(s, MSG)
    lat = []
    for _ in range(PINGS):
        t0 = time.perf_counter_ns()
        s.sendall(msg)
        r = recv_exact(s, MSG)
        lat.append((time.perf_counter_ns() - t0) / 1000)
        if r != msg:
            raise ValueError("echo mismatch")
    s.close()
    res["rtt_us"] = {"median": round(statistics.median(lat), 1), "p99": round(pct(lat, 99), 1),
                     "p90": round(pct(lat, 90), 1), "min": round(min(lat), 1), "n": len(lat)}
    s = connect(deadline)
    total = STREAM_MSGS * MSG
    err = []

    def writer():
        try:
            for _ in range(STREAM_MSGS):
                s.sendall(msg)
        except OSError as e:
            err.append(repr(e))

    t0 = time.perf_counter()
    th = threading.Thread(target=writer, daemon=True)
    th.start()
    got = 0
    while got < total:
        c = s.recv(1 << 16)
        if not c:
            break
        got += len(c)
    dt = time.perf_counter() - t0
    th.join(10)
    s.close()
    if got != total or err:
        res["stream_error"] = f"got {got}/{total} bytes {err}"
    else:
        res["stream_64B"] = {"msgs_per_s": round(STREAM_MSGS / dt), "mb_s": round(total / dt / 1e6, 2),
                             "seconds": round(dt, 3)}
    return res


def one(vmm, argv, connect):
    fresh_disk()
    if os.path.exists(UDS):
        os.unlink(UDS)
    deadline = time.monotonic() + TIMEOUT
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    con = Console(p)
    res = {}
    try:
        m = con.wait_for(r"RANDIO_DONE (\d+)", deadline)
        txt = con.text()
        for mm in RANDIO.finditer(txt):
            kind, ops, ns = mm.group(1), int(mm.group(2)), int(mm.group(3))
            res[f"rand_{kind}_4k"] = {"iops": round(ops / (ns / 1e9)), "ops": ops,
                                      "us_per_op": round(ns / 1e3 / ops, 1)}
        if not m or m.group(1) != "0":
            res["error"] = f"randio failed/timed out; tail {txt[-1200:]!r}"
        if connect is None:
            res["vsock_skipped"] = True
        elif m:
            try:
                res.update(vsock_tests(connect, deadline))
            except Exception as e:  # recorded, not fatal
                res["vsock_error"] = f"{type(e).__name__}: {e}; tail {con.text()[-600:]!r}"
        try:
            p.wait(timeout=max(5.0, deadline - time.monotonic()) if connect else 0.1)
        except subprocess.TimeoutExpired:
            pass
    finally:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(2)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return res


def med(samples, key, field):
    vals = [s[key][field] for s in samples if key in s and field in s[key]]
    if not vals:
        return None
    return {"median": round(statistics.median(vals), 1), "min": min(vals), "max": max(vals), "n": len(vals),
            "samples": vals}


FIELDS = [("rand_read_4k", "iops"), ("rand_write_4k", "iops"), ("rtt_us", "median"), ("rtt_us", "p99"),
          ("stream_64B", "msgs_per_s")]


def summarize(raw, runs, notes):
    out = {"runs": runs,
           "what": "inside the KVM box (kvm_amd under QEMU TCG): random 4 KiB O_DIRECT pread/pwrite, QD1, "
                   f"{OPS} ops each over a raw {DISK_MIB} MiB virtio-blk disk (tmpfs image; writes end with "
                   f"fdatasync); vsock echo of {MSG}-byte messages: {PINGS} ping-pongs (rtt_us) and "
                   f"{STREAM_MSGS} pipelined messages (stream_64B). cove: hybrid Unix socket; QEMU: vhost-vsock",
           "ratio_meaning": "ratio_cove_over_qemu = median cove / median QEMU: above 1 = cove faster for "
                            "iops and msgs_per_s; below 1 = cove faster for rtt_us",
           "notes": notes, "results": {}}
    for key, field in FIELDS:
        name = f"{key}.{field}"
        c, q = med(raw["cove"], key, field), med(raw["qemu"], key, field)
        r = {"cove": c, "qemu": q}
        if c and q and q["median"]:
            r["ratio_cove_over_qemu"] = round(c["median"] / q["median"], 3)
        out["results"][name] = r
    out["errors"] = {vmm: [{k: v for k, v in r.items() if "error" in k} for r in raw[vmm]
                           if any("error" in k for k in r)] for vmm in raw}
    return out


def merge(paths):
    raw = {"cove": [], "qemu": []}
    notes = []
    failed = 0
    for p in paths:
        try:
            with open(p) as f:
                j = json.load(f)
        except (OSError, ValueError):
            failed += 1
            continue
        for vmm in raw:
            raw[vmm] += j["raw"].get(vmm, [])
        for n in j.get("notes", []):
            if n not in notes:
                notes.append(n)
    out = summarize(raw, len(paths) - failed, notes)
    out["boxes_failed"] = failed
    return out


def main():
    if sys.argv[1:2] == ["--merge"]:
        print(json.dumps(merge(sys.argv[2:]), indent=1))
        return 0
    notes = []
    verr = load_vhost_vsock()
    if verr:
        notes.append(f"QEMU vsock skipped: {verr}")
    raw = {"cove": [], "qemu": []}
    for i in range(RUNS):
        for vmm, argv, conn in (("cove", cove_argv(), connect_cove),
                                ("qemu", qemu_argv(not verr), None if verr else connect_qemu)):
            r = one(vmm, argv, conn)
            raw[vmm].append(r)
            print(f"{vmm} run {i}: {json.dumps(r)}", file=sys.stderr, flush=True)
    out = summarize(raw, RUNS, notes)
    out["raw"] = raw
    return write_results("io", out)


if __name__ == "__main__":
    sys.exit(main())
