"""e2e: README's ten-minute tour, run as written (issue 37), so the front page cannot rot.

The commands between README.md's tour markers run one line at a time with `cove` on PATH (the
box's /work/cove with its helpers beside it) and the guest pinned to the busybox root the box
carries (COVE_GUEST_DIR=/work), in a state root of their own. Every command must exit 0, and
what the tour says each read shows is checked: the notes after the stop, the fork and the
archive, the fork's own hostname, the template's file."""
import os
import re
import shutil
import subprocess
import time

import box_tests as bt

README = "/work/README.md"
STATE = "/tmp/cove-tour"
RUN = "/tmp/cove-tourrun"


def tour_commands():
    with open(README) as f:
        text = f.read()
    m = re.search(r"<!-- tour:begin -->\n```sh\n(.*?)```\n<!-- tour:end -->", text, re.S)
    bt.check(m is not None, "README.md has no tour between its markers")
    cmds = [line.strip() for line in m.group(1).splitlines()
            if line.strip() and not line.strip().startswith("#")]
    bt.check(len(cmds) >= 10 and all(c.startswith("cove ") for c in cmds),
             f"the tour's commands are not cove commands: {cmds}")
    return cmds


def test_tour_readme():
    """README's tour, command by command: each exits 0, and each read shows what the tour
    says it shows."""
    cmds = tour_commands()
    for d in (STATE, RUN):
        shutil.rmtree(d, ignore_errors=True)
    env = dict(os.environ, PATH="/work:" + os.environ.get("PATH", "/usr/bin:/bin"),
               COVE_STATE_DIR=STATE, COVE_RUN_DIR=RUN, COVE_GUEST_DIR="/work")
    outs = {}
    t_all = time.monotonic()
    for cmd in cmds:
        t0 = time.monotonic()
        p = subprocess.run(["sh", "-c", cmd], env=env, capture_output=True, text=True,
                           timeout=600)
        took = time.monotonic() - t0
        bt.check(p.returncode == 0, f"tour: `{cmd}` exited {p.returncode}: "
                 f"{p.stderr.strip()[-800:]!r}")
        outs.setdefault(cmd, []).append(p.stdout)
        first = p.stdout.strip().splitlines()[:1]
        print(f"    {cmd}  ({took:.1f} s){': ' + first[0][:100] if first else ''}")

    def out(prefix, n=0):
        hits = [o for c, os_ in outs.items() if c.startswith(prefix) for o in os_]
        bt.check(len(hits) > n, f"tour: no command starting {prefix!r}")
        return hits[n]
    bt.check(out("cove exec agent1 -- sh -c").splitlines()[-1].count(".") >= 2,
             "tour: uname -r printed no kernel version")
    bt.check("agent1" in out("cove ls"), f"tour: cove ls does not list agent1: {out('cove ls')!r}")
    bt.check(out("cove exec agent1 -- cat /notes.txt", 0) == "work in progress\n",
             "tour: the notes after the stop and reconnect")
    bt.check(out("cove exec agent2").split("\n")[:2] == ["work in progress", "agent2"],
             f"tour: the fork's notes and hostname: {out('cove exec agent2')!r}")
    bt.check(out("cove exec agent3") == "v1\n", f"tour: the template's file on agent3: "
             f"{out('cove exec agent3')!r}")
    bt.check(out("cove exec agent1 -- cat /notes.txt", 1) == "work in progress\n",
             "tour: the notes after the archive and reconnect")
    left = [n for n in os.listdir(STATE) if not n.startswith(".")] \
        if os.path.isdir(STATE) else []
    bt.check(not left, f"tour: sandboxes left after its clean-up: {left}")
    print(f"    README's tour: {len(cmds)} commands in {time.monotonic() - t_all:.1f} s")


test_tour_readme.time_limit = 600

TESTS = [test_tour_readme]
