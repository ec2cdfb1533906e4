#!/usr/bin/env python3
"""Per-thread seccomp filters (sandbox/SECCOMP.md): while a guest runs, every thread of the VMM
has a filter (Seccomp: 2), snapshots and pause/resume still work; a vCPU thread or the event loop
that makes a forbidden call (the test-only COVE_TEST_SECCOMP trigger) ends the process by
SIGSYS with the call and thread named; --no-seccomp runs without filters and says so."""
import glob
import os
import resource
import signal
import subprocess

from covetest import Failure, Vm, check, guest, main, sanitized_build


def task_status(pid):
    """{tid: (name, Seccomp, Seccomp_filters)} of every thread of pid."""
    out = {}
    for d in glob.glob(f"/proc/{pid}/task/*"):
        fields = {}
        try:
            with open(os.path.join(d, "status")) as f:
                for line in f:
                    k, _, v = line.partition(":")
                    fields[k] = v.strip()
        except FileNotFoundError:
            continue
        out[os.path.basename(d)] = (fields.get("Name"), fields.get("Seccomp"),
                                    int(fields.get("Seccomp_filters", "0")))
    return out


def test_filters_on_every_thread(tmp):
    sdir = os.path.join(tmp, "chain")
    with Vm(guest("counter"), extra=["--snapshot-dir", sdir]) as vm:
        vm.wait_output("tick 2\n", timeout=30)
        vm.snapshot("Full")
        vm.snapshot("Diff")
        for state in ("Paused", "Resumed"):
            status, body = vm.request("PATCH", "/vm", {"state": state})
            check(status == 204, f"{state}: {status} {body}")
        vm.read_console(0.5)
        last = int(vm.out.rsplit(b"tick ", 1)[1].split(b"\n")[0])
        vm.wait_output(f"tick {last + 1}\n", timeout=30)
        tasks = task_status(vm.proc.pid)
        names = sorted(t[0] for t in tasks.values())
        if sanitized_build():
            # Sanitizer builds run without filters (sandbox/meson.build: COVE_SANITIZED), and
            # the threads are named as the filters are installed: only the vCPU has its name.
            check("cove-vcpu0" in names, f"threads: {names}")
            on = {tid: t for tid, t in tasks.items() if t[1] != "0"}
            check(not on, f"sanitizer build, yet threads with a filter: {on}")
            check(vm.alive(), "cove died after snapshots and pause/resume")
            print(f"ASan build: no seccomp filters (by design), threads {names}; snapshots and "
                  "pause/resume work; filters are checked in the plain build")
            return
        check(len(tasks) >= 3 and "cove-vcpu0" in names
              and "cove-evloop" in names, f"threads: {names}")
        bad = {tid: t for tid, t in tasks.items() if t[1] != "2" or t[2] < 1}
        check(not bad, f"threads without a seccomp filter: {bad}")
        # stderr is read only once cove is gone: reading it reads to EOF.
        if not vm.alive():
            raise Failure("cove died under its filters: " + vm.stderr())
        print(f"ok every thread filtered while it runs: {sorted(tasks.values())}")


def expect_sigsys(kind, call, syscall, thread):
    os.environ["COVE_TEST_SECCOMP"] = f"{kind}:{call}"
    try:
        with Vm(guest("counter"), api=False) as vm:
            try:
                rc = vm.proc.wait(60)
            except subprocess.TimeoutExpired:
                raise Failure(f"{kind}:{call}: cove still runs after a forbidden call")
            err = vm.stderr()
            check(rc == -signal.SIGSYS, f"{kind}:{call}: exit {rc}, not death by SIGSYS: {err}")
            want = f"thread {thread} made a forbidden system call: {syscall} ("
            check(want in err, f"{kind}:{call}: no line naming the call: {err!r}")
    finally:
        del os.environ["COVE_TEST_SECCOMP"]
    print(f"ok {kind}:{call}: died by SIGSYS naming {syscall} in {thread}")


def test_violations(tmp):
    if sanitized_build():
        print("ASan build: forbidden calls not checked (no filters in sanitizer builds); the "
              "plain build checks them")
        return
    for kind, thread in (("vcpu", "cove-vcpu0"), ("evloop", "cove-evloop")):
        for call, syscall in (("execve", "execve"), ("socket", "socket"), ("open", "openat")):
            expect_sigsys(kind, call, syscall, thread)
    check(not os.path.exists("/tmp/cove-seccomp-test-new-file"), "the forbidden open created a file")


def test_no_seccomp(tmp):
    os.environ["COVE_TEST_SECCOMP"] = "evloop:socket"
    try:
        with Vm(guest("counter"), extra=["--no-seccomp"]) as vm:
            vm.wait_output("tick 2\n", timeout=30)
            tasks = task_status(vm.proc.pid)
            check(all(t[1] == "0" for t in tasks.values()), f"--no-seccomp has filters: {tasks}")
            vm.stop()
            err = vm.stderr()
            check("--no-seccomp" in err and "WITHOUT seccomp" in err, f"no loud warning: {err!r}")
    finally:
        del os.environ["COVE_TEST_SECCOMP"]
    print("ok --no-seccomp: no filters, a loud warning, the trigger's call allowed")


def test():
    # Death by SIGSYS dumps core by default: a core of a VMM holds all guest RAM.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    import shutil
    import tempfile
    for t in (test_filters_on_every_thread, test_violations, test_no_seccomp):
        tmp = tempfile.mkdtemp(prefix="cove-seccomp-")
        try:
            t(tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(test)
