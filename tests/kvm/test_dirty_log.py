#!/usr/bin/env python3
"""The dirty log reports exactly the pages the guest stamped, plus documented boot pages.

Extra pages, and why they are dirty (see vmm/x86_boot.h and tests/guests/guest.ld):
  0x9000 PML4, 0xa000 PDPT, 0xb000 first page directory: the CPU sets Accessed/Dirty bits
  in the identity-map entries it walks; 0x110000 guest .data/.bss, 0x111000 guest stack.
  On hardware-paging KVM (kvm_amd/kvm_intel, e.g. inside tools/kvm-box) a page that is
  writable on the host is mapped writable on its first read fault and logged dirty then
  (make_spte), so the pages the guest only reads can appear too: 0x7000 zero page,
  0x20000 command line, 0x100000 guest text; and page-table pages may be re-logged after
  each clear. Nested PVM (this project's machines) reports the minimal set exactly.
After a fetch-and-clear, the page tables are warm, so a second round adds only the stack
page (and .data when the guest writes a global), plus the page directory when it stamps
into a 2 MiB page the first round did not touch.
"""
from covetest import Vm, check, guest, main

BASE = 0x1000000
COUNT = 100
STRIDE = 3
BOOT_PAGES = {0x9, 0xA, 0xB}
GUEST_PAGES = {0x110, 0x111}
READ_ONLY_PAGES = {0x7, 0x20, 0x100}  # logged on first read fault by hardware-paging KVM
DOCUMENTED = BOOT_PAGES | GUEST_PAGES | READ_ONLY_PAGES


def stamped(round_):
    first = (round_ - 1) * COUNT
    return {(BASE >> 12) + (first + i) * STRIDE for i in range(COUNT)}


def dirty(vm):
    status, body = vm.request("GET", "/debug/dirty_pages")
    check(status == 200, f"GET /debug/dirty_pages: {status} {body}")
    check(body["page_size"] == 4096 and body["truncated"] is False, f"bad body {body}")
    pages = set()
    for first, n in body["ranges"]:
        pages.update(range(first, first + n))
    check(body["total_pages"] == len(pages), f"total_pages {body['total_pages']} != {len(pages)}")
    return pages


def fmt(pages):
    return sorted(hex(p) for p in pages)[:20]


def test():
    cmdline = f"stamp_base={BASE:#x} stamp_count={COUNT} stamp_stride={STRIDE} rounds=2"
    with Vm(guest("stamper"), extra=["--cmdline", cmdline, "--track-dirty-pages"]) as vm:
        vm.wait_output("stamped round 1 pages 100\n")
        got = dirty(vm)
        must = stamped(1) | BOOT_PAGES | GUEST_PAGES
        check(must <= got, f"round 1: missing {fmt(must - got)}")
        check(got - must <= READ_ONLY_PAGES, f"round 1: undocumented pages {fmt(got - must)}")

        # Nothing runs the stamper between rounds except its serial poll loop.
        idle = dirty(vm)
        check(idle <= DOCUMENTED, f"idle guest dirtied {fmt(idle - DOCUMENTED)}")

        vm.send_input(b"n")
        vm.wait_output("stamped round 2 pages 100\n")
        got = dirty(vm)
        s2 = stamped(2)
        check(s2 <= got, f"round 2: stamped pages missing from the log: {fmt(s2 - got)}")
        # Stamps that enter a 2 MiB page not touched in round 1 set Accessed/Dirty bits in
        # its page-directory entry, which dirties the page directory (0xb000) once more.
        regions1 = {p >> 9 for p in stamped(1)}
        extra = {0xB} if any(p >> 9 not in regions1 for p in s2) else set()
        check(extra <= got, "round 2: page directory not reported after entering a new 2 MiB page")
        check(got - s2 - extra <= DOCUMENTED,
              f"round 2: unexpected dirty pages {fmt(got - s2 - extra - DOCUMENTED)}")

        vm.send_input(b"q")
        vm.wait_output("bye\n")
    # Without --track-dirty-pages KVM keeps no log (and may use huge pages): a clear 409.
    with Vm(guest("stamper"), extra=["--cmdline", cmdline]) as vm:
        vm.wait_output("stamped round 1 pages 100\n")
        status, body = vm.request("GET", "/debug/dirty_pages")
        check(status == 409 and "--track-dirty-pages" in body["fault_message"],
              f"untracked VM: {status} {body}")
        vm.send_input(b"nq")
        vm.wait_output("bye\n")
        rc = vm.proc.wait(20)
        check(rc == 0, f"cove exited {rc}: {vm.stderr()}")


if __name__ == "__main__":
    main(test)
