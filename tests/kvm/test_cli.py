#!/usr/bin/env python3
"""Option errors are one clear line with status 2; bad kernel files are clear errors, not crashes."""
import os
import shutil
import subprocess
import tempfile

from covetest import COVE, Vm, check, guest, main, run_cove, sanitized_build


def one_line_error(args, status, *words):
    r = run_cove(args)
    check(r.returncode == status, f"{args}: exit {r.returncode}, want {status}; stderr {r.stderr!r}")
    lines = [l for l in r.stderr.splitlines() if l]
    check(len(lines) == 1, f"{args}: want exactly one stderr line, got {lines!r}")
    for w in words:
        check(w in lines[0], f"{args}: {w!r} not in {lines[0]!r}")
    return lines[0]


def test():
    hello = guest("hello")
    one_line_error(["run"], 2, "--kernel")
    one_line_error(["run", "--kernel", hello, "--bogus"], 2, "--bogus")
    one_line_error(["run", "--kernel", hello, "--mem", "lots"], 2, "--mem", "lots")
    one_line_error(["run", "--kernel", hello, "--mem", "1K"], 2, "--mem")
    one_line_error(["run", "--kernel", hello, "--vcpus", "0"], 2, "--vcpus")
    one_line_error(["run", "--kernel", hello, "--vcpus", "abc"], 2, "--vcpus")
    one_line_error(["run", "--kernel", hello, "--log-level", "loud"], 2, "--log-level")
    one_line_error(["run", "--kernel", hello, "stray"], 2, "stray")
    one_line_error(["run", "--kernel"], 2, "--kernel")
    one_line_error(["frobnicate"], 2, "frobnicate")

    for cmd in (["--help"], ["run", "--help"], ["version", "--help"]):
        r = run_cove(cmd)
        check(r.returncode == 0 and "usage" in r.stdout, f"{cmd}: rc={r.returncode} {r.stdout!r}")
    r = run_cove(["version"])
    check(r.returncode == 0 and r.stdout.startswith("cove "), f"version: {r.stdout!r}")

    one_line_error(["run", "--kernel", "/nonexistent/kernel"], 1, "/nonexistent/kernel")
    with tempfile.TemporaryDirectory() as d:
        data = open(hello, "rb").read()
        trunc = os.path.join(d, "truncated")
        with open(trunc, "wb") as f:
            f.write(data[:40])
        one_line_error(["run", "--kernel", trunc], 1, "truncated")
        # Point the first program header's file offset far outside the file.
        bad = bytearray(data)
        phoff = int.from_bytes(bad[32:40], "little")
        phnum = int.from_bytes(bad[56:58], "little")
        loads = [phoff + 56 * i for i in range(phnum)
                 if int.from_bytes(bad[phoff + 56 * i:phoff + 56 * i + 4], "little") == 1]
        check(loads, "hello has no PT_LOAD header")
        bad[loads[0] + 8:loads[0] + 16] = (1 << 40).to_bytes(8, "little")
        badseg = os.path.join(d, "badseg")
        with open(badseg, "wb") as f:
            f.write(bad)
        one_line_error(["run", "--kernel", badseg], 1, "outside the file")
        empty = os.path.join(d, "empty")
        open(empty, "wb").close()
        one_line_error(["run", "--kernel", empty], 1, "empty")
        one_line_error(["run", "--kernel", d], 1, "not a regular file")


def test_lifecycle_cli():
    """Sandboxes by name: hostile names, options, spec and event log are one line and a distinct
    status; nothing is created by a refused command and nothing is deleted by a failed one."""
    hello = guest("hello")
    with tempfile.TemporaryDirectory() as d:
        root = os.path.join(d, "state")
        os.environ.update(COVE_STATE_DIR=root, COVE_RUN_DIR=os.path.join(d, "run"),
                          COVE_GUEST_DIR=d)
        one_line_error(["create", "Bad_Name"], 64, "name")
        one_line_error(["create", "a" * 49], 64, "too long")
        one_line_error(["create", "ok", "--mem", "lots"], 2, "--mem")
        one_line_error(["create", "ok", "--snapshot-every", "5ms"], 2, "--snapshot-every")
        one_line_error(["create", "ok", "--idle-stop", "0"], 2, "--idle-stop")
        one_line_error(["create", "ok", "--archive-after", "soon"], 2, "--archive-after")
        one_line_error(["create", "ok", "--bogus"], 2, "--bogus")
        one_line_error(["create", "ok", "--kernel", hello, "--rootfs", hello, "--initrd", hello],
                       2, "one root")
        one_line_error(["create", "ok", "--kernel", hello, "--rootfs", hello, "--disk",
                        hello + ",overlay=/tmp/x"], 2, "overlay")
        one_line_error(["create", "ok", "--kernel", "/nonexistent"], 2, "/nonexistent")
        # --policy: a file that is missing, not a regular file, too large, not JSON, not an
        # object, or refused by cove-broker check-policy: one line, status 69, nothing created.
        pol = os.path.join(d, "policy.json")
        cases = [("/nonexistent/policy.json", None, "No such file"),
                 (d, None, "not a regular file"),
                 (pol, "{" + " " * (256 * 1024) + "}", "256 KiB"),
                 (pol, "{", "not JSON"),
                 (pol, '{"a":1,"a":2}', "not JSON"),
                 (pol, "[]", "not a JSON object"),
                 (pol, "", "empty"),
                 (pol, '{"credentials":{"demo":{"colour":1}}}', "colour")]
        for path, text, word in cases:
            if text is not None:
                with open(path, "w") as f:
                    f.write(text)
            one_line_error(["create", "ok", "--kernel", hello, "--rootfs", hello,
                            "--policy", path], 69, "--policy", word)
            check(not os.path.exists(root), f"a refused --policy ({word}) created {root}")
        # No guest files anywhere: one line that says how to build them.
        os.environ["HOME"] = d
        os.environ["COVE_CACHE"] = os.path.join(d, "nocache")
        one_line_error(["create", "ok"], 2, "guest/kernel/build")
        check(not os.path.exists(os.path.join(root, "ok")), "a refused create left a sandbox")
        one_line_error(["exec", "Bad_Name", "--", "true"], 64, "name")
        one_line_error(["exec", "nobody", "--", "true"], 65, "nobody")
        one_line_error(["stop", "nobody"], 65, "nobody")
        one_line_error(["rm", "../etc"], 64, "name")

        # A spec that is not one cove wrote (a relative kernel path): refused, files kept.
        sb = os.path.join(root, "hostile")
        os.makedirs(sb, mode=0o700)
        spec = os.path.join(sb, "spec.json")
        with open(spec, "w") as f:
            f.write('{"version":1,"kernel":"rel/k","initrd":"","cmdline":"","key":"",'
                    '"policy":"","mem_bytes":1,"vcpus":1,"snapshot_every_ms":0,'
                    '"idle_stop_ms":0,"archive_after_ms":0,"delete_after_ms":0,'
                    '"created_ms":0,"disks":[]}')
        one_line_error(["start", "hostile"], 67, "spec.json")
        for junk in ("x" * 70000, "{", '{"version":1}', "[]"):
            with open(spec, "w") as f:
                f.write(junk)
            one_line_error(["exec", "hostile", "--", "true"], 67, "spec.json")
        check(os.path.exists(spec), "a refused start removed the spec")
        # An event log whose last line is not an event: the state is unknown, not guessed.
        with open(os.path.join(sb, "events.jsonl"), "w") as f:
            f.write('{"to":"elsewhere"}\n')
        one_line_error(["stop", "hostile"], 1, "cannot read its state")
        test_fork_refused(root, hello)
        # A state root others can write is refused: they could plant links in it.
        os.chmod(root, 0o777)
        one_line_error(["create", "other", "--kernel", hello, "--rootfs", hello], 1, root)
        os.chmod(root, 0o700)
        check(not os.path.exists(os.path.join(root, "other")), "create under a bad root made a dir")


def test_fork_refused(root, hello):
    """cove fork NAME NEW...: bad, unknown, deleted, duplicate and existing names are one line and
    a distinct status, and a refused fork creates nothing (no sandbox, no temporary directory)."""
    def entries():
        return sorted(os.listdir(root))

    os.makedirs(os.path.join(root, "taken"), mode=0o700)
    before = entries()
    one_line_error(["fork", "Bad_Name", "b"], 64, "name")
    one_line_error(["fork", "hostile", "Bad_Name"], 64, "name")
    one_line_error(["fork", "hostile", "a" * 49], 64, "too long")
    one_line_error(["fork", "nobody", "b"], 65, "nobody")
    one_line_error(["fork", "hostile"], 2, "NEW")
    one_line_error(["fork", "hostile", "x", "x"], 2, "twice")
    one_line_error(["fork", "hostile", "hostile"], 68, "already exists")
    one_line_error(["fork", "hostile", "x", "taken"], 68, "taken")
    one_line_error(["fork", "hostile", "x", "--bogus"], 2, "--bogus")
    # hostile's event log is junk: its state is unknown, so nothing is forked from it.
    one_line_error(["fork", "hostile", "x"], 1, "cannot read its state")
    check(entries() == before, f"a refused fork changed the state root: {before} -> {entries()}")

    # A stopped sandbox that never committed a snapshot: nothing to fork from.
    nochain = os.path.join(root, "nochain")
    os.makedirs(nochain, mode=0o700)
    with open(os.path.join(nochain, "spec.json"), "w") as f:
        f.write('{"version":1,"kernel":"%s","initrd":"","cmdline":"","key":"",'
                '"policy":"","mem_bytes":1048576,"vcpus":1,"snapshot_every_ms":0,'
                '"idle_stop_ms":0,"archive_after_ms":0,"delete_after_ms":0,'
                '"created_ms":0,"disks":[]}' % hello)
    with open(os.path.join(nochain, "events.jsonl"), "w") as f:
        f.write('{"time":"2025-01-01T00:00:00.000Z","from":"running","to":"stopped",'
                '"cause":"test","pid":1}\n')
    before = entries()
    one_line_error(["fork", "nochain", "x"], 1, "no committed snapshot")
    check(entries() == before, f"a failed fork left files: {before} -> {entries()}")
    # A deleted one says so.
    r = run_cove(["rm", "nochain"])
    check(r.returncode == 0, f"rm nochain: {r.returncode} {r.stderr!r}")
    one_line_error(["fork", "nochain", "x"], 66, "deleted")
    check(not os.path.exists(os.path.join(root, "x")), "a refused fork made a sandbox")
    os.rmdir(os.path.join(root, "taken"))


def test_vmm_exec():
    """cove run execs cove-vmm from its own directory in place: same pid, same command line."""
    with Vm(guest("counter")) as vm:
        vm.wait_output("tick 1\n", timeout=30)
        exe = os.readlink(f"/proc/{vm.proc.pid}/exe")
        check(os.path.basename(exe) == "cove-vmm", f"cove run's pid runs {exe}, not cove-vmm")
        check(os.path.dirname(exe) == os.path.dirname(os.path.realpath(COVE)),
              f"cove-vmm {exe} is not beside {COVE}")
        argv = open(f"/proc/{vm.proc.pid}/cmdline", "rb").read().split(b"\0")
        check(argv[0] == COVE.encode() and argv[1] == b"run", f"command line {argv[:3]}")
        maps = open(f"/proc/{vm.proc.pid}/maps").read()
        libs = ["libcrypto", "libcurl", "libzstd", "libgnutls", "libmicrohttpd"]
        if sanitized_build():
            # The sanitizer build links cove-vmm against the shared libraries its code uses
            # (ASan needs a dynamic link), so libcrypto (snapshot encryption) and libzstd are
            # mapped there; the plain build is static and keeps every library out.
            seen = [lib for lib in ("libcrypto", "libzstd") if lib in maps]
            print(f"ASan build: cove-vmm maps {seen}: its dynamic sanitizer link, not checked; "
                  "libcurl, libgnutls and libmicrohttpd still must not be mapped")
            libs = ["libcurl", "libgnutls", "libmicrohttpd"]
        for lib in libs:
            check(lib not in maps, f"cove-vmm maps {lib}")
        # A static build (the plain one) maps no shared object at all, the loader included.
        with open(exe, "rb") as f:
            elf = f.read(1 << 16)
        if b"/lib64/ld-linux" not in elf:
            objs = sorted({l.split()[-1] for l in maps.splitlines()
                           if len(l.split()) >= 6 and ".so" in l.split()[-1]})
            check(not objs, f"static cove-vmm maps shared objects: {objs}")
        check(vm.stop() == 0, f"SIGTERM: {vm.stderr()}")
    # Without cove-vmm beside it, cove says so in one line, status 1.
    with tempfile.TemporaryDirectory() as d:
        alone = os.path.join(d, "cove")
        shutil.copy2(COVE, alone)
        r = subprocess.run([alone, "run", "--help"], capture_output=True, text=True, timeout=30)
        check(r.returncode == 1 and "cove-vmm" in r.stderr and r.stderr.count("\n") == 1,
              f"cove without cove-vmm: {r.returncode} {r.stderr!r}")


def tests():
    test()
    test_vmm_exec()
    test_lifecycle_cli()


if __name__ == "__main__":
    main(tests)
