#!/usr/bin/env python3
"""e2e: kvm-box tells a hung box from a quiet one.

A box whose processes stop running (seen once: QEMU busy, no output for 850 s, until the 900 s
timeout) must be called a stall as soon as its heartbeat stops, so tests/e2e/run retries it
minutes earlier; a command that is silent for longer than the window must still pass. The hang
is made by stopping the box's own heartbeat loop (its pid is in /run/kvm-box-heartbeat.pid).
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WINDOW = 20


def box(cmd, reason, extra=()):
    return subprocess.run([os.path.join(ROOT, "tools", "kvm-box"), "--timeout", "300",
                           "--hang-after", str(WINDOW), *extra, "--reason-file", reason, "--",
                           "sh", "-c", cmd], capture_output=True, text=True)


def main():
    if not shutil.which("qemu-system-x86_64"):
        print("SKIP: qemu-system-x86_64 is missing (tools/setup installs it)")
        return 77
    failed = 0
    tmp = tempfile.mkdtemp(prefix="box-watch-")
    reason = os.path.join(tmp, "reason")
    try:
        # Quiet and idle for more than twice the window, heartbeat running: not a hang, and
        # not a freeze.
        # --freeze-after as short: an idle, silent box whose heartbeat goes on is not frozen
        # either (a test's quiet wait was once called a freeze).
        p = box(f"echo quiet; sleep {2 * WINDOW + 15}; echo done", reason,
                ("--freeze-after", str(WINDOW)))
        ok = p.returncode == 0 and "done" in p.stdout
        print(f"{'ok' if ok else 'FAIL'}: a command silent for {2 * WINDOW + 15} s with "
              f"--hang-after and --freeze-after {WINDOW}: kvm-box status {p.returncode}")
        if not ok:
            failed += 1
            sys.stdout.write(p.stdout[-1500:] + p.stderr[-1500:])
        # The heartbeat stopped: a stall, named as a hang, long before --timeout.
        p = box("kill -STOP $(cat /run/kvm-box-heartbeat.pid) && echo stopped; sleep 250; "
                "echo not-killed", reason)
        why = open(reason).read().strip() if os.path.exists(reason) else ""
        ok = (p.returncode == 125 and "not-killed" not in p.stdout and
              why.startswith("stall: the box hung: its heartbeat stopped"))
        print(f"{'ok' if ok else 'FAIL'}: heartbeat stopped: kvm-box status {p.returncode}, "
              f"reason {why!r}")
        if not ok:
            failed += 1
            sys.stdout.write(p.stdout[-1500:] + p.stderr[-1500:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"box_watch: {2 - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
