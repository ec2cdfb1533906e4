#!/usr/bin/env python3
"""A 4 GiB guest (RAM split around the MMIO hole) starts without paying for its memory."""
from covetest import Vm, check, guest, main, smaps_rss


def test():
    with Vm(guest("counter"), mem="4G") as vm:
        vm.wait_output("tick 1\n", timeout=30)
        total, guest_rss = smaps_rss(vm.proc.pid)
        status, body = vm.request("GET", "/vm")
        check(status == 200 and body["mem_bytes"] == 4 << 30, f"GET /vm: {body}")
        # The guest touched a few pages of boot tables and its own image: well under 1 MiB.
        check(guest_rss < 1024, f"guest RAM RSS is {guest_rss} KiB for a 4 GiB guest")
        # Generous bound so the sanitizer build (shadow memory) also passes.
        check(total < 64 * 1024, f"cove RSS is {total} KiB for a 4 GiB guest")
        print(f"4 GiB guest: cove RSS {total} KiB, of which guest RAM {guest_rss} KiB")
        vm.send_input(b"q")
        vm.wait_output("quit\n", timeout=30)
        check(vm.proc.wait(20) == 0, "cove did not exit 0")


if __name__ == "__main__":
    main(test)
