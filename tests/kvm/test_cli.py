#!/usr/bin/env python3
"""Option errors are one clear line with status 2; bad kernel files are clear errors, not crashes."""
import os
import tempfile

from covetest import check, guest, main, run_cove


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


if __name__ == "__main__":
    main(test)
