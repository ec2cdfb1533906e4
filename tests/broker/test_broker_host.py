#!/usr/bin/env python3
"""cove-broker host-side integration test: a real pass store (throwaway GPG key), a real HTTP
server on 127.0.0.1, the real cove-broker binary, and framed requests over its Unix sockets.

usage: test_broker_host.py BROKER_BINARY HELPER_SCRIPT   (exit 77 when gpg/pass are missing)
"""
import base64
import hashlib
import http.server
import json
import os
import secrets
import shutil
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time

# The broker's wire: framed JSON on its Unix sockets.
from covetest import Tally, frame, recv_msg
from covetest import connect_unix as connect
from covetest import framed_call as call

BROKER, HELPER = sys.argv[1], sys.argv[2]
SECRET = "s3cr3t-" + secrets.token_hex(12)
USERNAME = "bot-user"
seen = []  # (method, path, Authorization, body) per request the server saw
HELD = threading.Event()  # releases the upstream's /v1/held answers
held_done = []  # one entry per /v1/held answer released (or given up after 60 s)
# A helper's deadline: the hanging helper below is killed at it, while pass and gpg must finish
# well within it on a CI machine that runs two emulated boxes, a kernel build and the fuzzers
# beside this ASan broker (at 2.5 s one request of a CI run failed).
HELPER_TIMEOUT_MS = 8000
check = Tally()  # a failed check is printed and counted; the run goes on


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, method):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        auth = self.headers.get("Authorization") or ""
        seen.append((method, self.path, auth, body))
        if self.path.startswith("/v1/slow"):
            time.sleep(2)
        if self.path.startswith("/v1/held"):
            HELD.wait(60)  # until the test has its other answer (no timing in the check)
            held_done.append(self.path)
        if self.path.startswith("/v1/redirect"):
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        # Echo the credential back, raw and base64'd, to exercise the scrubber.
        b64 = base64.b64encode(auth.encode()).decode()
        out = ("auth=%s\nb64=%s\nsecret-b64=%s\nbody=%s\n" % (
            auth, b64, base64.b64encode(auth.split(" ", 1)[-1].encode()).decode(),
            body.decode(errors="replace"))).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("X-Echo", auth)
        self.send_header("Set-Cookie", "sid=abc")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        if method != "HEAD":
            try:
                self.wfile.write(out)
            except BrokenPipeError:  # the aborted-transfer case: the broker hung up
                pass

    def do_GET(self):
        self.reply("GET")

    def do_POST(self):
        self.reply("POST")

    def do_DELETE(self):
        self.reply("DELETE")


def scan_memory(pid, needles):
    """Returns where any needle occurs in the writable memory of process pid."""
    hits = []
    with open("/proc/%d/maps" % pid) as maps, open("/proc/%d/mem" % pid, "rb") as mem:
        for line in maps:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if "w" not in parts[1] or hi - lo > (1 << 30):
                continue
            try:
                mem.seek(lo)
                data = mem.read(hi - lo)
            except OSError:
                continue
            for n in needles:
                if n in data:
                    hits.append("%s in %s" % (n[:4], parts[-1] if len(parts) > 5 else "anon"))
    return hits


def run(cmd, env, **kw):
    return subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, **kw)


def main():
    for tool in ("gpg", "pass", "gpgconf"):
        if not shutil.which(tool):
            print("SKIP: %s not installed (apt-get install gnupg pass)" % tool)
            return 77
    tmp = tempfile.mkdtemp(prefix="cbh-", dir="/tmp")
    env = dict(os.environ)
    env["GNUPGHOME"] = os.path.join(tmp, "g")
    env["PASSWORD_STORE_DIR"] = os.path.join(tmp, "store")
    os.mkdir(env["GNUPGHOME"], 0o700)
    broker = None
    httpd = None
    try:
        # A real pass store with a throwaway, passphrase-less GPG key.
        run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key",
             "cove broker test <broker-test@cove.invalid>", "default", "default", "never"], env)
        out = run(["gpg", "--batch", "--with-colons", "--list-secret-keys"], env).stdout.decode()
        fpr = [l.split(":")[9] for l in out.splitlines() if l.startswith("fpr:")][0]
        run(["pass", "init", fpr], env)
        run(["pass", "insert", "-m", "cove/demo"], env,
            input=("%s\nusername: %s\n" % (SECRET, USERNAME)).encode())
        got = run([HELPER, "cove/demo", "get"], env, input=b"protocol=http\n\n").stdout.decode()
        check(got == "password=%s\nusername=%s\n" % (SECRET, USERNAME),
              "git-credential-pass answers from the pass store")

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        port = httpd.server_address[1]
        threading.Thread(target=httpd.serve_forever, daemon=True).start()

        def cred(**over):
            c = {"helper": [HELPER, "cove/demo"],
                 "helper_input": {"protocol": "http", "host": "127.0.0.1"},
                 "inject": {"header": "Authorization", "template": "Bearer {password}"},
                 "allow": {"schemes": ["http"], "hosts": ["127.0.0.1", "*.example.test"],
                           "ports": [port], "path_prefixes": ["/v1/"],
                           "methods": ["GET", "POST", "HEAD"],
                           "headers": ["Accept", "Content-Type", "X-Trace"]},
                 "allow_private": True}
            c.update(over)
            return c

        policy = {"credentials": {
            "demo": cred(rate_per_min=100, max_uses=100, ttl_s=3600),
            "ratey": cred(rate_per_min=2),
            "short": cred(ttl_s=1),
            "limited": cred(max_uses=1),
            "private": cred(allow_private=False),
            "broken": cred(helper=[HELPER, "cove/missing"]),
            "slowcred": cred(helper=[os.path.join(tmp, "slow-helper")]),
            "hang": cred(helper=[os.path.join(tmp, "hang-helper")]),
        }}
        with open(os.path.join(tmp, "slow-helper"), "w") as f:
            # Held until the test has its other answer (or 2 s), then it says whether it was.
            f.write("#!/bin/sh\nfor i in $(seq 20); do [ -e %s/release ] && break; sleep 0.1; done\n"
                    "touch %s/slow-done\necho password=slow-secret-value\n" % (tmp, tmp))
        with open(os.path.join(tmp, "hang-helper"), "w") as f:
            f.write("#!/bin/sh\necho $$ > %s/hang.pid\nexec sleep 60\n" % tmp)
        os.chmod(os.path.join(tmp, "slow-helper"), 0o755)
        os.chmod(os.path.join(tmp, "hang-helper"), 0o755)
        # HTTPS: a throwaway self-signed certificate for 127.0.0.1, trusted through ca_file.
        tls_port = None
        if shutil.which("openssl"):
            cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                            "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
                            "-addext", "subjectAltName=IP:127.0.0.1"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            httpsd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            httpsd.socket = ctx.wrap_socket(httpsd.socket, server_side=True)
            tls_port = httpsd.server_address[1]
            threading.Thread(target=httpsd.serve_forever, daemon=True).start()
            tls_allow = {"schemes": ["https"], "hosts": ["127.0.0.1"], "ports": [tls_port],
                         "path_prefixes": ["/v1/"]}
            policy["credentials"]["tls"] = cred(allow=tls_allow, ca_file=cert)
            policy["credentials"]["tls-noca"] = cred(allow=tls_allow)
        else:
            print("skip: no openssl command, no HTTPS checks")
        pol_path = os.path.join(tmp, "policy.json")
        with open(pol_path, "w") as f:
            json.dump(policy, f)
        # A bad policy fails at start with one clear line.
        bad = dict(policy)
        bad["credentials"] = {"demo": cred(color="blue")}
        bad_path = os.path.join(tmp, "bad.json")
        with open(bad_path, "w") as f:
            json.dump(bad, f)
        p = subprocess.run([BROKER, "check-policy", bad_path], stderr=subprocess.PIPE)
        err = p.stderr.decode().strip()
        check(p.returncode == 1 and 'unknown key "color"' in err and "\n" not in err,
              "unknown policy key refused: " + err)

        listen = os.path.join(tmp, "v.sock_1025")
        ctl = os.path.join(tmp, "ctl.sock")
        audit = os.path.join(tmp, "audit.jsonl")
        errlog = open(os.path.join(tmp, "broker.err"), "w+")
        broker = subprocess.Popen([BROKER, "--policy", pol_path, "--listen", listen, "--ctl", ctl,
                                   "--audit", audit, "--initial-epoch", "7", "-v",
                                   "--helper-timeout-ms", str(HELPER_TIMEOUT_MS)],
                                  env=env, stderr=errlog)
        for _ in range(200):
            if os.path.exists(ctl):
                break
            time.sleep(0.05)
        check(call(ctl, {"op": "status"}) == {"ok": True, "epoch": 7}, "status before grant")
        # Before any grant no token is valid.
        r = call(listen, {"v": 1, "epoch": 7, "token": "00" * 16, "credential": "demo",
                          "method": "GET", "url": "http://127.0.0.1:%d/v1/x" % port})
        check(r == {"ok": False, "error": "denied: stale epoch"}, "no grant yet: stale epoch")
        g = call(ctl, {"op": "grant"})
        check(g.get("ok") is True and g.get("epoch") == 8 and len(g.get("token", "")) == 32,
              "grant bumps the epoch and returns a 128-bit token")
        ident = {"v": 1, "epoch": g["epoch"], "token": g["token"]}
        t_grant = time.monotonic()
        base = "http://127.0.0.1:%d" % port

        def req(credential="demo", method="GET", url=base + "/v1/hello", **kw):
            m = dict(ident, credential=credential, method=method, url=url)
            m.update(kw)
            return call(listen, m)

        # Allowed: the server sees the secret, the guest does not.
        n0 = len(seen)
        r = req(headers=["Accept: text/plain", "X-Trace: 1"])
        body = base64.b64decode(r.get("body_b64", ""))
        check(r.get("ok") is True and r.get("status") == 200, "allowed GET: 200")
        check(len(seen) == n0 + 1 and seen[-1][2] == "Bearer " + SECRET,
              "server saw Authorization: Bearer <secret>")
        blob = json.dumps(r).encode() + body
        forms = [SECRET.encode(), base64.b64encode(SECRET.encode()),
                 base64.b64encode(("Bearer " + SECRET).encode())]
        check(not any(f in blob for f in forms), "reply has no secret (raw or base64)")
        check(b"auth=Bearer [REDACTED]" in body and b"[REDACTED]" in body.split(b"b64=")[1],
              "echoed secret replaced by [REDACTED] in body (raw and base64)")
        hdrs = r.get("headers", [])
        check("X-Echo: Bearer [REDACTED]" in hdrs, "echoed secret scrubbed in headers")
        check(not any(h.lower().startswith("set-cookie") for h in hdrs), "Set-Cookie dropped")

        r = req(method="POST", url=base + "/v1/post?q=1",
                body_b64=base64.b64encode(b"hello body").decode(),
                headers=["Content-Type: text/plain"])
        check(r.get("status") == 200 and seen[-1][0] == "POST" and seen[-1][3] == b"hello body",
              "POST with body reaches the server")
        r = req(url=base + "/v1/redirect")
        check(r.get("status") == 302 and seen[-1][1] == "/v1/redirect",
              "redirect returned as-is, not followed (reply %s, last request %s)"
              % ({k: v for k, v in r.items() if k != "body_b64"}, seen[-1][:2]))
        r = req(url=base + "/v1/../admin")
        check(r == {"ok": False, "error": "denied: path not allowed"},
              "dot segments normalized before the path check")

        def denied(what, reason, **kw):
            n = len(seen)
            r = req(**kw)
            check(r == {"ok": False, "error": "denied: " + reason} and len(seen) == n,
                  "%s: denied: %s (got %s)" % (what, reason, r.get("error")))

        denied("wrong host", "host not allowed", url="http://localhost:%d/v1/x" % port)
        denied("wildcard host of another domain", "host not allowed",
               url="http://evil-example.test:%d/v1/x" % port)
        denied("wrong method", "method not allowed", method="DELETE")
        denied("wrong path", "path not allowed", url=base + "/admin")
        denied("wrong port", "port not allowed", url="http://127.0.0.1:1/v1/x")
        denied("wrong scheme", "scheme not allowed", url="https://127.0.0.1:%d/v1/x" % port)
        denied("unknown credential", "unknown credential", credential="nope")
        denied("loopback without allow_private", "private destination", credential="private")
        denied("guest sets Authorization", "malformed request: header Authorization not allowed",
               headers=["Authorization: Bearer guess"])
        denied("method override header", "malformed request: header X-HTTP-Method-Override "
               "not allowed", method="GET", headers=["X-HTTP-Method-Override: DELETE"])
        denied("header not in allow.headers", "malformed request: header User-Agent not allowed",
               headers=["User-Agent: x"])
        denied("';' path parameter", "path has ';' parameters", url=base + "/v1/..;/admin")
        denied("helper failure", "credential helper failed", credential="broken")
        check(req(credential="limited").get("status") == 200, "max_uses 1: first use ok")
        denied("max uses", "max uses", credential="limited")
        check(req(credential="ratey").get("status") == 200 and
              req(credential="ratey").get("status") == 200, "rate 2/min: two ok")
        denied("over rate", "over rate", credential="ratey")
        time.sleep(max(0, 1.2 - (time.monotonic() - t_grant)))
        denied("expired ttl", "expired", credential="short")

        # Malformed messages: error reply, the broker keeps serving.
        for what, raw in (("bad json", b"{nope"), ("not an object", b"[1,2]"),
                          ("wrong types", json.dumps(dict(ident, credential=5,
                                                           url="x")).encode()),
                          ("bad v", json.dumps({"v": 2, "url": base}).encode()),
                          ("bad body_b64", json.dumps(dict(ident, credential="demo",
                                                            url=base + "/v1/",
                                                            body_b64="!!")).encode()),
                          ("empty", b"")):
            with connect(listen) as s:
                s.sendall(frame(raw))
                r = recv_msg(s)
            check(r.get("ok") is False and r["error"].startswith("denied: malformed request"),
                  "malformed (%s): %s" % (what, r.get("error")))
        with connect(listen) as s:  # announced length over 1 MiB: error then close
            s.sendall(struct.pack(">I", (1 << 20) + 1) + b"x" * 100)
            r = recv_msg(s)
            check(r == {"ok": False, "error": "denied: malformed request: frame over 1 MiB"},
                  "oversized frame refused")
            check(s.recv(10) == b"", "connection closed after an oversized frame")
        # A half-sent frame on one connection does not stall another.
        stall = connect(listen)
        stall.sendall(b"\x00\x00\x01")
        t0 = time.monotonic()
        r = req()
        check(r.get("status") == 200 and time.monotonic() - t0 < 5,
              "a stalled connection does not block others")
        stall.close()
        # Upstream transfers run concurrently: a slow one does not hold up another connection.
        # The held upstream answers only once the other answer came: no clock in the check.
        HELD.clear()
        slow = connect(listen)
        slow.sendall(frame(dict(ident, credential="demo", method="GET", url=base + "/v1/held")))
        t0 = time.monotonic()
        while not any(x[1].startswith("/v1/held") for x in seen) and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        r = req()
        answered_while_held = not held_done
        HELD.set()
        r2 = recv_msg(slow)
        slow.close()
        check(r.get("status") == 200 and answered_while_held and r2.get("status") == 200,
              "a held upstream does not block another connection (answered while it was held)")
        # Credential helpers run concurrently too, and one that hangs is killed at its deadline.
        slow = connect(listen)
        slow.sendall(frame(dict(ident, credential="slowcred", method="GET", url=base + "/v1/s")))
        hang = connect(listen)
        t_hang = time.monotonic()
        hang.sendall(frame(dict(ident, credential="hang", method="GET", url=base + "/v1/h")))
        time.sleep(0.2)
        r = req()
        answered_while_held = not os.path.exists(os.path.join(tmp, "slow-done"))
        open(os.path.join(tmp, "release"), "w").close()
        r2 = recv_msg(slow)
        slow.close()
        check(r.get("status") == 200 and answered_while_held and r2.get("status") == 200 and
              seen[-1][2] == "Bearer slow-secret-value",
              "a slow helper does not block another connection (answered while it ran)")
        r = recv_msg(hang)
        took = time.monotonic() - t_hang
        hang.close()
        check(r == {"ok": False, "error": "denied: credential helper failed"} and
              HELPER_TIMEOUT_MS / 1000 - 0.2 < took < HELPER_TIMEOUT_MS / 1000 + 4,
              "hanging helper killed at its deadline (%.2f s)" % took)
        with open(os.path.join(tmp, "hang.pid")) as f:
            hpid = int(f.read())
        check(not os.path.exists("/proc/%d" % hpid), "hung helper process is gone")
        # A guest that goes away mid-transfer: the transfer is aborted and audited.
        slow_seen = sum(1 for x in seen if x[1].startswith("/v1/slow"))
        gone = connect(listen)
        gone.sendall(frame(dict(ident, credential="demo", method="GET", url=base + "/v1/slow")))
        # Leave once the transfer is under way (the upstream has the request), however long
        # fetching the credential took on a loaded machine.
        t_wait = time.monotonic() + 15
        while (sum(1 for x in seen if x[1].startswith("/v1/slow")) == slow_seen and
               time.monotonic() < t_wait):
            time.sleep(0.05)
        time.sleep(0.2)
        gone.close()
        time.sleep(0.2)
        check(req().get("status") == 200, "broker serves after a guest left mid-transfer")
        # Two requests pipelined on one connection, answered in order.
        with connect(listen) as s:
            m = dict(ident, credential="demo", method="GET", url=base + "/v1/a")
            s.sendall(frame(m) + frame(dict(m, method="DELETE")))
            a, b = recv_msg(s), recv_msg(s)
        check(a.get("status") == 200 and b.get("error") == "denied: method not allowed",
              "pipelined requests answered in order")

        # Re-grant: the old epoch is refused, the new one works.
        g2 = call(ctl, {"op": "grant"})
        r = req()
        check(r == {"ok": False, "error": "denied: stale epoch"}, "old epoch after re-grant")
        ident.update(epoch=g2["epoch"], token=g2["token"])
        check(req().get("status") == 200, "new epoch accepted")
        check(call(ctl, {"op": "status"}) == {"ok": True, "epoch": 9}, "status after re-grant")
        check(call(ctl, {"op": "bogus"}).get("ok") is False, "unknown ctl op refused")

        if tls_port:
            n = len(seen)
            r = req(credential="tls", url="https://127.0.0.1:%d/v1/tls" % tls_port)
            body = base64.b64decode(r.get("body_b64", ""))
            check(r.get("status") == 200 and len(seen) == n + 1 and
                  seen[-1][2] == "Bearer " + SECRET and SECRET.encode() not in body,
                  "https with ca_file: secret reaches the server, reply scrubbed")
            r = req(credential="tls-noca", url="https://127.0.0.1:%d/v1/tls" % tls_port)
            check(r.get("ok") is False and r.get("error", "").startswith("upstream: ") and
                  len(seen) == n + 1, "https without the CA: refused by certificate check (%s)"
                  % r.get("error"))
        # After the requests, no copy of the secret (raw or base64) is left in the broker's
        # memory: its own buffers are wiped, and so is what libcurl frees.
        # The broker is not dumpable: only root (CAP_SYS_PTRACE) can read its memory.
        if os.geteuid() == 0:
            found = scan_memory(broker.pid, forms)
            check(not found, "no secret left in broker memory (%s)" % (found or "scanned"))
        else:
            print("skip: memory scan needs root (the broker is not dumpable)")
        broker.terminate()
        check(broker.wait(10) == 0, "broker exits 0 on SIGTERM")
        broker = None

        # Audit log: every decision, every reason, never the secret; the chain verifies.
        with open(audit, "rb") as f:
            raw = f.read()
        lines = [json.loads(l) for l in raw.splitlines()]
        reasons = [l["reason"] for l in lines]
        for reason in ("stale epoch", "host not allowed", "method not allowed",
                       "path not allowed", "port not allowed", "scheme not allowed",
                       "unknown credential", "private destination", "max uses", "over rate",
                       "expired", "credential helper failed",
                       "malformed request: frame over 1 MiB", "malformed request: bad json"):
            check(reason in reasons, "audit has a deny with reason '%s'" % reason)
        check(any(l["reason"].startswith("upstream: aborted") and l["decision"] == "allow"
                  for l in lines), "aborted transfer audited")
        check(all(l["decision"] == ("allow" if l["reason"] == "ok" else "deny") or
                  l["reason"].startswith("upstream") for l in lines),
              "audit decisions match reasons")
        check(not any(f in raw for f in forms) and USERNAME.encode() not in raw,
              "audit log holds no secret")
        errlog.seek(0)
        check(SECRET not in errlog.read(), "broker stderr holds no secret")
        v = subprocess.run([BROKER, "verify-audit", audit], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
        check(v.returncode == 0 and b"OK, %d records" % len(lines) in v.stdout,
              "verify-audit: " + v.stdout.decode().strip())
        # Flip one byte in line 5 (inside the URL), then delete a line: both are caught.
        ls = raw.splitlines(keepends=True)
        i = ls[4].index(b'"url":"') + 10
        tampered = ls[:4] + [ls[4][:i] + bytes([ls[4][i] ^ 1]) + ls[4][i + 1:]] + ls[5:]
        with open(audit, "wb") as f:
            f.write(b"".join(tampered))
        v = subprocess.run([BROKER, "verify-audit", audit], stderr=subprocess.PIPE)
        check(v.returncode == 1 and b"line 5:" in v.stderr,
              "flipped byte caught: " + v.stderr.decode().strip())
        with open(audit, "wb") as f:
            f.write(b"".join(ls[:2] + ls[3:]))
        v = subprocess.run([BROKER, "verify-audit", audit], stderr=subprocess.PIPE)
        check(v.returncode == 1 and b"line 3:" in v.stderr,
              "deleted line caught: " + v.stderr.decode().strip())
        # The MAC key: created 0600 beside the policy. Rewriting line 5 and recomputing every
        # hash after it fools the unkeyed check, not the keyed one.
        key = pol_path + ".audit-key"
        check(os.stat(key).st_mode & 0o777 == 0o600, "audit MAC key created 0600 beside the policy")
        with open(audit, "wb") as f:
            f.write(raw)
        v = subprocess.run([BROKER, "verify-audit", "--key", key, audit], stdout=subprocess.PIPE)
        check(v.returncode == 0 and b"MAC verified" in v.stdout,
              "verify-audit --key: " + v.stdout.decode().strip())
        out, prev = [], None
        for n, l in enumerate(ls):
            if n < 4:
                out.append(l)
                prev = hashlib.sha256(l.rstrip(b"\n")).hexdigest()
                continue
            rec = json.loads(l)
            rec.pop("hash")
            rec.pop("mac", None)
            rec["prev"] = prev
            if n == 4:
                rec["reason"] = "nothing to see"
            body = json.dumps(rec, separators=(",", ":")).encode()
            line = body[:-1] + b',"hash":"' + hashlib.sha256(body).hexdigest().encode() + b'"}'
            prev = hashlib.sha256(line).hexdigest()
            out.append(line + b"\n")
        with open(audit, "wb") as f:
            f.write(b"".join(out))
        v = subprocess.run([BROKER, "verify-audit", audit], stdout=subprocess.PIPE)
        check(v.returncode == 0, "rewritten log with recomputed hashes passes without the key")
        v = subprocess.run([BROKER, "verify-audit", "--key", key, audit], stderr=subprocess.PIPE)
        check(v.returncode == 1 and b"line 5:" in v.stderr and b"mac" in v.stderr,
              "... and is caught with it: " + v.stderr.decode().strip())
        # A restarted broker continues the chain.
        with open(audit, "wb") as f:
            f.write(raw)
        broker = subprocess.Popen([BROKER, "--policy", pol_path, "--listen", listen, "--ctl",
                                   ctl, "--audit", audit], env=env, stderr=errlog)
        for _ in range(200):
            if os.path.exists(ctl):
                break
            time.sleep(0.05)
        call(listen, {"v": 1, "credential": "demo", "url": base + "/v1/"})
        broker.terminate()
        check(broker.wait(10) == 0, "restarted broker exits 0")
        broker = None
        v = subprocess.run([BROKER, "verify-audit", "--key", key, audit], stdout=subprocess.PIPE)
        check(v.returncode == 0 and b"OK, %d records" % (len(lines) + 1) in v.stdout,
              "restarted broker continues the chain: " + v.stdout.decode().strip())
        if check.failures:
            errlog.seek(0)
            print("broker stderr:\n" + errlog.read())
    finally:
        if broker:
            broker.kill()
            broker.wait()
        if httpd:
            httpd.shutdown()
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, stderr=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d checks failed" % len(check.failures) if check.failures else "all checks passed")
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
