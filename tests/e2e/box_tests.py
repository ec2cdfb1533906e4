#!/usr/bin/env python3
"""e2e suite, run inside the KVM box: cove boots our Linux guest and cove-init runs commands.

Layout inside the box (tests/e2e/run puts it there): /work/cove, /work/kernel/{bzImage,vmlinux},
/work/rootfs/initramfs.cpio.gz, /work/rootfs/rootfs.ext4. Prints one PASS/FAIL line per test and 'N passed, N failed'.
"""
import base64
import os
import re
import subprocess
import sys
import time

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


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def cmdline_for(cmd=None, extra=""):
    parts = [BASE_CMDLINE]
    if cmd is not None:
        parts.append("cove.cmd=" + base64.b64encode(cmd.encode()).decode())
    if extra:
        parts.append(extra)
    return " ".join(parts)


def boot(kernel, cmd=None, vcpus=1, mem="256M", extra="", initrd=INITRD, timeout=BOOT_TIMEOUT,
         disks=()):
    """Runs cove to completion; returns (rc, console text, stderr text, seconds)."""
    args = [COVE, "run", "--kernel", kernel, "--mem", mem, "--vcpus", str(vcpus),
            "--cmdline", cmdline_for(cmd, extra)]
    if initrd:
        args += ["--initrd", initrd]
    for d in disks:
        args += ["--disk", d]
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


def test_disk_bad_options():
    for spec, want in (("/tmp/x,overlay=/tmp/y", "not supported yet"), (",ro", "no path"),
                       ("/tmp/x,rw", "unknown option")):
        r = subprocess.run([COVE, "run", "--kernel", BZIMAGE, "--disk", spec], capture_output=True,
                           text=True, timeout=30)
        check(r.returncode == 2 and want in r.stderr, f"--disk {spec}: rc={r.returncode} {r.stderr!r}")
    r = subprocess.run([COVE, "run", "--kernel", BZIMAGE, "--disk", "/work/no-such-disk"],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode == 1 and "no-such-disk" in r.stderr, f"missing disk: rc={r.returncode} {r.stderr!r}")


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
    test_disk_bad_options,
]


def main():
    only = sys.argv[1:]
    passed = failed = 0
    for t in TESTS:
        if only and t.__name__ not in only:
            continue
        t0 = time.monotonic()
        try:
            t()
        except Failure as e:
            failed += 1
            print(f"FAIL {t.__name__} ({time.monotonic() - t0:.1f}s): {e}", flush=True)
            continue
        except Exception as e:  # a crash in the test itself is a failure too
            failed += 1
            print(f"FAIL {t.__name__}: {type(e).__name__}: {e}", flush=True)
            continue
        passed += 1
        print(f"PASS {t.__name__} ({time.monotonic() - t0:.1f}s)", flush=True)
    print(f"e2e: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
