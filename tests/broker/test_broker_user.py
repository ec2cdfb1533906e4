#!/usr/bin/env python3
"""cove-broker's separation from the VMM's uid: the broker is never dumpable (no core dump, no
ptrace or /proc/PID/mem by other processes of its uid), and `--user NAME --client NAME` (root
only) opens its files as root, gives its sockets to the client user and drops to NAME, so the
credential helper runs as NAME too.

usage: test_broker_user.py BROKER_BINARY
"""
import http.server
import json
import os
import pwd
import subprocess
import sys
import tempfile
import threading
import time

from covetest import Tally
from covetest import framed_call as call  # framed JSON

BROKER = sys.argv[1]
check = Tally()  # a failed check is printed and counted; the run goes on
seen = []


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        seen.append(self.headers.get("Authorization") or "")
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


def wait_for(path, p):
    for _ in range(200):
        if os.path.exists(path) or p.poll() is not None:
            break
        time.sleep(0.05)
    return os.path.exists(path)


def proc_ids(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return [int(x) for x in line.split()[1:]]
    return None


def main():
    root = os.geteuid() == 0
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        nobody = None
    if root and not nobody:
        print("SKIP: running as root without a 'nobody' user to run the broker as")
        return 77
    tmp = tempfile.mkdtemp(prefix="cbu-", dir="/tmp")
    os.chmod(tmp, 0o755)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    helper = os.path.join(tmp, "helper")
    with open(helper, "w") as f:
        f.write("#!/bin/sh\ncat >/dev/null\n"
                "echo \"password=uid-$(id -u)-groups-$(id -G | wc -w)\"\n")
    os.chmod(helper, 0o755)
    policy = os.path.join(tmp, "policy.json")
    with open(policy, "w") as f:
        json.dump({"credentials": {"demo": {
            "helper": [helper], "inject": {"header": "Authorization", "template": "Bearer {password}"},
            "allow": {"schemes": ["http"], "hosts": ["127.0.0.1"], "ports": [port]},
            "allow_private": True}}}, f)
    os.chmod(policy, 0o644)
    procs = []

    def start(d, args=(), preexec=None):
        os.makedirs(d, exist_ok=True)
        listen, ctl = os.path.join(d, "v.sock_1025"), os.path.join(d, "ctl.sock")
        err = open(os.path.join(d, "err"), "w+")
        p = subprocess.Popen([BROKER, "--policy", policy, "--listen", listen, "--ctl", ctl,
                              "--audit", os.path.join(d, "audit.jsonl")] + list(args),
                             stderr=err, preexec_fn=preexec)
        procs.append(p)
        ok = wait_for(ctl, p)
        err.seek(0)
        return p, listen, ctl, ok, err.read()

    try:
        # 1. Not dumpable, whatever uid it runs as: /proc/PID/fd belongs to root, not to the uid
        # the broker runs as (as root, run it as nobody the sudo -u way to see it).
        d = os.path.join(tmp, "a")
        os.makedirs(d)
        preexec = None
        want_uid = os.geteuid()
        if root:
            os.chown(d, nobody.pw_uid, nobody.pw_gid)
            want_uid = nobody.pw_uid

            def preexec():
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
        p, listen, ctl, ok, err = start(d, ["--audit-key", os.path.join(d, "audit.key")],
                                        preexec=preexec)
        check(ok, "broker started (%s)" % err.strip())
        if ok:
            check(proc_ids(p.pid, "Uid") == [want_uid] * 4, "broker runs as uid %d" % want_uid)
            check(os.stat("/proc/%d/fd" % p.pid).st_uid == 0,
                  "broker is not dumpable (/proc/PID/fd owned by root, not uid %d)" % want_uid)
            if not root:
                try:
                    open("/proc/%d/mem" % p.pid, "rb").read(1)
                    check(False, "same-uid /proc/PID/mem refused")
                except OSError:
                    check(True, "same-uid /proc/PID/mem refused")
        p.terminate()
        p.wait(10)

        # 2. --user/--client need root and go together.
        r = subprocess.run([BROKER, "--policy", policy, "--listen", "/nonexistent/l", "--ctl",
                            "/nonexistent/c", "--audit", "/nonexistent/a", "--user", "nobody"],
                           stderr=subprocess.PIPE, text=True,
                           preexec_fn=preexec if root else None)
        check(r.returncode == 2 and "need root" in r.stderr and r.stderr.count("\n") == 1,
              "--user refused without root: " + r.stderr.strip())
        if not root:
            print("skip: not root, --user drop not exercised")
            return check.status()
        for args, why in ((["--user", "nobody"], "go together"),
                          (["--user", "root", "--client", "nobody"], "neither root"),
                          (["--user", "nobody", "--client", "nobody"], "neither root"),
                          (["--user", "no-such-user-cove", "--client", "root"], "no user")):
            r = subprocess.run([BROKER, "--policy", policy, "--listen", "/nonexistent/l",
                                "--ctl", "/nonexistent/c", "--audit", "/nonexistent/a"] + args,
                               stderr=subprocess.PIPE, text=True)
            check(r.returncode == 2 and why in r.stderr, "%s: %s" % (args, r.stderr.strip()))

        # 3. --user nobody --client root: sockets owned by the client 0600, process and helper
        # run as nobody without supplementary groups, and requests still work.
        d = os.path.join(tmp, "b")
        p, listen, ctl, ok, err = start(d, ["--user", "nobody", "--client", "root"])
        check(ok, "broker --user nobody started (%s)" % err.strip())
        if ok:
            time.sleep(0.2)  # the drop follows the socket creation
            check(proc_ids(p.pid, "Uid") == [nobody.pw_uid] * 4 and
                  proc_ids(p.pid, "Gid") == [nobody.pw_gid] * 4 and
                  proc_ids(p.pid, "Groups") == [], "broker dropped to nobody, no groups")
            check(os.stat("/proc/%d/fd" % p.pid).st_uid == 0, "dropped broker is not dumpable")
            for s in (listen, ctl):
                st = os.stat(s)
                check(st.st_uid == 0 and st.st_mode & 0o777 == 0o600,
                      "%s: owned by the client, mode 0600" % os.path.basename(s))
            g = call(ctl, {"op": "grant"})
            r = call(listen, {"v": 1, "epoch": g["epoch"], "token": g["token"],
                              "credential": "demo", "url": "http://127.0.0.1:%d/x" % port})
            check(r.get("status") == 200 and seen and
                  seen[-1] == "Bearer uid-%d-groups-1" % nobody.pw_uid,
                  "the credential helper ran as nobody (%s)" % (seen[-1:] or r))
        p.terminate()
        check(p.wait(10) == 0, "dropped broker exits 0 on SIGTERM")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        httpd.shutdown()
        subprocess.run(["rm", "-rf", tmp])
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
