#!/usr/bin/env python3
"""Snapshots written by older builds still restore: fixtures/chain-v2.tar.xz (machine config
format 2: counter guest, 2 MiB, one overlay disk, vsock CID 7, full + incremental layer) is
restored with today's command line and the guest continues from its next tick; a machine with a
table device (--rng) restores with it."""
import os
import re
import shutil
import signal
import subprocess
import tempfile

from covetest import Vm, check, guest, main

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def unpack(tmp):
    subprocess.run(["tar", "-C", tmp, "-xJf", os.path.join(FIXTURES, "chain-v2.tar.xz")],
                   check=True)
    d = os.path.join(tmp, "chain")
    with open(os.path.join(d, "LAST_TICK")) as f:
        return d, int(f.read())


def test_chain_v2_restores(tmp):
    d, last = unpack(tmp)
    base = os.path.join(d, "base.img")
    uds = os.path.join(tmp, "v.sock")
    with Vm(None, restore=d, extra=["--disk", base, "--vsock-uds", uds]) as r:
        r.wait_output(f"tick {last + 1}\n")
        first = int(re.findall(rb"tick (\d+)\n", r.out)[0])
        check(first == last + 1, f"restored counter started at {first}, expected {last + 1}")
        r.wait_output(f"tick {last + 3}\n")
        status, body = r.request("PUT", "/snapshot/create", {"snapshot_type": "Diff"})
        check(status == 200 and body["layer_id"] == 3, f"chain continues: {status} {body}")
    print(f"ok format-2 chain restores and continues at tick {last + 1}")


def test_chain_v2_without_vsock_uds(tmp):
    d, _ = unpack(tmp)
    r = subprocess.run([os.environ.get("COVE", "build/cli/cove"), "restore", d, "--disk",
                        os.path.join(d, "base.img")], capture_output=True, text=True, timeout=30)
    check(r.returncode != 0 and "vsock" in r.stderr, f"restore without --vsock-uds: {r}")
    print("ok format-2 chain with vsock needs --vsock-uds")


def test_table_device_restores(tmp):
    """A table device (virtio-rng, --rng) is saved in the machine config and rebuilt on restore."""
    d = os.path.join(tmp, "chain")
    with Vm(guest("counter"), mem="2M", extra=["--snapshot-dir", d, "--rng=4096"]) as vm:
        vm.wait_output("tick 2\n")
        last = vm.pause_at_tick()
        vm.snapshot("Full")
        vm.stop(signal.SIGKILL)
    with open(os.path.join(d, "state-000001"), "rb") as f:
        check(b'"devices":[{"rate":4096,"burst":4096,"type":"virtio-rng"}]' in f.read(),
              "machine config lacks the rng device")
    with Vm(None, restore=d) as r:
        r.wait_output(f"tick {last + 1}\n")
        first = int(re.findall(rb"tick (\d+)\n", r.out)[0])
        check(first == last + 1, f"restored counter started at {first}, expected {last + 1}")
    print("ok --rng machine restores with its device")


def run_all():
    for t in (test_chain_v2_restores, test_chain_v2_without_vsock_uds,
              test_table_device_restores):
        tmp = tempfile.mkdtemp(prefix="cove-fixture-")
        try:
            t(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(run_all)
