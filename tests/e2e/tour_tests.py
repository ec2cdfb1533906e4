"""e2e: README's ten-minute tour, run as written (issue 37), so the front page cannot rot.

The commands between README.md's tour markers run as one shell script with `cove` on PATH (the
box's /work/cove with its helpers beside it) and the guest pinned to the busybox root the box
carries (COVE_GUEST_DIR=/work), in a state root of their own. Every command must exit 0, and
what the tour says each read shows is checked: the notes after the stop, the fork and the
archive, the fork's own hostname, the template's file, and the broker's request (the stand-in
API logged the pass entry's token; the sandbox's environment and command line never held it)."""
import os
import re
import shutil
import subprocess
import time

import box_tests as bt

README = "/work/README.md"
REPO = "/work/repo"  # the tour's files, where README has them: docs/examples, broker/helpers
STATE = "/tmp/cove-tour"
RUN = "/tmp/cove-tourrun"


def tour_commands():
    with open(README) as f:
        text = f.read()
    m = re.search(r"<!-- tour:begin -->\n```sh\n(.*?)```\n<!-- tour:end -->", text, re.S)
    bt.check(m is not None, "README.md has no tour between its markers")
    cmds = [line.strip() for line in m.group(1).splitlines()
            if line.strip() and not line.strip().startswith("#")]
    bt.check(sum(c.startswith("cove ") for c in cmds) >= 10, f"a tour of few cove commands: {cmds}")
    return cmds


def test_tour_readme():
    """README's tour as one shell script from the repository's top (docs/examples and
    broker/helpers beside it): every command exits 0, and each read shows what the tour says it
    shows, the broker's request included (the API got the token, the sandbox never held it)."""
    cmds = tour_commands()
    for d in (STATE, RUN):
        shutil.rmtree(d, ignore_errors=True)
    env = dict(os.environ, PATH="/work:" + os.environ.get("PATH", "/usr/bin:/bin"),
               COVE_STATE_DIR=STATE, COVE_RUN_DIR=RUN, COVE_GUEST_DIR="/work")
    # One shell, so that what a line exports holds for the next; a marker before each command
    # says whose output follows.
    script = "set -e\n" + "".join(f"echo '@@tour {i}'\n{c}\n" for i, c in enumerate(cmds))
    t0 = time.monotonic()
    p = subprocess.run(["sh", "-c", script], env=env, cwd=REPO, capture_output=True, text=True,
                       timeout=900)
    took = time.monotonic() - t0
    outs, cur = {}, None
    for line in p.stdout.splitlines(keepends=True):
        m = re.match(r"@@tour (\d+)\n", line)
        if m:
            cur = int(m.group(1))
            outs[cur] = ""
        elif cur is not None:
            outs[cur] += line
    last = max(outs) if outs else -1
    bt.check(p.returncode == 0 and last == len(cmds) - 1,
             f"tour: `{cmds[last] if last >= 0 else '(none)'}` failed (exit {p.returncode}): "
             f"{p.stderr.strip()[-1200:]!r}")
    for i, c in enumerate(cmds):
        first = outs.get(i, "").strip().splitlines()[:1]
        print(f"    {c[:90]}{': ' + first[0][:80] if first else ''}")

    def out(prefix, n=0):
        hits = [outs.get(i, "") for i, c in enumerate(cmds) if c.startswith(prefix)]
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
    bt.check(out("cove exec agent4 -- cove-fetch") == "hello from an API that got its token\n",
             f"tour: the broker's request: {out('cove exec agent4 -- cove-fetch')!r}")
    bt.check("echo-auth: /v1/hello with Authorization: Bearer tok-123" in p.stderr,
             f"tour: the API did not log the token: {p.stderr[-800:]!r}")
    bt.check(out("cove exec agent4 -- sh -c") == "0\n",
             f"tour: the token inside the sandbox: {out('cove exec agent4 -- sh -c')!r}")
    left = [n for n in os.listdir(STATE) if not n.startswith(".")] \
        if os.path.isdir(STATE) else []
    bt.check(not left, f"tour: sandboxes left after its clean-up: {left}")
    print(f"    README's tour: {len(cmds)} commands in {took:.1f} s")


test_tour_readme.time_limit = 900

TESTS = [test_tour_readme]
