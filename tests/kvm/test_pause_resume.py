#!/usr/bin/env python3
"""Pause and resume over the API socket while a guest runs: no progress while paused, progress after."""
import re

from covetest import Vm, check, guest, main


def ticks(out):
    return [int(n) for n in re.findall(rb"tick (\d+)\n", out)]


def test():
    with Vm(guest("counter")) as vm:
        vm.wait_output("tick 2\n", timeout=30)
        status, body = vm.request("GET", "/vm")
        check(status == 200 and body["state"] == "Running", f"GET /vm: {status} {body}")
        check(body["vcpus"] == 1 and body["mem_bytes"] == 256 << 20, f"GET /vm fields: {body}")
        for round_ in range(3):
            status, body = vm.request("PATCH", "/vm", {"state": "Paused"})
            check(status == 204, f"pause round {round_}: {status} {body}")
            # Pausing twice is fine.
            status, _ = vm.request("PATCH", "/vm", {"state": "Paused"})
            check(status == 204, f"second pause: {status}")
            status, body = vm.request("GET", "/vm")
            check(body["state"] == "Paused", f"state after pause: {body}")
            vm.read_console(0.3)  # drain what was printed before the pause
            before = ticks(vm.out)
            vm.read_console(1.5)
            after = ticks(vm.out)
            check(before == after, f"guest made progress while paused: {before[-3:]} -> {after[-3:]}")
            status, _ = vm.request("PATCH", "/vm", {"state": "Resumed"})
            check(status == 204, f"resume round {round_}: {status}")
            status, body = vm.request("GET", "/vm")
            check(body["state"] == "Running", f"state after resume: {body}")
            want = f"tick {after[-1] + 1}\n"
            vm.wait_output(want, timeout=30)
        # Ctrl-Alt-Del reaches the guest through the i8042; the guest then resets: exit 0.
        status, body = vm.request("PUT", "/actions", {"action_type": "SendCtrlAltDel"})
        check(status == 204, f"SendCtrlAltDel: {status} {body}")
        vm.wait_output("ctrl-alt-del\n", timeout=30)
        rc = vm.proc.wait(20)
        check(rc == 0, f"cove exited {rc} after the guest's reset; stderr {vm.stderr()!r}")
        nums = ticks(vm.out)
        check(nums == list(range(1, len(nums) + 1)), "ticks are not consecutive")


if __name__ == "__main__":
    main(test)
