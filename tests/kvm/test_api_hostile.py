#!/usr/bin/env python3
"""Hostile input on the control socket gets 4xx (or a closed connection); the guest keeps running."""
import re
import socket

from covetest import Vm, check, guest, main


def fault(vm, method, path, body, want_status, headers=None):
    status, resp = vm.request(method, path, body, headers=headers)
    check(status == want_status, f"{method} {path} {body!r:.60}: status {status}, want {want_status}")
    check(isinstance(resp, dict) and resp.get("fault_message"),
          f"{method} {path}: no fault_message in {resp!r}")
    return resp["fault_message"]


def too_big(vm):
    """A 1 MiB body: the server may answer 413 and close before the body is sent."""
    body = b"x" * (1 << 20)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(vm.sock)
    try:
        s.sendall(b"PATCH /vm HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        try:
            s.sendall(body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            got += chunk
    finally:
        s.close()
    check(got.startswith(b"HTTP/1.1 413"), f"1 MiB body got {got[:80]!r}")
    check(b"fault_message" in got, f"413 without fault_message: {got[:200]!r}")


def test():
    with Vm(guest("counter")) as vm:
        vm.wait_output("tick 1\n", timeout=30)
        fault(vm, "PATCH", "/vm", "{not json", 400)
        fault(vm, "PATCH", "/vm", "[1,2,3]", 400)
        fault(vm, "PATCH", "/vm", "", 400)
        msg = fault(vm, "PATCH", "/vm", '{"state":"Paused","extra":1}', 400)
        check("extra" in msg, f"unknown-field message does not name it: {msg}")
        fault(vm, "PATCH", "/vm", '{"state":"Sleeping"}', 400)
        fault(vm, "PATCH", "/vm", '{"state":7}', 400)
        fault(vm, "PATCH", "/vm", '{"state":"Paused","state":"Resumed"}', 400)
        fault(vm, "PATCH", "/vm", b'{"state":"Pa\x00used"}', 400)
        fault(vm, "PUT", "/actions", '{"action_type":"FlyToTheMoon"}', 400)
        fault(vm, "PUT", "/actions", '{}', 400)
        fault(vm, "GET", "/no/such/path", None, 404)
        fault(vm, "DELETE", "/vm", None, 405)
        too_big(vm)
        fault(vm, "GET", "/" + "a" * 5000, None, 414)

        # Garbage that is not HTTP at all, a half request, binary noise.
        for junk in (b"\x00\x01\x02\xff" * 64 + b"\r\n\r\n", b"GET /vm HTTP/1.1\r\nHost",
                     b"PATCH /vm HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n{",
                     b"GET /vm HTTP/9.9\r\n\r\n", bytes(range(256)) * 40):
            got = vm.raw(junk, timeout=3)
            m = re.match(rb"HTTP/1\.[01] (\d{3})", got)
            check(not got or (m and 400 <= int(m.group(1)) < 500 or m and int(m.group(1)) == 505),
                  f"junk {junk[:20]!r} got {got[:80]!r}")

        # Many idle connections must not lock out the next client for good.
        idle = []
        for _ in range(8):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(vm.sock)
            idle.append(s)
        status, body = vm.request("GET", "/vm", timeout=15)
        for s in idle:
            s.close()
        check(status == 200 and body["state"] == "Running", f"after junk GET /vm: {status} {body}")

        check(vm.alive(), "cove died on hostile input")
        n = len(re.findall(rb"tick \d+\n", vm.out))
        vm.wait_output(f"tick {n + 1}\n", timeout=30)
        rc = vm.stop()
        check(rc == 0, f"SIGTERM stop exited {rc}: {vm.stderr()}")


if __name__ == "__main__":
    main(test)
