#!/usr/bin/env python3
"""A guest that keeps a virtio-blk queue full forever (ring 3, native speed) must not starve the
event loop: GET /vm and SIGTERM are each answered within 1 s. Two floods: GET_ID requests on a
raw disk (each completes at once), and 64 MiB reads on a copy-on-write overlay (synchronous
overlay I/O on the event loop thread)."""
import os
import re
import signal
import time

from covetest import Failure, Vm, check, guest, main

DEADLINE = 1.0


def wait_requests(vm, name, least, timeout=30):
    """Until the guest reports at least `least` requests done. It prints the count it has at
    1, 10, 100... or past them: requests completed together make the first line "2 requests"."""
    end = time.monotonic() + timeout
    while True:
        counts = [int(n) for n in re.findall(rb"flood: (\d+) requests\n", vm.out)]
        if counts and max(counts) >= least:
            return
        if time.monotonic() > end:
            raise Failure(f"{name}: no report of {least} requests in {timeout} s; console so "
                          f"far: {vm.out[-400:]!r}")
        vm.read_console(0.2)


def flood(name, disk_opt, cmdline, min_requests):
    with Vm(guest("flood"), extra=["--disk", disk_opt, "--cmdline", cmdline]) as vm:
        vm.wait_output("from ring 3\n", timeout=30)
        # The device has answered requests: the flood is on.
        wait_requests(vm, name, min_requests)
        time.sleep(0.5)
        for i in range(3):
            t0 = time.monotonic()
            try:
                status, body = vm.request("GET", "/vm", timeout=DEADLINE + 1)
            except OSError as e:
                raise Failure(f"{name}: GET /vm #{i} got no answer within {DEADLINE + 1} s "
                              f"while the guest floods: {e}")
            took = time.monotonic() - t0
            check(status == 200 and body["state"] == "Running", f"{name}: GET /vm: {status} {body}")
            check(took < DEADLINE, f"{name}: GET /vm #{i} took {took:.2f} s (limit {DEADLINE} s)")
            time.sleep(0.2)
        vm.read_console(0.1)
        if not vm.alive():
            raise Failure(f"{name}: cove died during the flood: {vm.stderr()}")
        t0 = time.monotonic()
        vm.proc.send_signal(signal.SIGTERM)
        try:
            rc = vm.proc.wait(DEADLINE + 1)
        except Exception:
            raise Failure(f"{name}: SIGTERM not handled within {DEADLINE + 1} s while the guest floods")
        took = time.monotonic() - t0
        check(took < DEADLINE, f"{name}: SIGTERM took {took:.2f} s (limit {DEADLINE} s)")
        check(rc == 0, f"{name}: exit status {rc} after SIGTERM: {vm.stderr()}")
        print(f"{name}: GET /vm and SIGTERM answered; {vm.out.decode(errors='replace').strip().splitlines()[-1]}")


def test():
    tmp = os.environ.get("TMPDIR", "/tmp")
    disk = os.path.join(tmp, f"cove-flood-{os.getpid()}.img")
    ovl = disk + ".ovl"
    try:
        with open(disk, "wb") as f:
            f.truncate(128 << 20)
        flood("GET_ID flood", disk, "flood.read=0", 1000)
        flood("overlay read flood", f"{disk},overlay={ovl}", "flood.read=1", 1)
    finally:
        for p in (disk, ovl, ovl + ".map"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


if __name__ == "__main__":
    main(test)
