#!/usr/bin/env python3
"""`cove balloon` refuses bad arguments and an unreachable socket with one line each, and asks
nothing of a socket it was not given (no KVM needed: nothing here reaches a VMM)."""
import os
import subprocess
import sys
import tempfile

COVE = os.environ["COVE_BIN"]


def run(*args):
    r = subprocess.run([COVE, "balloon"] + list(args), capture_output=True, text=True,
                       timeout=30, stdin=subprocess.DEVNULL)
    return r.returncode, r.stdout, r.stderr


def one_line(rc, out, err, want_rc, want):
    assert rc == want_rc, f"rc {rc} (want {want_rc}): {err!r}"
    assert not out, f"stdout {out!r}"
    assert err.count("\n") == 1 and err.startswith("cove balloon: ") and want in err, repr(err)


def main():
    with tempfile.TemporaryDirectory() as d:
        sock = os.path.join(d, "api.sock")
        for bad in ("abc", "-1", "12x", "", "1048577", "99999999999999999999999"):
            one_line(*run(sock, "--target", bad), 2, "is not a size in MiB")
        one_line(*run(), 2, "API socket is required")
        one_line(*run(sock, "--bogus"), 2, "unexpected argument '--bogus'")
        one_line(*run(sock, sock + "2"), 2, "unexpected argument")
        # No such socket: the call fails in one line, and no file appears.
        one_line(*run(sock, "--stats"), 1, sock)
        assert not os.path.exists(sock), "a socket file appeared"
        rc, out, err = run("--help")
        assert rc == 0 and "usage: cove balloon" in out, (rc, out, err)
    print("ok: cove balloon refusals")
    return 0


if __name__ == "__main__":
    sys.exit(main())
