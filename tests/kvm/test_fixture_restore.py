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
import struct
import subprocess
import tarfile
import tempfile
import zlib

from covetest import Failure, Vm, check, guest, main, reseal_all, run_cove

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


# The state file (snapshot/state_file.c): header magic, version, header size, body length, body
# CRC, header CRC; sections type, instance, length, reserved, payload padded to 8.
SEC_MSRS, SEC_CPUID = 9, 15


def read_state(path):
    with open(path, "rb") as f:
        b = f.read()
    secs, pos = [], 32
    while pos < len(b):
        t, inst, ln, _ = struct.unpack_from("<IIII", b, pos)
        secs.append([t, inst, b[pos + 16:pos + 16 + ln]])
        pos += 16 + ((ln + 7) & ~7)
    return b[:32], secs


def write_state(path, hdr, secs):
    body = b"".join(struct.pack("<IIII", t, i, len(p), 0) + p + b"\0" * (-len(p) % 8)
                    for t, i, p in secs)
    h = bytearray(hdr[:16]) + struct.pack("<QI", len(body), zlib.crc32(body))
    h += struct.pack("<I", zlib.crc32(bytes(h)))
    with open(path, "wb") as f:
        f.write(bytes(h) + body)


def edited_chain(src, dst, edit):
    shutil.copytree(src, dst)
    path = os.path.join(dst, "state-000001")
    hdr, secs = read_state(path)
    edit({(t, i): s for t, i, s in ((s[0], s[1], s) for s in secs)})
    write_state(path, hdr, secs)
    reseal_all(dst)  # an edited chain as a host would hand it over, its digests made right
    return dst


def saved_msrs(sec):
    return {struct.unpack_from("<I", sec[2], k)[0] for k in range(0, len(sec[2]), 16)}


def add_msr(index, value):
    def edit(secs):
        s = secs[(SEC_MSRS, 0)]
        s[2] += struct.pack("<IIQ", index, 0, value)
    return edit


def test_cpu_rule_here(tmp):
    """The rule end to end on this host's KVM: a chain saved here, then given an MSR this KVM
    does not save (at a droppable value: restores, with the line naming it; at a value a guest
    relies on: refused naming it) or a CPUID feature this host does not offer (refused)."""
    d = os.path.join(tmp, "chain")
    with Vm(guest("counter"), mem="2M", extra=["--snapshot-dir", d]) as vm:
        vm.wait_output("tick 2\n")
        last = vm.pause_at_tick()
        vm.snapshot("Full")
        vm.stop(signal.SIGKILL)
    hdr, secs = read_state(os.path.join(d, "state-000001"))
    check(struct.unpack_from("<I", hdr, 8)[0] == 2, "state file is not version 2")
    have = saved_msrs(next(s for s in secs if s[:2] == [SEC_MSRS, 0]))
    cpuid = next((s for s in secs if s[:2] == [SEC_CPUID, 0]), None)
    check(cpuid is not None and len(cpuid[2]) % 40 == 0, "no CPUID recorded for vCPU 0")

    drop = [(0x1db, "LASTBRANCHFROMIP"), (0x34, "SMI_COUNT"), (0x8b, "IA32_UCODE_REV"),
            (0x40000020, "HV_X64_TIME_REF_COUNT")]
    index, name = next((i, n) for i, n in drop if i not in have)
    c = edited_chain(d, os.path.join(tmp, "drop"), add_msr(index, 0x1234))
    with Vm(None, restore=c) as r:
        r.wait_output(f"tick {last + 1}\n")
        r.stop(signal.SIGKILL)
        err = r.stderr()
    want = f"vCPU 0: MSR {index:#x} {name} dropped (this host's KVM does not save it): "
    check(want in err, f"no line {want!r} in {err!r}")
    print(f"  {next(x for x in err.splitlines() if want in x)}")

    # A value this host's KVM refuses (PERF_CAPABILITIES beyond what it supports): the table
    # lets that MSR go, so it is dropped with its line and the MSRs after it are still set.
    if 0x345 in have:
        def bad_perf_caps(secs):
            p = bytearray(secs[(SEC_MSRS, 0)][2])
            for k in range(0, len(p), 16):
                if struct.unpack_from("<I", p, k)[0] == 0x345:
                    struct.pack_into("<Q", p, k + 8, 2**64 - 1)
            secs[(SEC_MSRS, 0)][2] = bytes(p)
        c = edited_chain(d, os.path.join(tmp, "value"), bad_perf_caps)
        with Vm(None, restore=c) as r:
            r.wait_output(f"tick {last + 1}\n")
            r.stop(signal.SIGKILL)
            err = r.stderr()
        want = ("vCPU 0: MSR 0x345 IA32_PERF_CAPABILITIES = 0xffffffffffffffff dropped: this "
                "host's KVM refused the value")
        check(want in err, f"no line {want!r} in {err!r}")
        print(f"  {next(x for x in err.splitlines() if want in x)}")

    refuse = [(0x1d9, "IA32_DEBUGCTL"), (0x122, "IA32_TSX_CTRL"), (0x3f1, "IA32_PEBS_ENABLE"),
              (0x6a0, "IA32_U_CET")]
    index, name = next((i, n) for i, n in refuse if i not in have)
    c = edited_chain(d, os.path.join(tmp, "refuse"), add_msr(index, 1))
    r = run_cove(["restore", c])
    want = (f"cove: error: this host cannot take vCPU 0's CPU state: MSR {index:#x} {name} = "
            f"0x1, not its reset value 0x0 (")
    check(r.returncode != 0 and want in r.stderr and r.stderr.count("cove: error:") == 1,
          f"restore with an armed {name}: {r.returncode} {r.stderr!r}")
    print(f"  {want}...")

    # A leaf-7 feature this host does not offer (what it offers is what the chain recorded).
    ebx = None
    for k in range(0, len(cpuid[2]), 40):
        fn, idx, _flags, _a, b = struct.unpack_from("<IIIII", cpuid[2], k)
        if fn == 7 and idx == 0:
            ebx = (k, b)
    check(ebx is not None, "recorded CPUID has no leaf 7")
    features = [(16, "avx512f"), (11, "rtm"), (14, "mpx"), (4, "hle"), (2, "sgx"), (30, "avx512bw")]
    bit, name = next((b, n) for b, n in features if not ebx[1] & (1 << b))

    def more_cpuid(secs):
        s = secs[(SEC_CPUID, 0)]
        s[2] = s[2][:ebx[0] + 16] + struct.pack("<I", ebx[1] | 1 << bit) + s[2][ebx[0] + 20:]
    c = edited_chain(d, os.path.join(tmp, "cpuid"), more_cpuid)
    r = run_cove(["restore", c])
    want = f"CPUID 0x7.0 EBX bit {bit} {name} not offered here"
    check(r.returncode != 0 and want in r.stderr and r.stderr.count("cove: error:") == 1,
          f"restore with {name} in CPUID: {r.returncode} {r.stderr!r}")
    print(f"  cove: error: ...{want}")
    print("ok CPU-state rule on this host: MSR dropped with its line, MSR and CPUID refused")


def run_all():
    for t in (test_chain_v2_restores, test_chain_v2_without_vsock_uds,
              test_table_device_restores, test_box_chain, test_pvm_chain,
              test_cpu_rule_here):
        tmp = tempfile.mkdtemp(prefix="cove-fixture-")
        try:
            t(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(run_all)
