"""Shared by the in-box benchmarks: QEMU microvm's command line, the same for every bench, and
where the results go."""
import json
import os

QEMU = "/work/qemu/qemu-system-x86_64"


def qemu_microvm(kernel, initrd, cmdline, devices=()):
    """QEMU microvm on the box's /dev/kvm, no ACPI, serial on stdio, i8042 for reboot=k."""
    return [QEMU, "-L", "/work/qemu/share",
            "-M", "microvm,acpi=off,pit=on,pic=on,isa-serial=on,rtc=off",
            "-accel", "kvm", "-cpu", "host", "-m", "256M", "-smp", "1", "-nodefaults",
            "-no-user-config", "-nographic", "-serial", "stdio", "-no-reboot", "-device", "i8042",
            *devices, "-kernel", kernel, "-initrd", initrd, "-append", cmdline]


def write_results(name, out):
    """Writes `out` to /work/out/NAME.json (kvm-box copies it back to the host) and prints each
    result's cove/QEMU ratio; returns 0, the exit status."""
    os.makedirs("/work/out", exist_ok=True)
    with open(f"/work/out/{name}.json", "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: v.get("ratio_cove_over_qemu") for k, v in out["results"].items()}))
    return 0
