#!/usr/bin/env python3
"""e2e suite, run inside the KVM box: cove boots our Linux guest and cove-init runs commands.

Layout inside the box (tests/e2e/run puts it there): /work/cove, /work/kernel/{bzImage,vmlinux},
/work/rootfs/initramfs.cpio.gz, /work/rootfs/rootfs.ext4, and beside this file the other
*_tests.py modules and covetest.py (tests/lib, the shared test library). Prints one PASS/FAIL
line per test and 'N passed, N failed'.
"""
import base64
import hashlib
import importlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

# covetest.py sits beside this file in the KVM box (/work) and in tests/lib in the tree (for
# `agent_tests.py --local` run by hand; meson sets PYTHONPATH).
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from covetest import Failure, Skip, check, vsock_connect  # noqa: E402

COVE = os.environ.get("COVE", "/work/cove")
KDIR = os.environ.get("KERNEL_DIR", "/work/kernel")
INITRD = os.environ.get("INITRD", "/work/rootfs/initramfs.cpio.gz")
ROOTFS = os.environ.get("ROOTFS", "/work/rootfs/rootfs.ext4")
DISK_COPY = "/tmp/rootfs-copy.ext4"
DISK_ROOT = "root=/dev/vda rw init=/sbin/cove-init"
BZIMAGE = os.path.join(KDIR, "bzImage")
VMLINUX = os.path.join(KDIR, "vmlinux")
BOOT_TIMEOUT = float(os.environ.get("E2E_BOOT_TIMEOUT", "240"))
BASE_CMDLINE = "console=ttyS0 reboot=k panic=-1 quiet"
READY = re.compile(r"cove-init: ready (\d+\.\d+)")


def cmdline_for(cmd=None, extra=""):
    parts = [BASE_CMDLINE]
    if cmd is not None:
        parts.append("cove.cmd=" + base64.b64encode(cmd.encode()).decode())
    if extra:
        parts.append(extra)
    return " ".join(parts)


def boot(kernel, cmd=None, vcpus=1, mem="256M", extra="", initrd=INITRD, timeout=BOOT_TIMEOUT,
         disks=(), cove_args=()):
    """Runs cove to completion; returns (rc, console text, stderr text, seconds)."""
    args = [COVE, "run", "--kernel", kernel, "--mem", mem, "--vcpus", str(vcpus),
            "--cmdline", cmdline_for(cmd, extra)]
    if initrd:
        args += ["--initrd", initrd]
    for d in disks:
        args += ["--disk", d]
    args += list(cove_args)
    t0 = time.monotonic()
    try:
        r = subprocess.run(args, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace")
        raise Failure(f"cove did not finish within {timeout}s; console tail: {out[-1500:]}")
    dt = time.monotonic() - t0
    return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace"), dt


def expect_run(kernel, cmd, want_exit, want_out=None, vcpus=1):
    rc, out, err, dt = boot(kernel, cmd, vcpus=vcpus)
    check(rc == 0, f"cove exited {rc}; stderr {err.strip()!r}; console tail {out[-1500:]!r}")
    m = READY.search(out)
    check(m, f"no cove-init ready line; console tail {out[-1500:]!r}")
    check(f"cove-init: exit {want_exit}" in out,
          f"no 'cove-init: exit {want_exit}'; console tail {out[-800:]!r}")
    if want_out is not None:
        check(want_out in out, f"{want_out!r} not in console; tail {out[-800:]!r}")
    print(f"    ready at guest uptime {m.group(1)} s, cove wall time {dt:.2f} s")
    return out


def test_bzimage_command_exit_code():
    expect_run(BZIMAGE, "echo hello-from-guest; uname -s; exit 7", 7, "hello-from-guest")


def test_vmlinux_pvh_command():
    expect_run(VMLINUX, "echo pvh-$((6*7))", 0, "pvh-42")


def test_two_vcpus_online():
    # The last line checks that output still queued for the UART when the command ends is not
    # lost (a tty hang-up used to discard it while the other vCPU was draining it).
    out = expect_run(BZIMAGE, "echo cpus=$(grep -c ^processor /proc/cpuinfo); echo last-line", 0,
                     "cpus=2", vcpus=2)
    check("last-line" in out, f"tail of the command's output lost: {out[-300:]!r}")


def test_four_vcpus_vmlinux():
    expect_run(VMLINUX, "echo cpus=$(grep -c ^processor /proc/cpuinfo)", 0, "cpus=4", vcpus=4)


def test_timer_sleep():
    # A working clock-event device (TSC-deadline LAPIC timer): sleep returns.
    out = expect_run(BZIMAGE, "sleep 1; echo slept", 0, "slept")
    check("APIC timer disabled" not in out, out[-500:])


def test_guest_reboot_is_clean():
    # busybox `reboot` asks PID 1 (a signal); cove-init stops the VM through the kernel's reset.
    rc, out, err, _ = boot(BZIMAGE, "reboot; sleep 60")
    check("stop requested (Terminated)" in out, f"cove-init did not see the reboot request: {out[-600:]!r}")
    check(rc == 0, f"reboot: cove exited {rc}: {err.strip()!r}; tail {out[-600:]!r}")
    check(READY.search(out), f"guest never reached cove-init; tail {out[-600:]!r}")


def test_guest_poweroff_is_clean():
    rc, out, err, _ = boot(BZIMAGE, "poweroff; sleep 60")
    check("stop requested" in out, f"cove-init did not see the poweroff request: {out[-600:]!r}")
    check(rc == 0, f"poweroff: cove exited {rc}: {err.strip()!r}; tail {out[-600:]!r}")
    check(READY.search(out), f"guest never reached cove-init; tail {out[-600:]!r}")


def test_kernel_panic_is_a_failure():
    # No init to run: the kernel panics ("No working init found" / "VFS: Unable to mount root").
    rc, out, err, _ = boot(BZIMAGE, initrd=None, extra="init=/nonexistent")
    check(rc == 1, f"panicking guest: cove exited {rc}, want 1; stderr {err!r}")
    check("guest kernel panicked" in err and "Kernel panic" in err,
          f"stderr does not say the guest panicked: {err!r}")


def test_missing_kernel_file():
    r = subprocess.run([COVE, "run", "--kernel", "/work/no-such-kernel"], capture_output=True,
                       text=True, timeout=30)
    check(r.returncode == 1 and "no-such-kernel" in r.stderr,
          f"missing kernel: rc={r.returncode} {r.stderr!r}")
    check(len(r.stderr.strip().splitlines()) == 1, f"want one line: {r.stderr!r}")


def test_corrupt_kernel_file():
    data = open(BZIMAGE, "rb").read()
    path = "/tmp/truncated-bzImage"
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    r = subprocess.run([COVE, "run", "--kernel", path], capture_output=True, text=True, timeout=30)
    check(r.returncode == 1 and "truncated" in r.stderr, f"truncated bzImage: rc={r.returncode} {r.stderr!r}")
    vm = open(VMLINUX, "rb").read()
    bad = bytearray(vm)
    bad[18:20] = (3).to_bytes(2, "little")  # e_machine = EM_386
    path = "/tmp/bad-vmlinux"
    with open(path, "wb") as f:
        f.write(bad)
    r = subprocess.run([COVE, "run", "--kernel", path], capture_output=True, text=True, timeout=30)
    check(r.returncode == 1 and "x86-64" in r.stderr, f"wrong-machine vmlinux: rc={r.returncode} {r.stderr!r}")


def disk_boot(cmd, disk, root=DISK_ROOT):
    rc, out, err, dt = boot(BZIMAGE, cmd, initrd=None, extra=root, disks=[disk])
    check(rc == 0, f"cove exited {rc}; stderr {err.strip()!r}; console tail {out[-1500:]!r}")
    check(READY.search(out), f"no cove-init ready line; console tail {out[-1500:]!r}")
    check("cove-init: exit 0" in out, f"no 'cove-init: exit 0'; console tail {out[-1500:]!r}")
    print(f"    cove wall time {dt:.2f} s")
    return out


SHA = re.compile(r"SHA=([0-9a-f]{64})")
disk_state = {}


def test_disk_root_write():
    # A private copy: the box's /work copy stays pristine for the other tests.
    subprocess.run(["cp", ROOTFS, DISK_COPY], check=True)
    out = disk_boot("grep -q '^/dev/root / ext4 rw' /proc/mounts && echo ROOT-RW; "
                    "echo serial=$(cat /sys/block/vda/serial); "
                    "head -c 3000000 /dev/urandom > /persist.bin && sync && "
                    "echo SHA=$(sha256sum /persist.bin | cut -d' ' -f1)", DISK_COPY)
    check("ROOT-RW" in out, f"root is not ext4 rw on /dev/vda: {out[-1500:]!r}")
    check("serial=cove-vda" in out, f"GET_ID serial missing: {out[-1500:]!r}")
    m = SHA.search(out)
    check(m, f"no checksum line: {out[-1500:]!r}")
    disk_state["sha"] = m.group(1)
    print(f"    wrote /persist.bin sha256 {m.group(1)[:16]}...")


def test_disk_second_boot_reads_back():
    check("sha" in disk_state, "needs test_disk_root_write first")
    out = disk_boot("echo SHA=$(sha256sum /persist.bin | cut -d' ' -f1)", DISK_COPY)
    m = SHA.search(out)
    check(m, f"no checksum line: {out[-1500:]!r}")
    check(m.group(1) == disk_state["sha"],
          f"checksum after reboot {m.group(1)} != written {disk_state['sha']}")


def test_disk_read_only():
    ro = "/tmp/rootfs-ro.ext4"
    subprocess.run(["cp", ROOTFS, ro], check=True)
    before = open(ro, "rb").read()
    out = disk_boot("echo ro=$(cat /sys/block/vda/ro); "
                    "if mount -o remount,rw /; then echo REMOUNT-OK; else echo REMOUNT-REFUSED; fi; "
                    "if echo x > /newfile; then echo WRITE-OK; else echo WRITE-REFUSED; fi; "
                    "dd if=/dev/zero of=/dev/vda bs=512 count=1 conv=fsync 2>/dev/null "
                    "&& echo RAW-OK || echo RAW-REFUSED",
                    ro + ",ro", root="root=/dev/vda ro init=/sbin/cove-init")
    check("ro=1" in out, f"/sys/block/vda/ro is not 1: {out[-1500:]!r}")
    check("REMOUNT-REFUSED" in out and "REMOUNT-OK" not in out, f"remount rw worked: {out[-1500:]!r}")
    check("WRITE-REFUSED" in out, f"write on ro disk worked: {out[-1500:]!r}")
    check("RAW-REFUSED" in out, f"raw write on ro disk worked: {out[-1500:]!r}")
    check(open(ro, "rb").read() == before, "the read-only image changed")


def test_disk_discard():
    # fstrim sends VIRTIO_BLK_T_DISCARD; cove punches holes in the image (the box's /tmp is tmpfs).
    img = "/tmp/rootfs-trim.ext4"
    subprocess.run(["cp", ROOTFS, img], check=True)
    before = os.stat(img).st_blocks * 512
    size = os.stat(img).st_size
    out = disk_boot("head -c 8000000 /dev/urandom > /big && sync && "
                    "echo SHA=$(sha256sum /bin/busybox | cut -d' ' -f1) && rm /big && sync && "
                    "fstrim -v /; echo TRIM=$?", img)
    check("TRIM=0" in out, f"fstrim failed: {out[-1500:]!r}")
    after = os.stat(img).st_blocks * 512
    print(f"    image allocated {before >> 10} KiB before, {after >> 10} KiB after write+rm+fstrim")
    # The 8 MB written and removed were punched out, as was any free space cp had allocated.
    check(after <= before + (1 << 20) and after < size - 8000000,
          f"discard did not free space: {before} -> {after} bytes of {size}")
    out2 = disk_boot("echo SHA=$(sha256sum /bin/busybox | cut -d' ' -f1)", img)
    check(SHA.search(out).group(1) == SHA.search(out2).group(1), "busybox changed after fstrim")

DD_TIME = re.compile(r"DD=(\d+)\+0 ([0-9.]+) ([0-9.]+)")


def dd_read(spec, bs, count):
    """Boots with the root disk given as spec and reads bs*count bytes of it with O_DIRECT
    (around the guest's page cache); returns (seconds by the guest's /proc/uptime, the sha256
    of what the reads returned)."""
    out = disk_boot(f"a=$(cut -d' ' -f1 /proc/uptime); "
                    f"s=$(dd if=/dev/vda bs={bs} count={count} iflag=direct 2>/tmp/dd.err | "
                    f"sha256sum | cut -d' ' -f1); b=$(cut -d' ' -f1 /proc/uptime); "
                    f"echo DD=$(grep 'records in' /tmp/dd.err | cut -d' ' -f1) $a $b; "
                    f"echo SHA=$s", spec, root="root=/dev/vda ro init=/sbin/cove-init")
    m = DD_TIME.search(out)
    check(m and int(m.group(1)) == count, f"dd did not read {count} blocks: {out[-1500:]!r}")
    sha = SHA.search(out)
    check(sha, f"no checksum line: {out[-1500:]!r}")
    return float(m.group(3)) - float(m.group(2)), sha.group(1)


def test_disk_rate_limits():
    # Token buckets on the real device: a limit slows the guest's reads to about its rate (the
    # bucket starts full with one second's worth), and every byte still arrives.
    ro = "/tmp/rootfs-rate.ext4"
    subprocess.run(["cp", ROOTFS, ro], check=True)
    with open(ro, "rb") as f:
        head = f.read(4 << 20)
    want, want_small = hashlib.sha256(head).hexdigest(), hashlib.sha256(head[:400 * 4096]).hexdigest()
    free_s, free_sha = dd_read(ro + ",ro", 65536, 64)
    bw_s, bw_sha = dd_read(ro + ",ro,bw=1M", 65536, 64)
    iops_s, iops_sha = dd_read(ro + ",ro,iops=100", 4096, 400)
    print(f"    4 MiB O_DIRECT reads: {free_s:.2f} s unlimited, {bw_s:.2f} s at bw=1M; "
          f"400 x 4 KiB: {iops_s:.2f} s at iops=100")
    check(free_sha == want and bw_sha == want and iops_sha == want_small,
          f"the guest read other bytes than the image holds: {free_sha[:12]} {bw_sha[:12]} "
          f"{iops_sha[:12]}, image {want[:12]} {want_small[:12]}")
    # 4 MiB at 1 MiB/s with 1 MiB in the bucket at the start: about 3 s.
    check(2.5 <= bw_s <= 6 and bw_s > 2 * free_s, f"bw=1M: 4 MiB took {bw_s:.2f} s")
    # 400 requests at 100/s with 100 in the bucket: about 3 s.
    check(2.5 <= iops_s <= 6, f"iops=100: 400 reads took {iops_s:.2f} s")


def test_disk_bad_options():
    for spec, want in (("/tmp/x,ro,overlay=/tmp/y", "do not go together"), (",ro", "no path"),
                       ("/tmp/x,rw", "unknown option")):
        r = subprocess.run([COVE, "run", "--kernel", BZIMAGE, "--disk", spec], capture_output=True,
                           text=True, timeout=30)
        check(r.returncode == 2 and want in r.stderr, f"--disk {spec}: rc={r.returncode} {r.stderr!r}")
    r = subprocess.run([COVE, "run", "--kernel", BZIMAGE, "--disk", "/work/no-such-disk"],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode == 1 and "no-such-disk" in r.stderr, f"missing disk: rc={r.returncode} {r.stderr!r}")


OVL_BASE = "/tmp/ovl-base.ext4"
WHO = re.compile(r"WHO=(\S+)")


def sha256_file(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def test_disk_overlay():
    # Copy-on-write: ext4 root on an overlay over a read-only base; two sandboxes share the base.
    subprocess.run(["cp", ROOTFS, OVL_BASE], check=True)
    for p in ("/tmp/ovl-a", "/tmp/ovl-a.map", "/tmp/ovl-b", "/tmp/ovl-b.map"):
        if os.path.exists(p):
            os.unlink(p)
    base_sha = sha256_file(OVL_BASE)
    a, b = OVL_BASE + ",overlay=/tmp/ovl-a", OVL_BASE + ",overlay=/tmp/ovl-b"
    out = disk_boot("head -c 3000000 /dev/urandom > /ovl.bin && echo only-a > /who && sync && "
                    "echo SHA=$(sha256sum /ovl.bin | cut -d' ' -f1)", a)
    m = SHA.search(out)
    check(m, f"no checksum line: {out[-1500:]!r}")
    check(os.path.exists("/tmp/ovl-a") and os.path.exists("/tmp/ovl-a.map"),
          "overlay files were not created")
    check(sha256_file(OVL_BASE) == base_sha, "the base image changed after the first boot")
    print(f"    overlay data {os.stat('/tmp/ovl-a').st_blocks * 512 >> 10} KiB allocated, "
          f"map {os.stat('/tmp/ovl-a.map').st_size} bytes")
    # Second boot on the same overlay: the data is there.
    out2 = disk_boot("echo SHA=$(sha256sum /ovl.bin | cut -d' ' -f1); echo WHO=$(cat /who)", a)
    m2 = SHA.search(out2)
    check(m2 and m2.group(1) == m.group(1), f"checksum after reboot differs: {out2[-1500:]!r}")
    check("WHO=only-a" in out2, f"/who lost after reboot: {out2[-1500:]!r}")
    # A second sandbox on the same base sees none of the first one's writes.
    out3 = disk_boot("if [ -e /ovl.bin ]; then echo SEES-A; fi; echo only-b > /who && sync; "
                     "echo WHO=$(cat /who)", b)
    check("SEES-A" not in out3 and "WHO=only-b" in out3, f"overlay b: {out3[-1500:]!r}")
    out4 = disk_boot("echo WHO=$(cat /who)", a)
    check("WHO=only-a" in out4, f"overlay a sees b's write: {out4[-1500:]!r}")
    out5 = disk_boot("echo WHO=$(cat /who); if [ -e /ovl.bin ]; then echo SEES-A; fi", b)
    check("WHO=only-b" in out5 and "SEES-A" not in out5, f"overlay b after reboot: {out5[-1500:]!r}")
    check(sha256_file(OVL_BASE) == base_sha, "the base image changed")


def test_disk_overlay_wrong_base():
    # A map made for another disk size is refused with a clear error before the guest runs.
    check(os.path.exists("/tmp/ovl-a.map"), "needs test_disk_overlay first")
    other = "/tmp/ovl-other.ext4"
    subprocess.run(["cp", ROOTFS, other], check=True)
    with open(other, "ab") as f:
        f.write(b"\0" * 65536)
    r = subprocess.run([COVE, "run", "--kernel", BZIMAGE, "--disk", other + ",overlay=/tmp/ovl-a"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and "was made for a" in r.stderr,
          f"mismatched base: rc={r.returncode} {r.stderr!r}")
    with open("/tmp/ovl-bad.map", "wb") as f:
        f.write(b"COVEOVLM" + b"\xff" * 40)
    r = subprocess.run([COVE, "run", "--kernel", BZIMAGE, "--disk", OVL_BASE + ",overlay=/tmp/ovl-bad"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and "unsupported version" in r.stderr,
          f"corrupt map: rc={r.returncode} {r.stderr!r}")


# --- virtio-vsock (host side: Firecracker's hybrid Unix-socket protocol) ---
VSOCK_DISK = os.environ.get("VSOCK_DISK", "/work/vsock.ext4")
VSOCK_UDS = "/tmp/cove-vsock.sock"
VSOCK_BYTES = int(os.environ.get("E2E_VSOCK_BYTES", str(100 * 1024 * 1024)))
VSOCK_TIMEOUT = float(os.environ.get("E2E_VSOCK_TIMEOUT", "1200"))
SHA_LINE = re.compile(r"\b([0-9a-f]{64})  -")


def vsock_start(cmd):
    """Starts cove with the helper disk (/mnt/vsock_guest) and vsock cid 3; returns (proc, out file)."""
    out = tempfile.TemporaryFile()
    args = [COVE, "run", "--kernel", BZIMAGE, "--initrd", INITRD, "--mem", "512M",
            "--cmdline", cmdline_for("mount -t ext4 -o ro /dev/vda /mnt && " + cmd),
            "--disk", VSOCK_DISK + ",ro", "--vsock-cid", "3", "--vsock-uds", VSOCK_UDS]
    p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return p, out


def vsock_finish(p, out, timeout=VSOCK_TIMEOUT):
    try:
        rc = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        rc = None
    out.seek(0)
    text = out.read().decode(errors="replace")
    check(rc == 0, f"cove exited {rc}; output tail {text[-1500:]!r}")
    return text


def vsock_host_connect(p, port, deadline):
    """Connects through the hybrid socket until the guest accepts; returns (socket, OK line)."""
    return vsock_connect(VSOCK_UDS, port, deadline, proc=p, pause=0.5, timeout=60)


def test_vsock_host_to_guest():
    data = os.urandom(VSOCK_BYTES)
    want = hashlib.sha256(data).hexdigest()
    p, out = vsock_start("/mnt/vsock_guest listen 5000 | sha256sum")
    try:
        s, ok = vsock_host_connect(p, 5000, time.monotonic() + BOOT_TIMEOUT)
        check(re.fullmatch(r"OK \d+", ok), f"bad reply {ok!r}")
        s.settimeout(300)
        t0 = time.monotonic()
        view = memoryview(data)
        for i in range(0, len(data), 1 << 20):
            s.sendall(view[i:i + (1 << 20)])
        s.shutdown(socket.SHUT_WR)
        while s.recv(4096):  # EOF once the guest closed its end
            pass
        dt = time.monotonic() - t0
        s.close()
    finally:
        text = vsock_finish(p, out)
    m = SHA_LINE.search(text)
    check(m, f"no checksum from the guest; tail {text[-1500:]!r}")
    check(m.group(1) == want, f"guest got sha256 {m.group(1)}, host sent {want}")
    print(f"    host->guest {VSOCK_BYTES / 1e6:.0f} MB in {dt:.1f} s: {VSOCK_BYTES / 1e6 / dt:.1f} MB/s ({ok})")


def test_vsock_guest_to_host():
    path = VSOCK_UDS + "_6000"
    if os.path.exists(path):
        os.unlink(path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    srv.settimeout(BOOT_TIMEOUT)
    p, out = vsock_start(f"/mnt/vsock_guest connect 2 6000 {VSOCK_BYTES} | sha256sum; sleep 1")
    try:
        c, _ = srv.accept()
        c.settimeout(300)
        h = hashlib.sha256()
        n = 0
        t0 = time.monotonic()
        while True:
            b = c.recv(1 << 20)
            if not b:
                break
            h.update(b)
            n += len(b)
        dt = time.monotonic() - t0
        c.close()
    finally:
        srv.close()
        os.unlink(path)
        text = vsock_finish(p, out)
    check(n == VSOCK_BYTES, f"host received {n} bytes, want {VSOCK_BYTES}")
    m = SHA_LINE.search(text)
    check(m, f"no checksum from the guest; tail {text[-1500:]!r}")
    check(m.group(1) == h.hexdigest(), f"guest sent sha256 {m.group(1)}, host got {h.hexdigest()}")
    print(f"    guest->host {n / 1e6:.0f} MB in {dt:.1f} s: {n / 1e6 / dt:.1f} MB/s")


def test_vsock_guest_connect_refused():
    # Nobody listens on port 7000: the guest's connect fails; the device then still serves 6001.
    for port in (7000, 6001):
        if os.path.exists(f"{VSOCK_UDS}_{port}"):
            os.unlink(f"{VSOCK_UDS}_{port}")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(f"{VSOCK_UDS}_6001")
    srv.listen(1)
    got = []

    def serve():
        c, _ = srv.accept()
        data = b""
        while True:
            b = c.recv(65536)
            if not b:
                break
            data += b
        got.append(data)
        c.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    p, out = vsock_start("/mnt/vsock_guest connect 2 7000 10; echo RC1=$?; "
                         "/mnt/vsock_guest connect 2 6001 1000 | sha256sum; sleep 1")
    try:
        text = vsock_finish(p, out)
    finally:
        srv.close()
        os.unlink(f"{VSOCK_UDS}_6001")
    check("RC1=5" in text, f"connect to a closed port did not fail; tail {text[-1500:]!r}")
    check(re.search(r"connect: (Connection reset by peer|Connection refused)", text),
          f"no refused/reset error; tail {text[-1500:]!r}")
    th.join(5)
    check(got and len(got[0]) == 1000, f"second connection got {[len(g) for g in got]} bytes")
    m = SHA_LINE.search(text)
    check(m and m.group(1) == hashlib.sha256(got[0]).hexdigest(), "checksum mismatch on port 6001")


def test_vsock_parallel_streams():
    # Four host->guest streams at once share the rx queue; each arrives intact.
    ports = (5001, 5002, 5003, 5004)
    size = 16 * 1024 * 1024
    datas = {port: os.urandom(size) for port in ports}
    cmd = ("for p in 5001 5002 5003 5004; do (/mnt/vsock_guest listen $p | sha256sum > /tmp/$p) & "
           "done; wait; for p in 5001 5002 5003 5004; do echo P$p=$(cut -c1-64 /tmp/$p); done")
    p, out = vsock_start(cmd)
    errors = []

    def push(port):
        try:
            s, _ = vsock_host_connect(p, port, time.monotonic() + BOOT_TIMEOUT)
            s.settimeout(300)
            s.sendall(datas[port])
            s.shutdown(socket.SHUT_WR)
            while s.recv(4096):
                pass
            s.close()
        except Exception as e:  # reported below, from the main thread
            errors.append(f"port {port}: {type(e).__name__}: {e}")

    t0 = time.monotonic()
    threads = [threading.Thread(target=push, args=(port,), daemon=True) for port in ports]
    for th in threads:
        th.start()
    for th in threads:
        th.join(VSOCK_TIMEOUT)
    dt = time.monotonic() - t0
    text = vsock_finish(p, out)
    check(not errors, "; ".join(errors))
    for port in ports:
        m = re.search(rf"P{port}=([0-9a-f]{{64}})", text)
        check(m, f"no checksum for port {port}; tail {text[-1500:]!r}")
        check(m.group(1) == hashlib.sha256(datas[port]).hexdigest(), f"port {port}: checksum mismatch")
    print(f"    4 x {size >> 20} MiB in parallel in {dt:.1f} s (including boot)")


def test_vsock_bad_options():
    for args, want in ((["--vsock-cid", "3"], "go together"),
                       (["--vsock-uds", "/tmp/x.sock"], "go together"),
                       (["--vsock-cid", "2", "--vsock-uds", "/tmp/x.sock"], "--vsock-cid"),
                       (["--vsock-cid", "abc", "--vsock-uds", "/tmp/x.sock"], "--vsock-cid")):
        r = subprocess.run([COVE, "run", "--kernel", BZIMAGE] + args, capture_output=True, text=True)
        check(r.returncode == 2 and want in r.stderr and r.stderr.count("\n") == 1,
              f"{args}: rc={r.returncode} {r.stderr!r}")


# --- virtio-rng (cove run --rng): a device added through the device table alone ---
def test_virtio_rng():
    cmd = ("echo rng=$(cat /sys/class/misc/hw_random/rng_current); "
           "a=$(head -c 32 /dev/hwrng | od -An -tx1 | tr -d ' \\n'); "
           "b=$(head -c 32 /dev/hwrng | od -An -tx1 | tr -d ' \\n'); "
           "echo a=$a; echo b=$b; [ ${#a} -eq 64 ] && [ \"$a\" != \"$b\" ] && echo rng-differ")
    rc, out, err, _ = boot(BZIMAGE, cmd, cove_args=["--rng"])
    check(rc == 0, f"cove exited {rc}; stderr {err.strip()!r}; console tail {out[-1500:]!r}")
    m = re.search(r"rng=(\S+)", out)
    check(m and m.group(1).startswith("virtio_rng"),
          f"rng_current does not name virtio_rng: {out[-800:]!r}")
    check("rng-differ" in out, f"two reads of /dev/hwrng did not differ: {out[-800:]!r}")
    rc, _, err, _ = boot(BZIMAGE, "true", cove_args=["--rng=0"], timeout=20)
    check(rc == 2 and "--rng" in err, f"--rng=0: exit {rc}, stderr {err.strip()!r}")


TESTS = [
    test_bzimage_command_exit_code,
    test_vmlinux_pvh_command,
    test_two_vcpus_online,
    test_four_vcpus_vmlinux,
    test_timer_sleep,
    test_guest_reboot_is_clean,
    test_guest_poweroff_is_clean,
    test_kernel_panic_is_a_failure,
    test_missing_kernel_file,
    test_corrupt_kernel_file,
    test_disk_root_write,
    test_disk_second_boot_reads_back,
    test_disk_read_only,
    test_disk_discard,
    test_disk_rate_limits,
    test_disk_bad_options,
    test_disk_overlay,
    test_disk_overlay_wrong_base,
    test_vsock_bad_options,
    test_vsock_guest_connect_refused,
    test_vsock_host_to_guest,
    test_vsock_guest_to_host,
    test_vsock_parallel_streams,
    test_virtio_rng,
]


def all_tests(modules=None, without=()):
    """This file's tests ("box"), then those of every other *_tests.py module beside it
    (snapshot, agent, crypto, lifecycle): each exports a TESTS list and may use this module's
    helpers. modules: only these (by short name); without: all but these."""
    def wanted(short):
        return (modules is None or short in modules) and short not in without

    tests = list(TESTS) if wanted("box") else []
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    for name in sorted(os.listdir(here)):
        if name.endswith("_tests.py") and name != os.path.basename(__file__):
            if wanted(name[:-len("_tests.py")]):
                tests += importlib.import_module(name[:-3]).TESTS
    return tests


# A test that hangs fails by name instead of stalling the box: the longest test takes about a
# minute here (one sets a longer time_limit of its own: containers' Debian Python image). While
# one runs the box prints a line a minute, so kvm-box's freeze watch (no output and QEMU idle)
# still tells a frozen box from a test waiting on something.
TEST_LIMIT = int(os.environ.get("E2E_TEST_LIMIT", "300"))


class TestOverran(BaseException):  # not an Exception: a test's own `except Exception` lets it by
    pass


def _test_overran(signum, frame):
    print(f"    test overran its limit; cove threads now:\n{_cove_threads()}", flush=True)
    raise TestOverran("still running after its limit (E2E_TEST_LIMIT, or the test's own "
                      "time_limit)")


class _Heartbeat:
    def __init__(self, name):
        self.name, self.t0, self.done = name, time.monotonic(), threading.Event()
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while not self.done.wait(60):
            print(f"    ... {self.name} still running ({time.monotonic() - self.t0:.0f} s)",
                  flush=True)

    def stop(self):
        self.done.set()


def _cove_threads():
    """Where each cove process's threads wait (for a test that overran), one line each."""
    lines = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if not os.path.basename(argv[0]).startswith(b"cove"):
                continue
            for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
                base = f"/proc/{pid}/task/{tid}"
                with open(f"{base}/comm") as f:
                    comm = f.read().strip()
                with open(f"{base}/wchan") as f:
                    wchan = f.read().strip()
                with open(f"{base}/syscall") as f:
                    sysc = f.read().split(" ")[0]
                lines.append(f"    pid {pid} {argv[1][:20].decode(errors='replace')} thread "
                             f"{comm}: wchan {wchan}, syscall {sysc}")
        except (OSError, IndexError):
            continue
    return "\n".join(lines) or "    no cove process left"


def main():
    """box_tests.py [--jailed] [--modules a,b | --without a,b] [--except T,U] [TEST...]: the e2e
    suite runs in several box
    runs (one per group of modules), each with its own time limit."""
    global COVE
    args, modules, without = sys.argv[1:], None, ()
    if args[:1] == ["--jailed"]:
        # Before the other modules are imported: they take COVE from here or the environment.
        os.environ["COVE_REAL"] = COVE
        COVE = os.environ["COVE"] = os.path.join(os.path.dirname(COVE), "cove-jailed")
        print(f"e2e: every cove run and cove restore runs jailed ({COVE})", flush=True)
        args = args[1:]
    if len(args) >= 2 and args[0] in ("--modules", "--without"):
        names = tuple(args[1].split(","))
        modules, without = (names, ()) if args[0] == "--modules" else (None, names)
        args = args[2:]
    # --except a,b: the module's other tests (a module too long for one box run is split into
    # two: one names its tests, the other runs the rest, so a new test lands in the second).
    skip_names = ()
    if len(args) >= 2 and args[0] == "--except":
        skip_names, args = tuple(args[1].split(",")), args[2:]
    only = args
    passed = failed = skipped = 0
    signal.signal(signal.SIGALRM, _test_overran)
    for t in all_tests(modules, without):
        if (only and t.__name__ not in only) or t.__name__ in skip_names:
            continue
        t0 = time.monotonic()
        beat = _Heartbeat(t.__name__)
        # A test that must take longer says so: test.time_limit (seconds).
        signal.alarm(max(TEST_LIMIT, getattr(t, "time_limit", 0)))
        try:
            t()
        except TestOverran as e:
            failed += 1
            print(f"FAIL {t.__name__} ({time.monotonic() - t0:.1f}s): {e}", flush=True)
            continue
        except Failure as e:
            failed += 1
            print(f"FAIL {t.__name__} ({time.monotonic() - t0:.1f}s): {e}", flush=True)
            continue
        except Skip as e:
            skipped += 1
            print(f"SKIP {t.__name__}: {e}", flush=True)
            continue
        except Exception as e:  # a crash in the test itself is a failure too
            failed += 1
            print(f"FAIL {t.__name__}: {type(e).__name__}: {e}", flush=True)
            continue
        finally:
            signal.alarm(0)
            beat.stop()
        passed += 1
        print(f"PASS {t.__name__} ({time.monotonic() - t0:.1f}s)", flush=True)
    print(f"e2e: {passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    if failed == 0 and passed == 0 and skipped:
        return 77  # nothing ran: meson reports the module as skipped
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
