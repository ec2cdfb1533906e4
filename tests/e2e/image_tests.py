#!/usr/bin/env python3
"""e2e: a sandbox booted from the Debian image (guest/image/build) instead of the busybox rootfs:
its tools answer through `cove exec`, and its boot-to-ready is measured beside busybox's.

Runs in the KVM box beside box_tests.py (module "image"). tests/e2e/run attaches the image
file as a virtio disk (tools/kvm-box --disk): /work/image/rootfs.ext4 is a symlink to that
block device, nothing of it goes through the initramfs; packages.txt is copied beside it. Every boot uses the image as the
read-only base of a copy-on-write overlay, as sandboxes will.
"""
import base64
import collections
import functools
import hashlib
import http.server
import json
import os
import re
import secrets
import shutil
import socket
import ssl
import statistics
import subprocess
import tempfile
import threading
import time
import zipfile

import agent_tests as at
import box_tests as bt
from covetest import Skip, check, hosts_add

IMAGE = os.environ.get("IMAGE", "/work/image/rootfs.ext4")
PACKAGES = os.path.join(os.path.dirname(IMAGE), "packages.txt")
ROUNDS = int(os.environ.get("E2E_IMAGE_ROUNDS", "3"))


def need_image():
    if not os.path.exists(IMAGE):
        raise Skip(f"no Debian image at {IMAGE} (guest/image/build did not run: it needs "
                   f"mmdebstrap and root; tests/e2e/run says why)")


def overlay_spec(base, name):
    ovl = f"/tmp/{name}.ovl"
    for p in (ovl, ovl + ".map"):
        if os.path.exists(p):
            os.unlink(p)
    return f"{base},overlay={ovl}"


def installed():
    """Package names the image build recorded (dpkg-query in the finished tree)."""
    with open(PACKAGES) as f:
        return {line.split()[0] for line in f if line.strip()}


def edges(path):
    """sha256 of the first and last MiB of a disk (a file or, in the box, a block device): an
    ext4 mounted read-write rewrites its superblock there (mount count, times)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(-(1 << 20), os.SEEK_END)
        h.update(f.read(1 << 20))
    return h.hexdigest()


def exec_out(sb, *argv):
    t = time.monotonic()
    r = sb.cove("exec", sb.name, "--", *argv)
    dt = time.monotonic() - t
    out = (r.stdout + r.stderr).decode(errors="replace")
    check(r.returncode == 0, f"{' '.join(argv)}: rc={r.returncode} {out[-600:]!r}; "
                             f"console {sb.console()[-800:]!r}")
    return out, dt


def test_image_tools():
    need_image()
    before = edges(IMAGE)
    sb = at.Sandbox("debian", disk=overlay_spec(IMAGE, "debian-tools"))
    try:
        out, _ = exec_out(sb, "cat", "/etc/os-release")
        check('VERSION_CODENAME=bookworm' in out, f"not Debian bookworm: {out!r}")
        checks = [(("python3", "--version"), r"^Python 3\.\d+\.\d+"),
                  (("git", "--version"), r"^git version 2\.\d+"),
                  (("curl", "--version"), r"^curl \d+\.\d+\.\d+ (.|\n)*^Protocols: .*\bhttps\b"),
                  # Not `pip3 --version`: its imports took 74-103 s in the box (TCG, cold disk).
                  (("python3", "-c", "import pip; print('pip', pip.__version__)"), r"^pip \d+"),
                  (("python3", "-c", "import ssl, sqlite3, json; print(ssl.OPENSSL_VERSION)"),
                   r"^OpenSSL 3\.")]
        pkgs = installed()
        if "nodejs" in pkgs:
            checks.append((("node", "-e", "console.log('node', process.version)"),
                           r"^node v\d+\.\d+"))
        if "npm" in pkgs:
            checks.append((("npm", "--version"), r"^\d+\.\d+\.\d+"))
        for argv, want in checks:
            out, dt = exec_out(sb, *argv)
            check(re.search(want, out, re.M), f"{' '.join(argv)}: {out[:300]!r} does not match "
                                              f"{want!r}")
            print(f"    {' '.join(argv)[:40]}: {out.splitlines()[0][:60]} ({dt * 1000:.0f} ms)")
        # The guest writes land in the overlay, never in the shared base image.
        out, _ = exec_out(sb, "sh", "-c", "echo sandbox-write > /root/mark && sync && "
                                          "cat /root/mark && id -un && hostname")
        check(out.split() == ["sandbox-write", "root", "cove"], f"write/id/hostname: {out!r}")
    finally:
        sb.close()
    check(edges(IMAGE) == before, "the base image changed under its overlay (its first or last "
                                  "MiB: superblock, group descriptors, journal)")


READY = re.compile(r"cove-init: ready (\d+\.\d+)")


def boot_to_ready(name, base):
    """Starts a sandbox on an overlay over base; returns (guest uptime at cove-init's ready
    line, seconds from starting cove to the first `cove exec -- true` answered)."""
    t0 = time.monotonic()
    sb = at.Sandbox(name, disk=overlay_spec(base, name))
    first = time.monotonic() - t0
    try:
        console = sb.console()
    finally:
        sb.close()
    m = READY.search(console)
    check(m, f"{name}: no cove-init ready line; console {console[-800:]!r}")
    return float(m.group(1)), first


def test_image_boot_to_ready():
    need_image()
    figures = {"busybox": [], "debian": []}
    for i in range(ROUNDS):
        for kind, base in (("busybox", bt.ROOTFS), ("debian", IMAGE)):
            figures[kind].append(boot_to_ready(f"{kind}-{i}", base))
    for kind, runs in figures.items():
        ready = [r for r, _ in runs]
        first = [f for _, f in runs]
        print(f"    {kind:8s} cove-init ready at guest uptime "
              f"{' '.join(f'{r:.2f}' for r in ready)} s (median {statistics.median(ready):.2f}); "
              f"first cove exec answered after {' '.join(f'{f:.1f}' for f in first)} s "
              f"(median {statistics.median(first):.1f})")
    # Guest uptime starts after cove did, and the agent answers only after the ready line.
    for kind, runs in figures.items():
        check(all(0 < r < f for r, f in runs), f"{kind}: ready after the first exec? {runs}")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def finish(self):
        """A lingering close, as nginx does. The proxy asks for "Connection: close", and the
        whole answer may still sit in this socket's send buffer (up to tcp_wmem's 4 MiB) when
        the handler returns: closed now, the socket is an orphan with unsent data, which a box
        under TCP memory pressure (50 such downloads at once) resets: the proxy then read
        "connection reset" with about 4 MB of the answer missing. Close once the peer has
        read it all and closed its end."""
        super().finish()
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(120)
            while self.connection.recv(65536):
                pass
        except OSError:
            pass


class _Server(http.server.ThreadingHTTPServer):
    request_queue_size = 128  # 50 connections at once: no SYN dropped by a backlog of 5
    errors = []

    def handle_error(self, request, client_address):
        import traceback
        _Server.errors.append(traceback.format_exc(limit=3))


def _wheel(root, name, version):
    """A minimal pure-Python wheel and a PEP 503 simple index for it under root/simple."""
    whl = f"{name}-{version}-py3-none-any.whl"
    files = {f"{name}/__init__.py": f"VALUE = 'installed through the cove egress proxy'\n",
             f"{name}-{version}.dist-info/METADATA":
                 f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL":
                 "Wheel-Version: 1.0\nGenerator: cove-e2e\nRoot-Is-Purelib: true\n"
                 "Tag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join(record) + "\n"
    pkgdir = os.path.join(root, "simple", name)
    os.makedirs(pkgdir)
    with zipfile.ZipFile(os.path.join(pkgdir, whl), "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    with open(os.path.join(pkgdir, "index.html"), "w") as f:
        f.write(f'<html><body><a href="{whl}">{whl}</a></body></html>\n')


class EgressSandbox:
    """cove create on the Debian image with an egress policy that allows one host name of the
    box's own (files.cove.test = 127.0.0.1, where a test HTTP server runs) and one that resolves
    to the metadata address without allow_private; cove-broker beside it serves the egress."""

    def __init__(self, name, www, policy=None, env=None, image=None):
        self.name = name
        self.tmp = tempfile.mkdtemp(prefix=f"{name}-")
        self.state, self.run = os.path.join(self.tmp, "state"), os.path.join(self.tmp, "run")
        self.env = dict(os.environ, COVE_STATE_DIR=self.state, COVE_RUN_DIR=self.run,
                        COVE_GUEST_DIR="/work")
        if not os.path.exists(os.path.join(os.path.dirname(bt.COVE), "cove-broker")):
            self.env["COVE_BROKER"] = at.BROKER
        self.env.update(env or {})
        self.state = self.env["COVE_STATE_DIR"]  # an image imported beforehand: its own root
        self.httpd = _Server(("127.0.0.1", 0), functools.partial(_Quiet, directory=www))
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        hosts_add(["127.0.0.1 files.cove.test", "169.254.169.254 metadata.cove.test"])
        if policy is None:
            policy = {"egress": {"rules": [
                {"host": "files.cove.test", "ports": [self.port], "methods": ["GET"],
                 "allow_private": True},
                {"host": "metadata.cove.test", "ports": [80], "methods": ["GET"]}],
                "max_connections": 64}}
        pol = os.path.join(self.tmp, "policy.json")
        with open(pol, "w") as f:
            json.dump(policy, f)
        self.created = False
        t0 = time.monotonic()
        root = ("--image", image) if image else ("--rootfs", IMAGE)
        r = self.cove("create", name, "--cold", *root, "--snapshot-every", "off",
                      "--policy", pol)
        check(r.returncode == 0, f"cove create on the Debian image: rc={r.returncode} "
                                 f"{r.stderr.decode(errors='replace')[-600:]!r}; vmm.log "
                                 f"{self.tail('vmm.log')!r}")
        self.created = True
        print(f"    cove create {name} --rootfs <Debian image> --policy: "
              f"{time.monotonic() - t0:.1f} s")

    def cove(self, *args, timeout=600):
        return subprocess.run([bt.COVE] + list(args), capture_output=True, env=self.env,
                              timeout=timeout)

    def sh(self, script, timeout=600):
        r = self.cove("exec", self.name, "--", "sh", "-c", script, timeout=timeout)
        return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")

    def tail(self, f, n=600):
        try:
            with open(os.path.join(self.state, self.name, f), errors="replace") as fh:
                return fh.read()[-n:]
        except OSError:
            return ""

    def audit(self, until=None, timeout=10):
        """The egress records of the audit log; with until, waits (a refusal is answered before
        its record is written) until one record satisfies it."""
        deadline = time.monotonic() + timeout
        while True:
            with open(os.path.join(self.state, self.name, "audit.jsonl"), "rb") as f:
                recs = [json.loads(line) for line in f.read().splitlines()]
            eg = [r for r in recs if r.get("kind") == "egress"]
            if until is None or any(until(r) for r in eg) or time.monotonic() > deadline:
                return eg
            time.sleep(0.1)

    def verify_audit(self):
        broker = self.env.get("COVE_BROKER") or os.path.join(os.path.dirname(bt.COVE),
                                                             "cove-broker")
        d = os.path.join(self.state, self.name)
        v = subprocess.run([broker, "verify-audit", "--key",
                            os.path.join(d, "policy.json.audit-key"),
                            os.path.join(d, "audit.jsonl")], capture_output=True, text=True)
        check(v.returncode == 0, f"verify-audit: {v.stdout!r} {v.stderr!r}")
        return v.stdout.strip()

    def close(self):
        if self.created:
            self.cove("rm", self.name)
        self.httpd.shutdown()
        shutil.rmtree(self.tmp, ignore_errors=True)


def test_image_egress_refusals():
    """curl in the Debian sandbox: a host the policy does not allow gets a 403 that names why;
    through the proxy explicitly (curl --proxy, so no_proxy cannot keep it in the guest), the
    host's 127.0.0.1 and a name resolving to 169.254.169.254 on the host are refused; each is
    an audit line, and the log verifies."""
    need_image()
    www = tempfile.mkdtemp(prefix="www-")
    with open(os.path.join(www, "hello"), "w") as f:
        f.write("hello from the host\n")
    sb = EgressSandbox("deb-egress", www)
    try:
        rc, out, err = sb.sh(f"curl -sS http://files.cove.test:{sb.port}/hello")
        check(rc == 0 and out == "hello from the host\n", f"allowed GET: {rc} {out!r} {err!r}; "
                                                         f"broker.log {sb.tail('broker.log')!r}")
        cases = [("a host no rule names", "http://evil.cove.test/", "",
                  "no egress rule allows evil.cove.test:80"),
                 # --noproxy '': curl applies no_proxy (127.0.0.1) even to --proxy.
                 ("the host's 127.0.0.1", f"http://127.0.0.1:{sb.port}/hello",
                  "--noproxy '' --proxy http://127.0.0.1:3128",
                  f"no egress rule allows 127.0.0.1:{sb.port}"),
                 ("169.254.169.254 by name", "http://metadata.cove.test/",
                  "--noproxy '' --proxy http://127.0.0.1:3128", "resolves to a private")]
        for what, url, extra, reason in cases:
            rc, out, err = sb.sh(f"curl -sS {extra} -w '\\n%{{http_code}}' {url}")
            lines = out.splitlines()
            check(rc == 0 and lines[-1:] == ["403"] and reason in out,
                  f"{what}: rc={rc} {out!r} {err!r}")
            print(f"    {what}: 403, {lines[0][:90]!r}")
        hosts = {"evil.cove.test", "127.0.0.1", "metadata.cove.test"}
        eg = sb.audit(until=lambda r: r["host"] == "metadata.cove.test")
        denied = {r["host"] for r in eg if r["decision"] == "deny" and r["status"] == 403}
        check(hosts <= denied, f"denied hosts in the audit log: {denied}")
        print(f"    audit: {sb.verify_audit()}")
    finally:
        sb.close()
        shutil.rmtree(www, ignore_errors=True)


def test_image_egress_parallel_and_pip():
    """50 downloads of 10 MiB each at once through the proxy, checked by sha256; then
    `pip install` of a wheel from a simple index on the host, through the proxy."""
    need_image()
    www = tempfile.mkdtemp(prefix="www-")
    data = os.urandom(10 << 20)
    with open(os.path.join(www, "f10m"), "wb") as f:
        f.write(data)
    want = hashlib.sha256(data).hexdigest()
    _wheel(www, "covetestpkg", "1.0")
    sb = EgressSandbox("deb-par", www)
    try:
        n = int(os.environ.get("E2E_EGRESS_PARALLEL", "50"))
        url = f"http://files.cove.test:{sb.port}/f10m"
        t0 = time.monotonic()
        rc, out, err = sb.sh(f"seq {n} | xargs -P {n} -I{{}} sh -c "
                             f"'curl -sS {url} | sha256sum' | sort | uniq -c", timeout=900)
        dt = time.monotonic() - t0
        if not (rc == 0 and out.split()[:2] == [str(n), want]):
            reasons = collections.Counter((r["decision"], r["reason"], r["status"])
                                          for r in sb.audit())
            check(False, f"{n} parallel downloads: rc={rc} {out!r} {err[-300:]!r}; audit "
                         f"{dict(reasons)}; broker.log {sb.tail('broker.log')!r}; vmm.log "
                         f"{sb.tail('vmm.log')!r}; server errors {_Server.errors[-2:]!r}")
        print(f"    {n} x 10 MiB at once through the proxy, all intact: {dt:.1f} s "
              f"({n * 10 / dt:.1f} MiB/s in the box)")
        t0 = time.monotonic()
        rc, out, err = sb.sh(
            "python3 -m pip install --no-cache-dir --disable-pip-version-check "
            "--break-system-packages --trusted-host files.cove.test --index-url "
            f"http://files.cove.test:{sb.port}/simple/ covetestpkg && python3 -c "
            "'import covetestpkg; print(covetestpkg.VALUE)'", timeout=900)
        check(rc == 0 and out.splitlines()[-1:] == ["installed through the cove egress proxy"],
              f"pip install through the proxy: rc={rc} {out[-600:]!r} {err[-600:]!r}")
        print(f"    pip install covetestpkg from the host's simple index: "
              f"{time.monotonic() - t0:.1f} s")
        eg = sb.audit()
        big = [r for r in eg if r["decision"] == "allow" and r["host"] == "files.cove.test" and
               r["bytes_down"] >= len(data)]
        check(len(big) == n, f"{len(big)} allowed records of 10 MiB or more, not {n}")
    finally:
        sb.close()
        shutil.rmtree(www, ignore_errors=True)


class _Echo(http.server.BaseHTTPRequestHandler):
    """The credential's upstream: records what it was sent and answers with the Authorization
    header it saw (so a secret in the answer must be scrubbed on its way to the guest)."""
    seen = []

    def do_GET(self):
        auth = self.headers.get("Authorization", "")
        _Echo.seen.append((self.path, auth))
        body = f"path={self.path} auth={auth}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def _openssl(tmp, *args):
    r = subprocess.run(["openssl"] + list(args), cwd=tmp, capture_output=True, text=True)
    check(r.returncode == 0, f"openssl {' '.join(args)[:80]}: {r.stderr[-300:]!r}")


def _scan(root, needles, where):
    """Which needles occur in any file under root (read in overlapping chunks); where[needle]
    gets the files."""
    found = set()
    keep = max(len(n) for n in needles)
    for d, _, files in os.walk(root):
        for fn in files:
            path = os.path.join(d, fn)
            if not os.path.isfile(path) or os.path.islink(path):
                continue
            with open(path, "rb") as f:
                tail = b""
                while True:
                    chunk = f.read(8 << 20)
                    if not chunk:
                        break
                    buf = tail + chunk
                    for n in needles:
                        if n in buf:
                            found.add(n)
                            where.setdefault(n, set()).add(os.path.relpath(path, root))
                    tail = buf[-keep:]
    return found


def _b64_forms(text):
    """base64 of text at the three alignments it can start at inside a longer base64 string."""
    out = []
    for pad in range(3):
        enc = base64.b64encode(b"x" * pad + text)
        # Drop the characters that depend on the padding bytes and on what follows.
        start = (pad * 4 + 2) // 3
        out.append(enc[start:len(enc) - 4])
    return out


def stop_and_scan(sb, secret, control, user):
    """Stops the sandbox (its memory goes into its chain) and scans every file of it for the
    token: raw, and base64 of user:token and of the token at the three alignments; the planted
    control string must be found by the same scan, or the scan proves nothing."""
    r = sb.cove("stop", sb.name)
    check(r.returncode == 0, f"cove stop: {r.stderr!r}")
    needles = [secret.encode(), control.encode()] + _b64_forms(f"{user}:{secret}".encode()) + \
        _b64_forms(secret.encode())
    where = {}
    found = _scan(os.path.join(sb.state, sb.name), needles, where)
    check(control.encode() in found, "the scan did not find the planted control string: it "
                                     "would not find the token either")
    leaked = found - {control.encode()}
    check(not leaked, "token forms found in the sandbox's files: " +
          "; ".join(f"{n.decode()} in {sorted(where[n])}" for n in leaked))


def _inject_upstream(tmp, secret):
    """An HTTPS upstream api.cove.test (the test CA in tmp) that echoes the Authorization it
    gets, a real pass store holding `secret`, and a policy whose credential "api" injects it
    as a bearer token for GETs under /v1/: (server, port, policy, the store's env)."""
    httpd, port = _tls_server(tmp, "api.cove.test", _Echo)
    helper, senv = at.secret_store(tmp, secret)
    policy = {"credentials": {"api": {
        "helper": helper, "helper_input": {"protocol": "https", "host": "api.cove.test"},
        "inject": {"header": "Authorization", "template": "Bearer {password}"},
        "allow": {"schemes": ["https"], "hosts": ["api.cove.test"], "ports": [port],
                  "path_prefixes": ["/v1/"], "methods": ["GET"]},
        "allow_private": True, "ca_file": os.path.join(tmp, "ca.crt")}}}
    _Echo.seen = []
    return httpd, port, policy, senv


def test_image_credential_injection():
    """HTTPS from an unmodified curl in the Debian sandbox to a host a credential names: the
    sandbox's cove-broker terminates the TLS with the sandbox's CA (installed in its overlay at
    create), fetches the token from a real pass store, injects it (also in place of a
    cove-credential:NAME placeholder), verifies the upstream's certificate, and scrubs the token
    from the answer. A path the policy does not allow is a 403. After a stop, the token is
    nowhere in the sandbox's files (memory layers, disk overlay, logs), in the guest's
    environment or files; a planted control string is found by the same scan."""
    need_image()
    tmp = tempfile.mkdtemp(prefix="inject-")
    secret = "tok-" + secrets.token_hex(20)
    control = "control-" + secrets.token_hex(20)
    try:
        httpd, port, policy, senv = _inject_upstream(tmp, secret)
        sb = EgressSandbox("deb-inject", tmp, policy=policy,
                           env={"GNUPGHOME": senv["GNUPGHOME"],
                                "PASSWORD_STORE_DIR": senv["PASSWORD_STORE_DIR"]})
        try:
            url = f"https://api.cove.test:{port}/v1/hello"
            rc, out, err = sb.sh(f"curl -sS {url}")
            check(rc == 0 and out.startswith("path=/v1/hello auth=") and secret not in out,
                  f"curl through the interception: rc={rc} {out!r} {err!r}; broker.log "
                  f"{sb.tail('broker.log')!r}")
            check(_Echo.seen[-1:] == [("/v1/hello", "Bearer " + secret)],
                  f"upstream saw {_Echo.seen[-1:]!r}")
            print(f"    curl https://api.cove.test: upstream got the token, the guest saw "
                  f"{out.strip()!r}")
            rc, out, err = sb.sh(f"curl -sS -H 'Authorization: Bearer cove-credential:api' "
                                 f"{url}?x=1")
            check(rc == 0 and secret not in out and
                  _Echo.seen[-1] == ("/v1/hello?x=1", "Bearer " + secret),
                  f"placeholder: rc={rc} {out!r} {err!r}; upstream {_Echo.seen[-1:]!r}")
            n = len(_Echo.seen)
            rc, out, err = sb.sh(f"curl -sS -w '\\n%{{http_code}}' "
                                 f"https://api.cove.test:{port}/admin")
            check(out.splitlines()[-1:] == ["403"] and len(_Echo.seen) == n,
                  f"a path the policy does not allow: rc={rc} {out!r} {err!r}")
            # The guest's environments hold no token (its files: the overlay scan below; the
            # token must never be in a guest command line, which would put it in guest RAM).
            # Plant the control string in its memory (a process's environment) and on its disk.
            rc, out, err = sb.sh(f"env; cat /proc/1/environ | tr '\\0' '\\n'; "
                                 f"echo {control} > /root/control; sync; "
                                 f"CONTROL={control} setsid sleep 100000 >/dev/null 2>&1 & "
                                 f"echo planted")
            check(rc == 0 and secret not in out and out.strip().endswith("planted"),
                  f"guest env: rc={rc} {secret in out} {err!r}")
            deadline = time.monotonic() + 10  # a refusal's record follows its answer
            while True:
                with open(os.path.join(sb.state, sb.name, "audit.jsonl"), "rb") as f:
                    raw = f.read()
                inj = [r for r in map(json.loads, raw.splitlines())
                       if r.get("kind") == "egress-inject"]
                if any(r["decision"] == "deny" for r in inj) or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            check(sum(1 for r in inj if r["decision"] == "allow") >= 2 and
                  any(r["decision"] == "deny" for r in inj), f"egress-inject records: {inj}")
            check(secret.encode() not in raw, "the audit log holds the token")
            print(f"    audit: {len(inj)} egress-inject records; {sb.verify_audit()}")
            stop_and_scan(sb, secret, control, "bot")
            print("    after stop: the token (raw, base64 of user:token and of the token, three "
                  "alignments each) is in no file of the sandbox; the planted control is found")
        finally:
            sb.close()
            httpd.shutdown()
    finally:
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=dict(
            os.environ, GNUPGHOME=os.path.join(tmp, "gnupg")), capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


class _GitCGI(http.server.BaseHTTPRequestHandler):
    """git http-backend behind the test's TLS server: it answers only requests that carry the
    expected basic credentials (401 otherwise), as a private repository on a forge would."""
    root = want = None
    seen = []

    def _cgi(self):
        auth = self.headers.get("Authorization", "")
        _GitCGI.seen.append((self.command, self.path, auth == _GitCGI.want))
        if auth != _GitCGI.want:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="private"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path, _, query = self.path.partition("?")
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        env = {"GIT_PROJECT_ROOT": _GitCGI.root, "GIT_HTTP_EXPORT_ALL": "1", "PATH_INFO": path,
               "QUERY_STRING": query, "REQUEST_METHOD": self.command, "REMOTE_USER": "bot",
               "CONTENT_TYPE": self.headers.get("Content-Type", ""),
               "CONTENT_LENGTH": str(len(body)), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
               "GIT_PROTOCOL": self.headers.get("Git-Protocol", "")}
        r = subprocess.run(["/usr/lib/git-core/git-http-backend"], input=body, env=env,
                           capture_output=True, timeout=120)
        head, _, rest = r.stdout.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.split(b"\r\n"):
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"status":
                status = int(v.split()[0])
            elif k.strip():
                headers.append((k.strip().decode(), v.strip().decode()))
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)

    do_GET = do_POST = _cgi

    def log_message(self, *a):
        pass


def _tls_server(tmp, host, handler, days=2):
    """A test CA (ca.crt in tmp) and a threaded HTTPS server on 127.0.0.1 for host, both valid
    for DAYS; returns (server, port). The box resolves host to 127.0.0.1."""
    if not os.path.exists(os.path.join(tmp, "ca.crt")):
        _openssl(tmp, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-subj",
                 "/CN=cove e2e test CA", "-days", str(days))
    _openssl(tmp, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{host}.key", "-out", f"{host}.csr", "-subj", f"/CN={host}")
    with open(os.path.join(tmp, "ext"), "w") as f:
        f.write(f"subjectAltName=DNS:{host}\nextendedKeyUsage=serverAuth\n")
    _openssl(tmp, "x509", "-req", "-in", f"{host}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{host}.crt", "-days", str(days), "-extfile", "ext")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.path.join(tmp, f"{host}.crt"), os.path.join(tmp, f"{host}.key"))
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    hosts_add([f"127.0.0.1 {host}"])
    return httpd, httpd.server_address[1]


OCI_ARCHIVE = "/work/oci-deb/debian.oci.tar"


def test_image_oci_python_https():
    """The Debian image as an OCI image (issue 32: tests/e2e/run makes an OCI archive of its
    tree with a user app; glibc, Python, pip): cove image import reads it from a disk, cove
    create --image --policy boots it, cove exec runs as the image's User in its WorkingDir, and
    Python's urllib makes an HTTPS request through the egress interception that verifies
    against the sandbox's CA, which cove put in the image's trust bundle (SSL_CERT_FILE and
    REQUESTS_CA_BUNDLE name it)."""
    need_image()
    if not os.path.exists(OCI_ARCHIVE):
        raise bt.Failure(f"{OCI_ARCHIVE} is missing (tests/e2e/run makes it from the image)")
    tmp = tempfile.mkdtemp(prefix="ocipy-")
    secret = "tok-" + secrets.token_hex(20)
    try:
        httpd, port, policy, senv = _inject_upstream(tmp, secret)
        env = {"GNUPGHOME": senv["GNUPGHOME"], "PASSWORD_STORE_DIR": senv["PASSWORD_STORE_DIR"]}
        # The import goes into the state root the sandbox below uses.
        state = os.path.join(tmp, "oci-state")
        ienv = dict(os.environ, COVE_STATE_DIR=state)
        t0 = time.monotonic()
        r = subprocess.run([bt.COVE, "image", "import", OCI_ARCHIVE, "--json"],
                           capture_output=True, env=ienv, timeout=900)
        check(r.returncode == 0, f"cove image import: rc={r.returncode} "
                                 f"{r.stderr.decode(errors='replace')[-600:]!r}")
        info = json.loads(r.stdout)
        t_import = time.monotonic() - t0
        check(info["name"] == "localhost/debian-python:12" and not info["cached"],
              f"import: {info}")
        sb = EgressSandbox("deb-oci", tmp, policy=policy, env=dict(env, COVE_STATE_DIR=state),
                           image="localhost/debian-python:12")
        try:
            rc, out, err = sb.sh("id -un; pwd; echo $SSL_CERT_FILE; echo $REQUESTS_CA_BUNDLE; "
                                 "echo $LANG; python3 --version; pip3 --version | cut -d' ' -f1-2")
            lines = out.split("\n")
            check(rc == 0 and lines[:5] == ["app", "/home/app",
                                            "/etc/ssl/certs/ca-certificates.crt",
                                            "/etc/ssl/certs/ca-certificates.crt", "C.UTF-8"] and
                  lines[5].startswith("Python 3.11") and lines[6].startswith("pip "),
                  f"exec defaults in the Debian OCI image: rc={rc} {out!r} {err!r}")
            url = f"https://api.cove.test:{port}/v1/py"
            rc, out, err = sb.sh("python3 -c 'import urllib.request; "
                                 f"print(urllib.request.urlopen(\"{url}\").read().decode())'")
            check(rc == 0 and out.startswith("path=/v1/py auth=") and secret not in out,
                  f"python https through the interception: rc={rc} {out!r} {err!r}; "
                  f"broker.log {sb.tail('broker.log')!r}")
            check(_Echo.seen[-1:] == [("/v1/py", "Bearer " + secret)],
                  f"upstream saw {_Echo.seen[-1:]!r}")
            print(f"    cove image import (OCI archive from a disk, {info['entries']} entries, "
                  f"{info['unpacked_bytes'] >> 20} MiB): {t_import:.1f} s; python3 urllib "
                  f"https verified against the sandbox's CA as user app: {out.strip()!r}")
        finally:
            sb.close()
            httpd.shutdown()
    finally:
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=dict(
            os.environ, GNUPGHOME=os.path.join(tmp, "gnupg")), capture_output=True)


def test_image_git_clone():
    """git clone over HTTPS of a private repository (git http-backend; 401 without the token)
    in the Debian sandbox, with no token in the guest: the sandbox's cove-broker intercepts,
    adds basic auth built from a real pass store's username and password, and the clone
    succeeds; the audit log shows the injections and verifies; after a stop neither the token
    nor base64 of user:token is in any file of the sandbox, while a planted control is."""
    need_image()
    for t in ("git", "/usr/lib/git-core/git-http-backend"):
        if not shutil.which(t):
            raise Skip(f"{t} is not in the box (tests/e2e/run adds it when the host has git)")
    tmp = tempfile.mkdtemp(prefix="gitclone-")
    secret = "ghp-" + secrets.token_hex(20)
    control = "control-" + secrets.token_hex(20)
    content = "private content " + secrets.token_hex(8)
    try:
        work, repos = os.path.join(tmp, "work"), os.path.join(tmp, "repos")
        os.makedirs(work)
        os.makedirs(repos)
        g = ["git", "-c", "user.name=e2e", "-c", "user.email=e2e@cove.invalid",
             "-c", "init.defaultBranch=main"]
        # The bare repository is committed to directly (no local transport: the box has only
        # git and git-http-backend, not git's other helper programs).
        bare = os.path.join(repos, "private.git")
        gd = g + [f"--git-dir={bare}", f"--work-tree={work}"]
        with open(os.path.join(work, "README"), "w") as f:
            f.write(content + "\n")
        for argv in (g + ["init", "-q", "--bare", bare], gd + ["add", "README"],
                     gd + ["commit", "-q", "-m", "first"]):
            r = subprocess.run(argv, capture_output=True, text=True)
            check(r.returncode == 0, f"{' '.join(argv[7:])}: {r.stderr[-300:]!r}")
        _GitCGI.root = repos
        _GitCGI.want = "Basic " + base64.b64encode(f"bot:{secret}".encode()).decode()
        _GitCGI.seen = []
        httpd, port = _tls_server(tmp, "git.cove.test", _GitCGI)
        helper, senv = at.secret_store(tmp, secret)
        policy = {"credentials": {"git": {
            "helper": helper, "helper_input": {"protocol": "https", "host": "git.cove.test"},
            "inject": {"header": "Authorization", "template": "Basic {username}:{password}"},
            "allow": {"schemes": ["https"], "hosts": ["git.cove.test"], "ports": [port],
                      "path_prefixes": ["/private.git/"], "methods": ["GET", "POST"],
                      "headers": ["Accept", "Accept-Language", "Content-Type", "Git-Protocol",
                                  "Pragma", "User-Agent", "Content-Encoding"]},
            "allow_private": True, "ca_file": os.path.join(tmp, "ca.crt")}}}
        sb = EgressSandbox("deb-git", tmp, policy=policy,
                           env={"GNUPGHOME": senv["GNUPGHOME"],
                                "PASSWORD_STORE_DIR": senv["PASSWORD_STORE_DIR"]})
        try:
            t0 = time.monotonic()
            rc, out, err = sb.sh(f"git clone -q https://git.cove.test:{port}/private.git "
                                 f"/root/private && cat /root/private/README", timeout=600)
            dt = time.monotonic() - t0
            check(rc == 0 and out.strip() == content,
                  f"git clone: rc={rc} {out[-300:]!r} {err[-600:]!r}; server saw "
                  f"{_GitCGI.seen[-4:]!r}; broker.log {sb.tail('broker.log')!r}")
            check(_GitCGI.seen and all(ok for _, _, ok in _GitCGI.seen),
                  f"a request without the token reached the server: {_GitCGI.seen!r}")
            print(f"    git clone https://git.cove.test/private.git: {dt:.1f} s, "
                  f"{len(_GitCGI.seen)} requests, each with basic auth the broker added")
            rc, out, err = sb.sh(f"git -C /root/private config --list; env; "
                                 f"echo {control} > /root/control; sync; "
                                 f"CONTROL={control} setsid sleep 100000 >/dev/null 2>&1 & "
                                 f"echo planted")
            check(rc == 0 and secret not in out and out.strip().endswith("planted"),
                  f"guest config/env: rc={rc} {secret in out} {err!r}")
            with open(os.path.join(sb.state, sb.name, "audit.jsonl"), "rb") as f:
                raw = f.read()
            inj = [r for r in map(json.loads, raw.splitlines())
                   if r.get("kind") == "egress-inject"]
            check(len(inj) >= 2 and all(r["decision"] == "allow" for r in inj) and
                  secret.encode() not in raw, f"egress-inject records: {inj}")
            print(f"    audit: {len(inj)} egress-inject records; {sb.verify_audit()}")
            stop_and_scan(sb, secret, control, "bot")
            print("    after stop: no token, no base64 of bot:token in any file of the sandbox "
                  "(memory layers, overlay, logs); the planted control is found")
        finally:
            sb.close()
            httpd.shutdown()
    finally:
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=dict(
            os.environ, GNUPGHOME=os.path.join(tmp, "gnupg")), capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _leaf(tmp, host, ca_dir):
    """A server certificate for host signed by the CA in ca_dir (mitm-ca.crt/.key)."""
    _openssl(tmp, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{host}.key", "-out", f"{host}.csr", "-subj", f"/CN={host}")
    with open(os.path.join(tmp, f"{host}.ext"), "w") as f:
        f.write(f"subjectAltName=DNS:{host}\nextendedKeyUsage=serverAuth\n")
    _openssl(tmp, "x509", "-req", "-in", f"{host}.csr", "-CA",
             os.path.join(ca_dir, "mitm-ca.crt"), "-CAkey", os.path.join(ca_dir, "mitm-ca.key"),
             "-set_serial", str(secrets.randbits(63)), "-out", f"{host}.crt", "-days", "2",
             "-extfile", f"{host}.ext")


def test_image_template_ca():
    """A template built with a policy on the Debian image (its guest trusts the template's CA),
    and two sandboxes made from it: each gets a broker and an egress CA of its own, which
    replaces the template's in its guest's trust store. In each guest, curl over HTTPS with a
    credential injected works (the broker intercepts with that sandbox's CA), and a server whose
    certificate the other sandbox's CA or the template's CA signed is refused by curl."""
    need_image()
    tmp = tempfile.mkdtemp(prefix="tplca-")
    secret = "tok-" + secrets.token_hex(20)
    state, run = os.path.join(tmp, "state"), os.path.join(tmp, "run")
    tpl, names = "dtpl", {"a": "tpl-a", "b": "tpl-b"}
    servers, serving = [], []
    env = dict(os.environ, COVE_STATE_DIR=state, COVE_RUN_DIR=run, COVE_GUEST_DIR="/work")
    try:
        httpd, port = _tls_server(tmp, "api.cove.test", _Echo)
        servers.append(httpd)
        serving.append(httpd)
        helper, senv = at.secret_store(tmp, secret)
        probe = {w: http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo) for w in "abt"}
        servers += probe.values()
        hosts_add([f"127.0.0.1 ca-{w}.cove.test" for w in probe])
        policy = {"credentials": {"api": {
            "helper": helper, "helper_input": {"protocol": "https", "host": "api.cove.test"},
            "inject": {"header": "Authorization", "template": "Bearer {password}"},
            "allow": {"schemes": ["https"], "hosts": ["api.cove.test"], "ports": [port],
                      "path_prefixes": ["/v1/"], "methods": ["GET"]},
            "allow_private": True, "ca_file": os.path.join(tmp, "ca.crt")}},
            "egress": {"rules": [{"host": f"ca-{w}.cove.test",
                                  "ports": [srv.server_address[1]], "methods": ["CONNECT"],
                                  "allow_private": True} for w, srv in probe.items()]}}
        pol = os.path.join(tmp, "policy.json")
        with open(pol, "w") as f:
            json.dump(policy, f)
        env.update(GNUPGHOME=senv["GNUPGHOME"], PASSWORD_STORE_DIR=senv["PASSWORD_STORE_DIR"])
        if not os.path.exists(os.path.join(os.path.dirname(bt.COVE), "cove-broker")):
            env["COVE_BROKER"] = at.BROKER

        def cove(*args):
            r = subprocess.run([bt.COVE] + list(args), capture_output=True, env=env,
                               timeout=900)
            return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(
                errors="replace")

        t0 = time.monotonic()
        rc, out, err = cove("template", "create", tpl, "--rootfs", IMAGE, "--policy", pol)
        check(rc == 0, f"cove template create --policy: rc={rc} {err[-600:]!r}")
        print(f"    cove template create {tpl} --rootfs <Debian image> --policy: "
              f"{time.monotonic() - t0:.1f} s")
        for n in names.values():
            rc, out, err = cove("create", n, "--from", tpl)
            check(rc == 0, f"cove create {n} --from {tpl}: rc={rc} {err[-600:]!r}")
        cas = {"a": os.path.join(state, names["a"], "mitm-ca"),
               "b": os.path.join(state, names["b"], "mitm-ca"),
               "t": os.path.join(state, ".templates", tpl, "mitm-ca")}
        pems = {w: open(os.path.join(d, "mitm-ca.crt")).read() for w, d in cas.items()}
        check(len(set(pems.values())) == 3, "the template and its two sandboxes share a CA")
        for w, srv in probe.items():
            host = f"ca-{w}.cove.test"
            _leaf(tmp, host, cas[w])
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(os.path.join(tmp, f"{host}.crt"), os.path.join(tmp, f"{host}.key"))
            srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            serving.append(srv)
        for me, other in (("a", "b"), ("b", "a")):
            n = names[me]
            r = subprocess.run([bt.COVE, "exec", n, "--", "sh", "-c",
                                f"curl -sS https://api.cove.test:{port}/v1/hello"],
                               capture_output=True, env=env, timeout=600)
            got = r.stdout.decode(errors="replace")
            check(r.returncode == 0 and got.startswith("path=/v1/hello auth=") and
                  secret not in got, f"{n}: HTTPS with the credential: rc={r.returncode} "
                  f"{got!r} {r.stderr[-300:]!r}")
            for w, want in ((me, 0), (other, 60), ("t", 60)):
                host, p = f"ca-{w}.cove.test", probe[w].server_address[1]
                r = subprocess.run([bt.COVE, "exec", n, "--", "sh", "-c",
                                    f"curl -sS -o /dev/null https://{host}:{p}/x"],
                                   capture_output=True, env=env, timeout=600)
                check(r.returncode == want,
                      f"{n}: a server signed by {'the template' if w == 't' else names[w]}'s "
                      f"CA: curl exited {r.returncode}, want {want}: {r.stderr[-300:]!r}")
            rc = subprocess.run([bt.COVE, "exec", n, "--", "grep", "-c", "BEGIN CERTIFICATE",
                                 "/usr/local/share/ca-certificates/cove-sandbox.crt"],
                                capture_output=True, env=env, timeout=600)
            check(rc.returncode == 0, f"{n}: its CA file: {rc.stderr!r}")
        print("    tpl-a and tpl-b: HTTPS with the injected credential works in each; in each "
              "guest curl refuses a server signed by the other sandbox's CA or the template's "
              "CA (exit 60) and accepts one signed by its own")
    finally:
        for n in names.values():
            subprocess.run([bt.COVE, "rm", n], capture_output=True, env=env, timeout=300)
        subprocess.run([bt.COVE, "template", "rm", tpl], capture_output=True, env=env,
                       timeout=300)
        for srv in servers:
            if srv in serving:
                srv.shutdown()
            srv.server_close()
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=dict(
            os.environ, GNUPGHOME=os.path.join(tmp, "gnupg")), capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


TESTS = [
    test_image_tools,
    test_image_boot_to_ready,
    test_image_egress_refusals,
    test_image_egress_parallel_and_pip,
    test_image_credential_injection,
    test_image_git_clone,
    test_image_template_ca,
    test_image_oci_python_https,
]
