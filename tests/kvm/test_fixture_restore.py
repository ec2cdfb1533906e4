#!/usr/bin/env python3
"""Snapshots written by older builds still restore: fixtures/chain-v2.tar.xz (machine config
format 2: counter guest, 2 MiB, one overlay disk, vsock CID 7, full + incremental layer) is
restored with today's command line and the guest continues from its next tick; a machine with a
table device (--rng) restores with it. Chains saved on another kind of host (fixtures/chain-box
from the KVM box's kvm_amd, fixtures/chain-pvm from a nested-PVM host) restore here, or are
refused with one line naming the MSR or CPUID feature that differs (snapshot/CPU_COMPAT.md)."""
import os
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile

from covetest import Failure, Vm, check, guest, main

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def unpack(tmp, name="chain-v2"):
    # Python's tarfile, not tar(1): the KVM box's busybox has no xz.
    with tarfile.open(os.path.join(FIXTURES, name + ".tar.xz"), "r:xz") as t:
        if hasattr(tarfile, "data_filter"):
            t.extractall(tmp, filter="data")
        else:
            t.extractall(tmp)
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
        r.stop(signal.SIGKILL)
        err = r.stderr()
    # A version-1 state file recorded no CPUID: the check is skipped, and said so.
    check("vCPU 0: the chain recorded no CPUID" in err, f"no CPUID-skipped line: {err!r}")
    for line in err.splitlines():
        if " dropped" in line:
            print(f"  {line}")
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


def host_kind():
    """Same form as fixtures/make_chain_cpu.py writes in HOST: module, CPU vendor, kernel."""
    mods = [m for m in ("kvm_amd", "kvm_intel", "kvm_pvm") if os.path.isdir(f"/sys/module/{m}")]
    vendor = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("vendor_id"):
                vendor = line.split(":", 1)[1].strip()
                break
    return f"{'+'.join(mods) or 'unknown'} {vendor} {os.uname().release}"


REFUSAL = re.compile(r"this host cannot take vCPU \d+'s CPU state: "
                     r"(MSR 0x[0-9a-f]+ |CPUID 0x[0-9a-f]+\.\d+ E[A-D]X bit \d+ \S+ not offered"
                     r"|CPUID 0x0 vendor \S+ \(this host: \S+\))")


def restore_elsewhere(tmp, name):
    """A chain saved on another kind of host: it continues, or cove refuses it by name. On the
    kind of host that saved it (same module, vendor and kernel) it must continue."""
    if not os.path.exists(os.path.join(FIXTURES, name + ".tar.xz")):
        print(f"skip {name}: not made yet (fixtures/make_chain_cpu.py {name} on such a host)")
        return
    d, last = unpack(tmp, name)
    with open(os.path.join(d, "HOST")) as f:
        saved_on = f.read().strip()
    here = host_kind()
    try:
        with Vm(None, restore=d) as r:
            r.wait_output(f"tick {last + 1}\n")
            first = int(re.findall(rb"tick (\d+)\n", r.out)[0])
            check(first == last + 1, f"{name}: restored counter started at {first}, "
                  f"expected {last + 1}")
            r.stop(signal.SIGKILL)
            err = r.stderr()
    except Failure as e:
        check(saved_on != here, f"{name} was saved on this kind of host ({here}) and must "
              f"restore: {e}")
        check(REFUSAL.search(str(e)) is not None and str(e).count("cove: error:") == 1,
              f"{name}: not a refusal naming what differs: {e}")
        print(f"ok {name} (saved on {saved_on}) refused here ({here}): "
              f"{REFUSAL.search(str(e)).group(0)}...")
        return
    check("CPUID check skipped" not in err, f"{name} records its CPUID: {err!r}")
    dropped = [line for line in err.splitlines() if " dropped" in line]
    for line in dropped:
        print(f"  {line}")
    print(f"ok {name} (saved on {saved_on}) restores here ({here}), {len(dropped)} MSRs dropped")


def test_box_chain(tmp):
    restore_elsewhere(tmp, "chain-box")


def test_pvm_chain(tmp):
    restore_elsewhere(tmp, "chain-pvm")


def run_all():
    for t in (test_chain_v2_restores, test_chain_v2_without_vsock_uds,
              test_table_device_restores, test_box_chain, test_pvm_chain):
        tmp = tempfile.mkdtemp(prefix="cove-fixture-")
        try:
            t(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(run_all)
