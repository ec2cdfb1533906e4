"""e2e: the Python SDK (sdk/python, issue 35) driving real sandboxes in the KVM box.

One sandbox through the SDK: exec with its output, status, env, cwd, user and stdin; files;
streaming; detached commands attached later; a port forwarded; a timeout that kills the command
and leaves the sandbox usable; stop and reconnect with the same object; pause and resume; fork;
archive and connect; 16 threads and 16 asyncio tasks at once; the errors a real cause gives
(deleted, already exists, not found, invalid name). Then calls per second of a trivial exec:
the SDK's direct agent connection against a `cove exec` process per call, and the SDK's
example script as README shows it."""
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import box_tests as bt

SDK = "/work/sdk"
STATE = "/tmp/cove-sdk"
RUN = "/tmp/cove-sdkrun"
ENV = {"COVE": "/work/cove", "COVE_STATE_DIR": STATE, "COVE_RUN_DIR": RUN,
       "COVE_GUEST_DIR": "/work"}


class _Env:
    """os.environ as the SDK reads it, for this test only."""

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in ENV}
        os.environ.update(ENV)
        for d in (STATE, RUN):
            shutil.rmtree(d, ignore_errors=True)
        if SDK not in sys.path:
            sys.path.insert(0, SDK)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_sdk_sandbox():
    """The SDK's calls on one real sandbox and a fork of it, each checked."""
    with _Env():
        import cove
        t0 = time.monotonic()
        sbx = cove.Sandbox.create("sdk1", snapshot_every="off")
        print(f"    Sandbox.create: {time.monotonic() - t0:.1f} s")
        r = sbx.exec("echo out; echo err >&2; exit 3")
        bt.check((r.stdout, r.stderr, r.exit_code) == (b"out\n", b"err\n", 3), f"exec: {r}")
        r = sbx.exec(["sh", "-c", 'echo "$X"; pwd; id -u'], env={"X": "a b"}, cwd="/tmp",
                     user="root")
        bt.check(r.text.split("\n")[:3] == ["a b", "/tmp", "0"], f"env/cwd/user: {r}")
        data = os.urandom(200_000)
        bt.check(sbx.exec(["cat"], stdin=data).stdout == data, "stdin of 200 kB")
        sbx.files.write("/notes.txt", "from the sdk\n")
        bt.check(sbx.files.read("/notes.txt") == b"from the sdk\n", "files.read")
        bt.check("notes.txt" in sbx.files.list("/"), "files.list")
        sbx.files.write("/gone.txt", "x")
        sbx.files.remove("/gone.txt")
        bt.check("gone.txt" not in sbx.files.list("/"), "files.remove")
        parts = list(sbx.stream("for i in 1 2 3; do echo $i; sleep 0.5; done"))
        outs = [b for s, b in parts if s == "stdout"]
        bt.check(b"".join(outs) == b"1\n2\n3\n" and len(outs) > 1 and parts[-1] == (
            "exit", b"0"), f"stream: {parts}")
        sid = sbx.exec_detached("sleep 1; echo done-later; exit 4")
        r = sbx.attach(sid, timeout=60)
        bt.check((r.stdout, r.exit_code) == (b"done-later\n", 4), f"attach: {r}")
        # A port: busybox nc in the guest answers one connection.
        sbx.exec_detached("echo hello-from-guest | nc -l -p 8000")
        time.sleep(1)
        with sbx.forward(8000) as port:
            got = b""
            for _ in range(20):
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                        got = c.recv(100)
                    if got:
                        break
                except OSError:
                    pass
                time.sleep(0.5)
        bt.check(got == b"hello-from-guest\n", f"forward: {got!r}")
        # A timeout kills the command, the sandbox goes on.
        t0 = time.monotonic()
        try:
            # 10 s: "started" is surely printed by then, even on a slow, loaded box.
            sbx.exec("echo started; sleep 120", timeout=10)
            raise bt.Failure("a 120 s command with timeout=10 returned")
        except cove.Timeout as e:
            bt.check(e.stdout == b"started\n", f"Timeout.stdout {e.stdout!r}")
        bt.check(time.monotonic() - t0 < 70, "the 10 s timeout took over 70 s")
        bt.check(sbx.exec("echo alive").text == "alive\n", "exec after a timeout")
        # Stop and reconnect with the same object; pause and resume.
        sbx.stop()
        bt.check(sbx.state() == "stopped", f"state after stop: {sbx.state()}")
        bt.check(sbx.files.read("/notes.txt") == b"from the sdk\n", "reconnect after stop")
        sbx.pause()
        bt.check(sbx.state() == "paused", f"state after pause: {sbx.state()}")
        sbx.resume()
        bt.check(sbx.exec("echo resumed").text == "resumed\n", "exec after resume")
        # Fork.
        (f,) = sbx.fork("sdk2")
        r = f.exec("cat /notes.txt; hostname")
        bt.check(r.text == "from the sdk\nsdk2\n", f"fork: {r}")
        # 16 threads and 16 asyncio tasks on one sandbox at once.
        res = [None] * 16

        def one(i):
            res[i] = sbx.exec(f"echo t{i}").text
        ts = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        t0 = time.monotonic()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        bt.check(res == [f"t{i}\n" for i in range(16)], f"16 threads: {res}")
        t_threads = time.monotonic() - t0

        async def tasks():
            a = cove.AsyncSandbox("sdk1")
            rs = await asyncio.gather(*(a.exec(f"echo a{i}") for i in range(16)))
            return [r.text for r in rs]
        t0 = time.monotonic()
        got = asyncio.run(tasks())
        bt.check(got == [f"a{i}\n" for i in range(16)], f"16 asyncio tasks: {got}")
        print(f"    16 threads {t_threads:.1f} s, 16 asyncio tasks "
              f"{time.monotonic() - t0:.1f} s, each answered its own")
        # Archive, then connect by name.
        sbx.archive()
        bt.check(sbx.state() == "archived", f"state after archive: {sbx.state()}")
        again = cove.Sandbox.connect("sdk1")
        bt.check(again.files.read("/notes.txt") == b"from the sdk\n", "connect after archive")
        # Errors by their real causes.
        for what, call, cls, status in (
                ("fork onto an existing name", lambda: sbx.fork("sdk2"), cove.AlreadyExists, 68),
                ("connect to a name never made", lambda: cove.Sandbox.connect("never"),
                 cove.NotFound, 65),
                ("a bad name", lambda: cove.Sandbox.connect("Bad_Name"), cove.InvalidName, 64)):
            try:
                call()
                raise bt.Failure(f"{what}: no error")
            except cls as e:
                bt.check(e.status == status, f"{what}: status {e.status}")
        f.rm()
        try:
            f.exec("true")
            raise bt.Failure("exec of a removed sandbox: no error")
        except cove.Deleted as e:
            bt.check(e.status == 66 and "sdk2" in e.message, f"Deleted: {e.status} {e}")
        print("    errors: AlreadyExists 68, NotFound 65, InvalidName 64, Deleted 66")

        # Calls per second of a trivial exec, side by side.
        n = 30
        t0 = time.monotonic()
        for _ in range(n):
            sbx.exec(["true"])
        sdk_rate = n / (time.monotonic() - t0)
        t0 = time.monotonic()
        for _ in range(n):
            subprocess.run(["/work/cove", "exec", "sdk1", "--", "true"], check=True,
                           env=dict(os.environ), capture_output=True)
        cli_rate = n / (time.monotonic() - t0)
        print(f"    trivial exec, {n} calls each: SDK over the agent socket {sdk_rate:.1f}/s, "
              f"a cove exec process per call {cli_rate:.1f}/s ({sdk_rate / cli_rate:.1f}x); "
              f"the box emulates its CPU")
        sbx.rm()


test_sdk_sandbox.time_limit = 900


def test_sdk_example():
    """sdk/python/examples/quickstart.py, as README shows it, with cove on PATH."""
    with _Env():
        env = dict(os.environ, PATH="/work:" + os.environ.get("PATH", "/usr/bin:/bin"),
                   PYTHONPATH=SDK)
        p = subprocess.run([sys.executable, os.path.join(SDK, "examples", "quickstart.py")],
                           env=env, capture_output=True, text=True, timeout=600)
        bt.check(p.returncode == 0, f"quickstart.py: rc={p.returncode} {p.stderr[-1500:]!r}")
        bt.check("hello from agent-demo" in p.stdout and "notes: kept across the stop" in
                 p.stdout, f"quickstart.py printed {p.stdout!r}")
        print("    " + p.stdout.strip().replace("\n", "\n    "))


test_sdk_example.time_limit = 600

def _git(*args, cwd=None):
    r = subprocess.run(["git", "-c", "user.name=e2e", "-c", "user.email=e2e@cove.invalid",
                        "-c", "init.defaultBranch=main", *args], cwd=cwd, capture_output=True,
                       text=True, timeout=120)
    bt.check(r.returncode == 0, f"git {' '.join(args)[:80]}: {r.stderr[-300:]!r}")


def _commit_test(repo, work, name, body):
    """One commit to the bare REPO (through the work tree WORK): a test file NAME."""
    with open(os.path.join(work, name), "w") as f:
        f.write(body)
    gd = [f"--git-dir={repo}", f"--work-tree={work}"]
    _git(*gd, "add", "-A")
    _git(*gd, "commit", "-q", "-m", f"add {name}")


def test_sdk_agent_loop():
    """sdk/python/examples/agent_loop.py as a user runs it, on the Debian image: day one, the
    sandbox clones a private repository over HTTPS (git http-backend, 401 without the token)
    with the token added by the broker on the way out, runs its tests, stops. The box clock is
    then moved 8 days on (every certificate the test makes is valid for 10); the reconnect sets
    the guest's clock, the pull gets a new commit through a fresh interception, and the tests
    run again. The token is in no output and no guest environment."""
    import image_tests as it  # the Debian image, its TLS server and git http-backend
    import agent_tests as at
    it.need_image()
    for t in ("git", "/usr/lib/git-core/git-http-backend"):
        if not shutil.which(t):
            raise bt.Failure(f"{t} is not in the box (tests/e2e/run adds it from the host)")
    import base64
    import secrets
    import tempfile
    tmp = tempfile.mkdtemp(prefix="agentloop-")
    secret = "ghp-" + secrets.token_hex(20)
    week = 8 * 86400
    moved = False
    httpd = None
    try:
        work, repos = os.path.join(tmp, "work"), os.path.join(tmp, "repos")
        os.makedirs(work)
        os.makedirs(repos)
        bare = os.path.join(repos, "proj.git")
        _git("init", "-q", "--bare", bare)
        with open(os.path.join(work, "run-tests"), "w") as f:
            f.write("#!/bin/sh\nexec python3 -m unittest discover -p 'test_*.py'\n")
        os.chmod(os.path.join(work, "run-tests"), 0o755)
        _commit_test(bare, work, "test_one.py",
                     "import unittest\n\nclass One(unittest.TestCase):\n"
                     "    def test_sum(self):\n        self.assertEqual(sum([1, 2]), 3)\n")
        it._GitCGI.root = repos
        it._GitCGI.want = "Basic " + base64.b64encode(f"bot:{secret}".encode()).decode()
        it._GitCGI.seen = []
        httpd, port = it._tls_server(tmp, "git.cove.test", it._GitCGI, days=10)
        helper, senv = at.secret_store(tmp, secret)
        policy = {"credentials": {"git": {
            "helper": helper, "helper_input": {"protocol": "https", "host": "git.cove.test"},
            "inject": {"header": "Authorization", "template": "Basic {username}:{password}"},
            "allow": {"schemes": ["https"], "hosts": ["git.cove.test"], "ports": [port],
                      "path_prefixes": ["/proj.git/"], "methods": ["GET", "POST"],
                      "headers": ["Accept", "Accept-Language", "Content-Type", "Git-Protocol",
                                  "Pragma", "User-Agent", "Content-Encoding"]},
            "allow_private": True, "ca_file": os.path.join(tmp, "ca.crt")}}}
        pol = os.path.join(tmp, "policy.json")
        with open(pol, "w") as f:
            json.dump(policy, f)
        with _Env():
            env = dict(os.environ, PATH="/work:" + os.environ.get("PATH", "/usr/bin:/bin"),
                       PYTHONPATH=SDK, GNUPGHOME=senv["GNUPGHOME"],
                       PASSWORD_STORE_DIR=senv["PASSWORD_STORE_DIR"])
            if not os.path.exists("/work/cove-broker"):
                env["COVE_BROKER"] = at.BROKER
            loop = [sys.executable, os.path.join(SDK, "examples", "agent_loop.py")]

            def run(*args):
                t0 = time.monotonic()
                p = subprocess.run(loop + list(args), env=env, capture_output=True, text=True,
                                   timeout=900)
                bt.check(secret not in p.stdout + p.stderr, "the token in the loop's output")
                bt.check(p.returncode == 0, f"agent_loop.py {args[0]}: rc={p.returncode} "
                         f"{p.stdout[-1500:]!r} {p.stderr[-1500:]!r}; server saw "
                         f"{it._GitCGI.seen[-4:]!r}")
                print(f"    agent_loop.py {args[0]} ({time.monotonic() - t0:.1f} s):\n      " +
                      p.stdout.strip().replace("\n", "\n      "))
                return p.stdout
            out = run("start", "agentloop", f"https://git.cove.test:{port}/proj.git", pol,
                      it.IMAGE)
            bt.check("Ran 1 test" in out and "\nOK" in out and "agentloop: stopped" in out,
                     f"day one: {out!r}")
            _commit_test(bare, work, "test_two.py",
                         "import unittest\n\nclass Two(unittest.TestCase):\n"
                         "    def test_upper(self):\n"
                         "        self.assertEqual('a'.upper(), 'A')\n")
            before = time.time()
            r = subprocess.run(["date", "-s", f"@{int(before) + week}"], capture_output=True)
            bt.check(r.returncode == 0, f"date -s: {r.stderr!r}")
            moved = True
            out = run("resume", "agentloop")
            bt.check("add test_two.py" in out and "Ran 2 tests" in out and "\nOK" in out,
                     f"a week later: {out!r}")
            clocks = [ln.rsplit(" ", 1)[-1] for ln in out.splitlines() if "guest clock" in ln]
            got = time.mktime(time.strptime(clocks[0], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
            bt.check(got >= before + week - 60, f"the guest's clock after the reconnect: "
                     f"{clocks[0]}, want >= {before + week:.0f}")
            bt.check(it._GitCGI.seen and all(ok for _, _, ok in it._GitCGI.seen),
                     f"a request without the token reached the server: {it._GitCGI.seen!r}")
            r = subprocess.run(["/work/cove", "exec", "agentloop", "--", "sh", "-c",
                                "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; "
                                "git -C /root/work config --list"],
                               env=env, capture_output=True, text=True, timeout=300)
            bt.check(r.returncode == 0 and secret not in r.stdout,
                     f"guest environments and git config: rc={r.returncode} "
                     f"{secret in r.stdout} {r.stderr[-300:]!r}")
            print(f"    the server saw {len(it._GitCGI.seen)} requests, each with the token the "
                  f"broker added; the guest's clock after the reconnect: {clocks[0]}")
            subprocess.run(["/work/cove", "rm", "agentloop"], env=env, capture_output=True,
                           timeout=300)
    finally:
        if moved:
            subprocess.run(["date", "-s", f"@{int(time.time()) - week}"], capture_output=True)
        if httpd:
            httpd.shutdown()
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=dict(
            os.environ, GNUPGHOME=os.path.join(tmp, "gnupg")), capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


test_sdk_agent_loop.time_limit = 900


def test_sdk_key_refused():
    """An encrypted sandbox whose KEK is revoked: connect raises KeyRefused (exit 67), and once
    the KEK is back the same call reconnects it with its data."""
    with _Env():
        import cove
        from lifecycle_tests import KEK_CMD  # a test key command: XOR with a KEK file
        kdir = "/tmp/cove-sdk-kek"
        shutil.rmtree(kdir, ignore_errors=True)
        os.mkdir(kdir)
        script, kek = os.path.join(kdir, "kek.py"), os.path.join(kdir, "kek")
        with open(script, "w") as f:
            f.write(KEK_CMD)
        with open(kek, "wb") as f:
            f.write(os.urandom(32))
        sbx = cove.Sandbox.create("sdkkey", key=f"key-cmd:python3 {script} {kek}",
                                  snapshot_every="off")
        sbx.files.write("/secret-work", "kept under my key\n")
        sbx.stop()
        os.rename(kek, kek + ".revoked")
        try:
            cove.Sandbox.connect("sdkkey")
            raise bt.Failure("connect with the KEK revoked: no error")
        except cove.KeyRefused as e:
            bt.check(e.status == 67, f"KeyRefused status {e.status}")
            print(f"    KEK revoked: KeyRefused, exit {e.status}: {e.message[:160]}")
        os.rename(kek + ".revoked", kek)
        got = cove.Sandbox.connect("sdkkey").files.read("/secret-work")
        bt.check(got == b"kept under my key\n", f"after the KEK came back: {got!r}")
        sbx.rm()


test_sdk_key_refused.time_limit = 600


def test_json_shapes():
    """Every command's --json on real sandboxes, checked against docs/CLI.md's shapes: create,
    stop, start, pause, resume, archive, template create, ls and rm, fork, ls, ls --cache,
    image ls, rm, gc, version, and an error line (image import: the oci module)."""
    import json_shapes
    shapes = json_shapes.load("/work/CLI.md")
    with _Env():
        env = dict(os.environ)

        def run(*args, shape, status=0):
            p = subprocess.run(["/work/cove", *args, "--json"], env=env, capture_output=True,
                               text=True, timeout=600)
            bt.check(p.returncode == status, f"cove {' '.join(args)} --json: rc={p.returncode} "
                     f"{p.stderr[-800:]!r}")
            text = p.stdout if status == 0 else p.stderr
            lines = text.strip().splitlines()
            bt.check(len(lines) == 1, f"cove {' '.join(args)} --json printed {text!r}")
            doc = json.loads(lines[0])
            bad = json_shapes.problems(shapes, shape, doc)
            bt.check(not bad, f"cove {' '.join(args)} --json does not fit {shape}: {bad}")
            return doc
        want = [("create", "running"), ("stop", "stopped"), ("start", "running"),
                ("pause", "paused"), ("resume", "running"), ("archive", "archived")]
        for cmd, state in want:
            args = (cmd, "js1") + (("--snapshot-every", "off") if cmd == "create" else ())
            doc = run(*args, shape="lifecycle")
            bt.check(doc["sandbox"] and doc["sandbox"]["state"] == state,
                     f"{cmd} --json: state {doc['sandbox']}")
        doc = run("template", "create", "jst", shape="template")
        bt.check(doc["template"] == "jst", f"template create: {doc}")
        doc = run("template", "ls", shape="template ls")
        bt.check([t["name"] for t in doc["templates"] if not t["implicit"]] == ["jst"],
                 f"template ls: {doc}")
        run("template", "rm", "jst", shape="template")
        doc = run("fork", "js1", "js2", "--stopped", shape="fork")
        bt.check(doc["from"] == "js1" and [c["name"] for c in doc["clones"]] == ["js2"],
                 f"fork: {doc}")
        doc = run("ls", shape="ls")
        bt.check(sorted(e["name"] for e in doc["sandboxes"]) == ["js1", "js2"], f"ls: {doc}")
        doc = run("ls", "--cache", shape="ls --cache")
        doc = run("image", "ls", shape="image ls")
        bt.check(doc["images"] == [], f"image ls on a host with no images: {doc}")
        run("rm", "js2", shape="rm")
        doc = run("rm", "js1", shape="rm")
        bt.check(doc["removed"] is True and doc["name"] == "js1", f"rm: {doc}")
        run("gc", shape="gc")
        run("version", shape="version")
        doc = run("start", "js1", shape="error", status=66)
        bt.check(doc["exit"] == 66, f"start of a removed sandbox: {doc}")
        print(f"    --json: {len(want) + 13} commands fit docs/CLI.md's shapes")


test_json_shapes.time_limit = 600

TESTS = [test_sdk_sandbox, test_sdk_example, test_sdk_agent_loop, test_sdk_key_refused,
         test_json_shapes]
