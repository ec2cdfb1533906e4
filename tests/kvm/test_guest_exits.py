#!/usr/bin/env python3
"""Exact serial output and exit statuses of the test guests."""
import os
import tempfile

from covetest import check, guest, main, run_cove


def test():
    r = run_cove(["run", "--kernel", guest("hello")])
    check(r.returncode == 0, f"hello exited {r.returncode}: {r.stderr}")
    check(r.stdout == "Hello from a cove test guest\n", f"hello printed {r.stdout!r}")

    r = run_cove(["run", "--kernel", guest("reset")])
    check(r.returncode == 0, f"reset guest exited {r.returncode}: {r.stderr}")
    check(r.stdout == "resetting\n", f"reset printed {r.stdout!r}")

    r = run_cove(["run", "--kernel", guest("triplefault")])
    check(r.returncode == 1, f"triple fault exited {r.returncode}, want 1")
    check(r.stdout == "about to triple fault\n", f"triplefault printed {r.stdout!r}")
    lines = [l for l in r.stderr.splitlines() if l]
    check(len(lines) == 1, f"want one line on stderr, got {lines!r}")
    check("KVM_EXIT_SHUTDOWN" in lines[0] and "rip=0x" in lines[0],
          f"stderr does not name the exit and RIP: {lines[0]!r}")

    r = run_cove(["run", "--kernel", guest("probe")])
    check(r.returncode == 0, f"probe exited {r.returncode}: {r.stderr}")
    want = ("pio scratch 5a\npio unassigned ff\nmmio unassigned ffffffff\n"
            "mmio after write ffffffff\nmmio64 unassigned ffffffffffffffff\nprobe done\n")
    check(r.stdout == want, f"probe printed {r.stdout!r}")

    for n in (2, 4):
        r = run_cove(["run", "--kernel", guest("hello"), "--vcpus", str(n)])
        check(r.returncode == 0 and r.stdout == "Hello from a cove test guest\n",
              f"hello with {n} vcpus: rc={r.returncode} out={r.stdout!r} err={r.stderr!r}")

    with tempfile.TemporaryDirectory() as d:
        con = os.path.join(d, "console.log")
        r = run_cove(["run", "--kernel", guest("hello"), "--console", con])
        check(r.returncode == 0, f"--console run exited {r.returncode}: {r.stderr}")
        check(r.stdout == "", f"--console still printed to stdout: {r.stdout!r}")
        with open(con) as f:
            got = f.read()
        check(got == "Hello from a cove test guest\n", f"console file holds {got!r}")

    # The guest's cmdline reaches it through the zero page: 3 ticks, then a clean stop.
    r = run_cove(["run", "--kernel", guest("counter"), "--cmdline", "ticks=3"], timeout=60)
    check(r.returncode == 0, f"counter ticks=3 exited {r.returncode}: {r.stderr}")
    check(r.stdout == "tick 1\ntick 2\ntick 3\ncounter done\n", f"counter printed {r.stdout!r}")


if __name__ == "__main__":
    main(test)
