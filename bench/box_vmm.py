"""Shared by the in-box benchmarks: QEMU microvm's command line, the same for every bench."""

QEMU = "/work/qemu/qemu-system-x86_64"


def qemu_microvm(kernel, initrd, cmdline, devices=()):
    """QEMU microvm on the box's /dev/kvm, no ACPI, serial on stdio, i8042 for reboot=k."""
    return [QEMU, "-L", "/work/qemu/share",
            "-M", "microvm,acpi=off,pit=on,pic=on,isa-serial=on,rtc=off",
            "-accel", "kvm", "-cpu", "host", "-m", "256M", "-smp", "1", "-nodefaults",
            "-no-user-config", "-nographic", "-serial", "stdio", "-no-reboot", "-device", "i8042",
            *devices, "-kernel", kernel, "-initrd", initrd, "-append", cmdline]
