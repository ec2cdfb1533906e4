#!/usr/bin/env python3
"""e2e: a sandbox booted from the Debian image (guest/image/build) instead of the busybox rootfs:
its tools answer through `cove exec`, and its boot-to-ready is measured beside busybox's.

Runs in the KVM box beside box_tests.py (module "image"). tests/e2e/run attaches the image
file as a virtio disk (tools/kvm-box --disk): /work/image/rootfs.ext4 is a symlink to that
block device, nothing of it goes through the initramfs; packages.txt is copied beside it. Every boot uses the image as the
read-only base of a copy-on-write overlay, as sandboxes will.
"""
import hashlib
import os
import re
import statistics
import time

import agent_tests as at
import box_tests as bt
from covetest import Skip, check

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


TESTS = [
    test_image_tools,
    test_image_boot_to_ready,
]
