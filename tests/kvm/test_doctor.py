#!/usr/bin/env python3
"""`cove doctor` reports capabilities and its ring-0 verdict; on nested PVM it names the limit."""
import os

from covetest import check, main, run_cove


def test():
    r = run_cove(["doctor"], timeout=60)
    check(r.returncode in (0, 3), f"doctor exited {r.returncode}: {r.stdout} {r.stderr}")
    check("API version 12" in r.stdout, f"no API version in {r.stdout!r}")
    for cap in ("IRQCHIP", "MANUAL_DIRTY_LOG_PROTECT2", "IMMEDIATE_EXIT"):
        check(cap in r.stdout, f"{cap} missing from the report")
    check("ring-0 probe: guest" in r.stdout, "no ring-0 probe line")
    # The kernel module tells independently of the probe whether this is nested PVM.
    if os.path.exists("/sys/module/kvm_pvm"):
        check(r.returncode == 3, f"on kvm_pvm doctor said rc={r.returncode}: {r.stdout}")
        check("emulated" in r.stdout and "kvm-box" in r.stdout,
              f"doctor does not name the limit and the box: {r.stdout}")
    elif r.returncode == 0:
        check("runs natively" in r.stdout, r.stdout)
    print(r.stdout)


if __name__ == "__main__":
    main(test)
