"""An agent's loop with the SDK: on day one a sandbox clones a private repository, runs its
tests and stops; any day later the same name is reconnected, pulls what changed, runs the tests
again and goes on.

The repository needs a credential, and the sandbox never holds it: the broker policy names it
(a `pass` entry, say), and cove's egress adds it to the requests for that host on the way out
(docs/CREDENTIALS.md). A stopped sandbox costs no RAM, only its snapshot on disk.

    python3 agent_loop.py start NAME REPO_URL POLICY [ROOTFS]   # day one
    python3 agent_loop.py resume NAME                            # any later day

ROOTFS is a root filesystem image with git and python3 in it (cove create --rootfs); without
it the sandbox uses the host's default machine.
"""
import sys

from cove import Sandbox

WORK = "/root/work"
LOG = "/root/agent-log"


def run_tests(sbx: Sandbox) -> bool:
    """The repository's own test command, as a CI job would run it."""
    r = sbx.exec(["sh", "-c", "./run-tests 2>&1"], cwd=WORK, timeout=600)
    print(r.text.rstrip())
    sbx.exec(["sh", "-c", f"echo \"$(date -u +%FT%TZ) tests exit {r.exit_code}\" >> {LOG}"])
    return r.ok


def git(sbx: Sandbox, *args: str) -> str | None:
    """A git command in the sandbox (the broker adds the credential on the way out); the
    repository's newest commit after it, or None when it failed."""
    r = sbx.exec(["git", *args], timeout=600)
    if not r.ok:
        print(f"git {args[0]} failed ({r.exit_code}): {r.stderr.decode(errors='replace')}")
        return None
    return sbx.exec(["git", "-C", WORK, "log", "--oneline", "-1"]).text.strip()


def start(name: str, url: str, policy: str, rootfs: str | None) -> int:
    sbx = Sandbox.create(name, policy=policy, rootfs=rootfs)
    print(f"{name}: created; guest clock {sbx.exec('date -u +%FT%TZ').text.strip()}")
    head = git(sbx, "clone", "-q", url, WORK)
    if head is None:
        return 1
    print(f"{name}: cloned {url} at {head}")
    ok = run_tests(sbx)
    sbx.stop()  # a final snapshot; the VM's RAM is freed until the next call
    print(f"{name}: stopped")
    return 0 if ok else 1


def resume(name: str) -> int:
    sbx = Sandbox.connect(name)  # restored as it was: the clone, the log, the shell history
    print(f"{name}: reconnected; guest clock {sbx.exec('date -u +%FT%TZ').text.strip()}")
    head = git(sbx, "-C", WORK, "pull", "-q", "--ff-only")
    if head is None:
        return 1
    print(f"{name}: pulled, now at {head}")
    ok = run_tests(sbx)
    print(f"{name}: log\n{sbx.files.read(LOG).decode().rstrip()}")
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    if len(argv) in (4, 5) and argv[0] == "start":
        return start(argv[1], argv[2], argv[3], argv[4] if len(argv) == 5 else None)
    if len(argv) == 2 and argv[0] == "resume":
        return resume(argv[1])
    print("usage: agent_loop.py start NAME REPO_URL POLICY [ROOTFS] | resume NAME",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
