#!/usr/bin/env python3
"""unit suite (no KVM): the Python SDK (sdk/python) against cove-init's real agent in its test
mode (`cove-init-agent agent --unix PATH`, the host build of the guest's agent) and the real cove
binary, plus an offline install into a venv. The e2e module `sdk` drives real sandboxes.

Usage: test_sdk.py BUILD_DIR (meson passes it; COVE and COVE_INIT name the binaries)."""
import asyncio
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "sdk", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import cove  # noqa: E402
import json_shapes  # noqa: E402
from cove import _agent  # noqa: E402


class Agent:
    """cove-init's agent alone on a Unix socket, commands run on this host in a temp dir."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="cove-sdk-")
        self.uds = os.path.join(self.dir, "vsock.sock")
        self.p = subprocess.Popen([os.environ["COVE_INIT"], "agent", "--unix", self.uds],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(250):
            if os.path.exists(self.uds):
                return
            time.sleep(0.02)
        raise RuntimeError("the agent did not make its socket")

    def close(self) -> None:
        self.p.kill()
        self.p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class AgentTransport(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.a = Agent()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.a.close()

    def exec(self, argv, stdin=None, timeout=None, env=None, cwd=None, on_output=None):
        return _agent.exec_cmd(self.a.uds, argv, env, cwd, None, stdin, timeout, on_output)

    def test_exec_output_and_status(self) -> None:
        code, sig, out, err = self.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
        self.assertEqual((code, sig, out, err), (3, 0, b"out\n", b"err\n"))

    def test_stdin_env_cwd(self) -> None:
        data = os.urandom(300 << 10)  # several frames
        code, _, out, _ = self.exec(["cat"], stdin=data)
        self.assertEqual((code, out), (0, data))
        code, _, out, _ = self.exec(["sh", "-c", 'echo "$X"; pwd'], env={"X": "y z"},
                                    cwd=self.a.dir)
        self.assertEqual(out.decode().split("\n")[:2], ["y z", os.path.realpath(self.a.dir)])

    def test_streaming_order(self) -> None:
        seen = []
        self.exec(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.2; done"],
                  on_output=lambda s, b: seen.append((time.monotonic(), b)))
        self.assertEqual(b"".join(b for _, b in seen), b"1\n2\n3\n")
        self.assertGreater(len(seen), 1, "the output came in one piece, not as printed")
        self.assertGreater(seen[-1][0] - seen[0][0], 0.3)

    def test_timeout_kills_and_agent_goes_on(self) -> None:
        t0 = time.monotonic()
        with self.assertRaises(cove.Timeout) as cm:
            self.exec(["sh", "-c", "echo started; sleep 60"], timeout=1)
        self.assertLess(time.monotonic() - t0, 20)
        self.assertEqual(cm.exception.stdout, b"started\n")
        self.assertEqual(self.exec(["true"])[0], 0)

    def test_detach_attach(self) -> None:
        sid = _agent.exec_detached(self.a.uds, ["sh", "-c", "sleep 0.3; echo later; exit 5"],
                                   None, None, None)
        code, _, out, _ = _agent.attach(self.a.uds, sid, 30, None)
        self.assertEqual((code, out), (5, b"later\n"))

    def test_files(self) -> None:
        path = os.path.join(self.a.dir, "f.bin")
        data = os.urandom(100_000)
        _agent.put(self.a.uds, path, data, 0o600)
        self.assertEqual(_agent.get(self.a.uds, path), data)
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        with self.assertRaises(_agent.AgentError):
            _agent.get(self.a.uds, os.path.join(self.a.dir, "missing"))

    def test_sixteen_threads(self) -> None:
        res = [None] * 16

        def one(i):
            res[i] = self.exec(["sh", "-c", f"echo {i}"])
        ts = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual([r[2] for r in res], [f"{i}\n".encode() for i in range(16)])

    def test_not_up(self) -> None:
        with self.assertRaises(_agent.NotUp):
            _agent.status(os.path.join(self.a.dir, "nothing.sock"))


class HostileAgent(unittest.TestCase):
    """A guest's agent is not trusted: replies that break the protocol end the call with one
    AgentError line, never another exception or a hang."""

    def serve(self, *replies: bytes) -> str:
        d = tempfile.mkdtemp(prefix="cove-sdk-hostile-")
        self.addCleanup(shutil.rmtree, d, True)
        uds = os.path.join(d, "v.sock")
        ls = socket.socket(socket.AF_UNIX)
        ls.bind(uds)
        ls.listen(1)
        self.addCleanup(ls.close)

        def one() -> None:
            c, _ = ls.accept()
            with c:
                c.recv(64)  # CONNECT 1024
                c.sendall(b"OK 1024\n")
                c.recv(65536)  # the request
                for r in replies:
                    c.sendall(r)
                time.sleep(0.5)
        threading.Thread(target=one, daemon=True).start()
        return uds

    @staticmethod
    def msg(obj) -> bytes:
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        return struct.pack(">I", len(data)) + data

    def check_refused(self, call, uds, what) -> None:
        with self.assertRaises(_agent.AgentError) as cm:
            call(uds)
        self.assertNotIn("\n", str(cm.exception))
        self.assertIn(what, str(cm.exception))

    def test_hostile_replies(self) -> None:
        ok = self.msg({"ok": True, "session": "s1", "pid": 1})
        run = lambda uds: _agent.exec_cmd(uds, ["true"], None, None, None, None, 30, None)
        self.check_refused(run, self.serve(ok, b"x" + struct.pack(">I", 3) + b"[1]"),
                           "exit frame")
        self.check_refused(run, self.serve(ok, b"o" + struct.pack(">I", (1 << 20) + 1)),
                           "over")
        self.check_refused(run, self.serve(self.msg(b"not json")), "not JSON")
        self.check_refused(run, self.serve(self.msg([1, 2])), "not a JSON object")
        self.check_refused(run, self.serve(ok), "closed")
        self.check_refused(lambda uds: _agent.get(uds, "/f"),
                           self.serve(self.msg({"ok": True, "size": "1e99"})), "size")
        self.check_refused(lambda uds: _agent.get(uds, "/f"),
                           self.serve(self.msg({"ok": True, "size": 2 << 30})), "size")
        self.check_refused(lambda uds: _agent.exec_detached(uds, ["true"], None, None, None),
                           self.serve(self.msg({"ok": True})), "session id")


class Errors(unittest.TestCase):
    """Each error the real cove gives without a VM, by its real cause."""

    def setUp(self) -> None:
        self.state = tempfile.mkdtemp(prefix="cove-sdk-state-")
        os.environ["COVE_STATE_DIR"] = self.state
        os.environ["COVE_RUN_DIR"] = tempfile.mkdtemp(prefix="cove-sdk-run-")

    def tearDown(self) -> None:
        shutil.rmtree(self.state, ignore_errors=True)
        shutil.rmtree(os.environ["COVE_RUN_DIR"], ignore_errors=True)

    def test_invalid_name(self) -> None:
        with self.assertRaises(cove.InvalidName) as cm:
            cove.Sandbox.connect("Bad!")
        self.assertEqual(cm.exception.status, 64)

    def test_not_found(self) -> None:
        with self.assertRaises(cove.NotFound) as cm:
            cove.Sandbox.connect("nosuch")
        self.assertEqual(cm.exception.status, 65)
        self.assertIn("nosuch", cm.exception.message)
        with self.assertRaises(cove.NotFound):
            cove.Sandbox("nosuch").exec("true")

    def test_list_empty(self) -> None:
        self.assertEqual(cove.Sandbox.list(), [])

    def test_json_refusal_lines(self) -> None:
        """75 and 76 carry cove's JSON line as `detail` (their real causes: the e2e modules store
        and cpu); a text line or a non-object leaves `detail` empty."""
        from cove import _cli
        held = ('{"error":"held","sandbox":"x","host":"host-b","expires_ms":1,"epoch":2}')
        e = _cli.error_for(75, "cove: something first\n" + held + "\n")
        self.assertIsInstance(e, cove.HeldElsewhere)
        self.assertEqual((e.status, e.detail["host"], e.message), (75, "host-b", held))
        cpu = '{"error":"cpu-incompatible","sandbox":"p","detail":"bmi2","exit":76}'
        e = _cli.error_for(76, cpu)
        self.assertIsInstance(e, cove.Incompatible)
        self.assertEqual((e.status, e.detail["detail"]), (76, "bmi2"))
        for text in ("cove: p: this host's CPU cannot take its state: bmi2", "[1, 2]", ""):
            e = _cli.error_for(76, text)
            self.assertIsInstance(e, cove.Incompatible)
            self.assertEqual(e.detail, {})


class JsonShapes(unittest.TestCase):
    """`--json` outputs that need no VM, checked against docs/CLI.md's shapes."""

    def setUp(self) -> None:
        self.shapes = json_shapes.load(os.path.join(ROOT, "docs", "CLI.md"))
        self.state = tempfile.mkdtemp(prefix="cove-sdk-json-")
        self.env = dict(os.environ, COVE_STATE_DIR=self.state,
                        COVE_RUN_DIR=self.state + "-run")

    def tearDown(self) -> None:
        shutil.rmtree(self.state, ignore_errors=True)

    def cove(self, *args):
        p = subprocess.run([os.environ["COVE"], *args], capture_output=True, text=True,
                           env=self.env)
        return p.returncode, p.stdout, p.stderr

    def fits(self, shape, text):
        lines = text.strip().splitlines()
        self.assertEqual(len(lines), 1, text)
        doc = json.loads(lines[0])
        self.assertEqual(json_shapes.problems(self.shapes, shape, doc), [])
        return doc

    def test_version_and_gc(self) -> None:
        rc, out, _ = self.cove("version", "--json")
        self.assertEqual(rc, 0)
        self.assertEqual(self.fits("version", out)["version"], cove.__version__)
        rc, out, _ = self.cove("gc", "--json")
        self.assertEqual(rc, 0)
        self.assertEqual(self.fits("gc", out)["command"], "gc")

    def test_listings(self) -> None:
        """ls, ls --cache, template ls and image ls on an empty host: versioned objects."""
        for args, shape, key in ((("ls",), "ls", "sandboxes"),
                                 (("ls", "--cache"), "ls --cache", "sandboxes"),
                                 (("template", "ls"), "template ls", "templates"),
                                 (("image", "ls"), "image ls", "images")):
            rc, out, err = self.cove(*args, "--json")
            self.assertEqual(rc, 0, err)
            doc = json.loads(out)
            self.assertEqual(json_shapes.problems(self.shapes, shape, doc), [], out)
            self.assertEqual((doc["v"], doc["command"], doc[key]), (1, " ".join(args), []))

    def test_array_items_checked(self) -> None:
        """A NAME[] type checks every item: one bad clone in a fork's object is named."""
        doc = {"v": 1, "command": "fork", "from": "a", "clones": [
            {"name": "b", "state": "running", "linked": 3, "copied": 0},
            {"name": "c", "state": "running", "linked": "3", "copied": 0}]}
        bad = json_shapes.problems(self.shapes, "fork", doc)
        self.assertEqual(len(bad), 1, bad)
        self.assertIn("clones", bad[0])
        doc["clones"].pop()
        self.assertEqual(json_shapes.problems(self.shapes, "fork", doc), [])

    def test_errors(self) -> None:
        # The last: a name that is not UTF-8, which cove's reason quotes; still one JSON line.
        for args, status in ((("stop", "nosuch"), 65), (("rm", "Bad!"), 64),
                             (("template", "rm", "nosuch"), 65),
                             (("template", "rm", os.fsdecode(b"a\xff")), 64)):
            rc, out, err = self.cove(*args, "--json")
            self.assertEqual((rc, out), (status, ""), err)
            doc = self.fits("error", err)
            self.assertEqual(doc["exit"], status)
            self.assertEqual(doc["command"], " ".join(args[:-1]))


class Async(unittest.TestCase):
    def test_sixteen_tasks(self) -> None:
        a = Agent()
        try:
            async def main():
                async def one(i):
                    return await asyncio.to_thread(
                        _agent.exec_cmd, a.uds, ["sh", "-c", f"echo {i}"], None, None, None,
                        None, None, None)
                return await asyncio.gather(*(one(i) for i in range(16)))
            res = asyncio.run(main())
            self.assertEqual([r[2] for r in res], [f"{i}\n".encode() for i in range(16)])
        finally:
            a.close()


class Install(unittest.TestCase):
    def test_offline_venv_install(self) -> None:
        """pip install --no-build-isolation into a venv that sees Debian's setuptools and
        wheel, no network; the installed package's version is cove's (meson.build)."""
        with open(os.path.join(ROOT, "meson.build")) as f:
            want = re.search(r"version\s*:\s*'([^']+)'", f.read()).group(1)
        self.assertEqual(cove.__version__, want)
        venv = tempfile.mkdtemp(prefix="cove-sdk-venv-")
        try:
            subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
                           check=True, capture_output=True)
            src = tempfile.mkdtemp(prefix="cove-sdk-src-")
            shutil.copytree(os.path.join(ROOT, "sdk", "python"), os.path.join(src, "p"))
            p = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--no-index",
                                "--no-build-isolation", os.path.join(src, "p")],
                               capture_output=True, text=True)
            shutil.rmtree(src, ignore_errors=True)
            self.assertEqual(p.returncode, 0, p.stdout[-1500:] + p.stderr[-1500:])
            p = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                                "import cove; print(cove.__version__, cove.__file__)"],
                               capture_output=True, text=True, cwd="/")
            ver, path = p.stdout.split()
            self.assertEqual(ver, want)
            self.assertTrue(path.startswith(venv), path)
        finally:
            shutil.rmtree(venv, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
