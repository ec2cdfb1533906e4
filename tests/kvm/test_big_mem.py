#!/usr/bin/env python3
"""A 4 GiB guest (RAM split around the MMIO hole) starts without paying for its memory.

In the KVM box (3 GiB of RAM) the 4 GiB guest fits as well: its memfd is sparse, and only the
pages the guest touches are allocated. Where the host backs guest RAM with transparent huge
pages (cove asks with MADV_HUGEPAGE; the box's kernel grants it for shared memory, this
machine's PVM host did not), each touched 2 MiB region costs 2 MiB: the bound allows that.
"""
from covetest import Vm, check, guest, main, smaps_rss


def guest_huge_kib(pid):
    """KiB of the guest RAM mapping that transparent huge pages back (PMD-mapped)."""
    huge = 0
    in_guest = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if "-" in parts[0] and len(parts) >= 5 and ":" not in parts[0]:
                in_guest = "cove-guest-ram" in line
            elif in_guest and parts[0] in ("ShmemPmdMapped:", "FilePmdMapped:", "AnonHugePages:"):
                huge += int(parts[1])
    return huge


def test():
    with Vm(guest("counter"), mem="4G") as vm:
        vm.wait_output("tick 1\n", timeout=30)
        total, guest_rss = smaps_rss(vm.proc.pid)
        huge = guest_huge_kib(vm.proc.pid)
        status, body = vm.request("GET", "/vm")
        check(status == 200 and body["mem_bytes"] == 4 << 30, f"GET /vm: {body}")
        # The guest touched a few pages of boot tables and its own image: well under 1 MiB in
        # 4 KiB pages; with huge pages, those few pages lie in at most 4 regions of 2 MiB.
        small = guest_rss - huge
        check(small < 1024 and huge <= 4 * 2048,
              f"guest RAM RSS is {guest_rss} KiB for a 4 GiB guest ({huge} KiB of it huge pages)")
        if huge:
            print(f"guest RAM: {huge} KiB in transparent huge pages (this host grants them)")
        # Generous bound so the sanitizer build (shadow memory) also passes.
        check(total < 64 * 1024, f"cove RSS is {total} KiB for a 4 GiB guest")
        print(f"4 GiB guest: cove RSS {total} KiB, of which guest RAM {guest_rss} KiB")
        vm.send_input(b"q")
        vm.wait_output("quit\n", timeout=30)
        check(vm.proc.wait(20) == 0, "cove did not exit 0")


if __name__ == "__main__":
    main(test)
