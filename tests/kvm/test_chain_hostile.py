#!/usr/bin/env python3
"""A tampered snapshot chain gets a one-line refusal, never a host path: restore takes disks and
the vsock socket from its command line (the state file's machine description names none), and
every write into a chain directory refuses links planted there. Canaries prove nothing was
touched: their sha256 is unchanged and no guest serial byte appears."""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import socket
import struct
import time
import zlib

from covetest import Vm, check, guest, main, open_fds, run_cove, run_each

SEC_CONFIG = 1


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def chain_file(d):
    """The newest generation file (snapshot/DIGEST.md): chain.NNNNNNNNNN.json, else chain.json."""
    gens = sorted(f for f in os.listdir(d) if re.fullmatch(r"chain\.\d{10}\.json", f))
    return os.path.join(d, gens[-1] if gens else "chain.json")


def chain(d):
    with open(chain_file(d)) as f:
        return json.load(f)


def tree_digest(path):
    """snapshot/digest.h's "cove-sha256-tree": SHA-256 over the size and each 1 MiB chunk's SHA-256."""
    size = os.path.getsize(path)
    top = hashlib.sha256(b"cove-sha256-tree\0" + struct.pack("<QI", size, 1 << 20))
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            top.update(hashlib.sha256(b).digest())
    return top.hexdigest()


def reseal(d, name):
    """What an attacker who can rewrite the chain file too would do: the newest generation
    records the tampered file's digest, so the parsers behind the digest check are reached."""
    path = chain_file(d)
    with open(path) as f:
        c = json.load(f)
    if "sha256" in c:
        c["sha256"][name] = tree_digest(os.path.join(d, name))
        with open(path, "w") as f:
            json.dump(c, f)


def listing(d):
    return sorted((f, os.lstat(os.path.join(d, f)).st_size, os.lstat(os.path.join(d, f)).st_mtime_ns)
                  for f in os.listdir(d))


def read_state(path):
    """The sections of a plain state file (snapshot/state_file.c) as [type, instance, payload]."""
    with open(path, "rb") as f:
        buf = f.read()
    check(buf[:8] == b"COVESTAT", f"{path}: not a state file")
    blen = struct.unpack_from("<Q", buf, 16)[0]
    secs, off = [], 32
    while off < 32 + blen:
        t, inst, n, _ = struct.unpack_from("<IIII", buf, off)
        secs.append([t, inst, buf[off + 16:off + 16 + n]])
        off += 16 + ((n + 7) & ~7)
    return secs


def write_state(path, secs):
    """Writes sections back with a valid header and CRCs: only the content is hostile."""
    body = b""
    for t, inst, p in secs:
        body += struct.pack("<IIII", t, inst, len(p), 0) + p + b"\0" * (((len(p) + 7) & ~7) - len(p))
    with open(path, "rb") as f:  # the writer's format version (2 records CPUID), kept
        version = struct.unpack_from("<I", f.read(12), 8)[0]
    hdr = b"COVESTAT" + struct.pack("<IIQI", version, 32, len(body), zlib.crc32(body))
    hdr += struct.pack("<I", zlib.crc32(hdr))
    with open(path, "wb") as f:
        f.write(hdr + body)


def set_config(d, cfg):
    name = chain(d)["layers"][-1]["state"]
    state = os.path.join(d, name)
    secs = read_state(state)
    for s in secs:
        if s[0] == SEC_CONFIG:
            s[2] = json.dumps(cfg).encode() if not isinstance(cfg, bytes) else cfg
    write_state(state, secs)
    reseal(d, name)


def get_config(d):
    state = os.path.join(d, chain(d)["layers"][-1]["state"])
    return json.loads(next(p for t, _, p in read_state(state) if t == SEC_CONFIG))


def refused(args, want, what):
    r = run_cove(["restore"] + args, timeout=30)
    check(r.returncode == 1, f"{what}: exit {r.returncode}, stderr {r.stderr!r}")
    check(want in r.stderr and r.stderr.count("\n") == 1,
          f"{what}: want one line with {want!r}, got {r.stderr!r}")
    check(r.stdout == "", f"{what}: the guest ran: {r.stdout!r}")


def test_machine_paths(tmp):
    d = os.path.join(tmp, "chain")
    img = os.path.join(tmp, "disk.img")
    with open(img, "wb") as f:
        f.write(b"\0" * 65536)
    canary = os.path.join(tmp, "shadow")
    with open(canary, "wb") as f:
        f.write(b"root:secret-hash:19000:0:99999:7:::\n" * 100)
    before = sha(canary)
    uds = os.path.join(tmp, "v.sock")
    with Vm(guest("counter"), extra=["--snapshot-dir", d, "--disk", img, "--vsock-cid", "7",
                                     "--vsock-uds", uds]) as vm:
        vm.wait_output("tick 2\n")
        status, body = vm.request("PUT", "/snapshot/create", {"snapshot_type": "Full"})
        check(status == 200, f"snapshot: {status} {body}")
        vm.stop(signal.SIGKILL)
    cfg = get_config(d)
    text = json.dumps(cfg)
    check(img not in text and uds not in text and tmp not in text,
          f"the state file names host paths: {text}")
    check(cfg["disks"][0]["size"] == 65536, f"disk size not recorded: {text}")

    # The host must give every disk and the vsock socket; they must match what was saved.
    refused([d], "give its host file with --disk", "no --disk")
    refused([d, "--disk", img], "--vsock-uds", "no --vsock-uds")
    new_uds = os.path.join(tmp, "v2.sock")
    refused([d, "--disk", img + ",ro", "--vsock-uds", new_uds], "saved writable", "ro differs")
    refused([d, "--disk", canary, "--vsock-uds", new_uds], "bytes", "size differs")
    refused([d, "--disk", img, "--disk", img, "--vsock-uds", new_uds], "only 1 disk",
            "extra disk")

    # "Another sandbox's" socket: must be neither unlinked nor taken over.
    other = os.path.join(tmp, "other.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(other)
    srv.listen(1)
    ino = os.stat(other).st_ino
    orig = get_config(d)
    hostile = [
        # The old format: host paths straight from the file.
        ({"mem_size": orig["mem_size"], "vcpus": orig["vcpus"],
          "disks": [{"path": canary, "ro": False, "overlay": "", "layers": []}],
          "vsock": {"cid": 7, "uds": other}}, "format 1 is not supported"),
        (dict(orig, vsock={"cid": 7, "uds": other}), "vsock description is malformed"),
        (dict(orig, disks=[dict(orig["disks"][0], path=canary)]), None),
        (dict(orig, disks=[dict(orig["disks"][0], overlay=True, layers=["../shadow"])]),
         "not a file name inside the chain"),
        (dict(orig, disks=[dict(orig["disks"][0], overlay=True, layers=[canary])]),
         "not a file name inside the chain"),
    ]
    for cfg, want in hostile:
        set_config(d, cfg)
        if want:
            refused([d, "--disk", img, "--vsock-uds", new_uds], want, f"tampered {cfg}")
        else:
            # An extra "path" key is ignored: the disk still comes from --disk, not the file.
            with Vm(None, restore=d, extra=["--disk", img, "--vsock-uds", new_uds]) as r:
                r.wait_output("tick 3\n")
                fds = open_fds(r.proc.pid)
                check(canary not in fds, f"restore opened the path the file named: {fds}")
                check(img in fds, f"restore did not open the host's --disk: {fds}")
        check(sha(canary) == before, "the canary changed")
        check(os.path.exists(other) and os.stat(other).st_ino == ino,
              "the other sandbox's socket was unlinked or replaced")
    srv.close()
    set_config(d, orig)
    # PUT /fork: each clone is given the parent's host disk on its command line.
    d3 = os.path.join(tmp, "forked")
    with Vm(guest("counter"), extra=["--snapshot-dir", d3, "--disk", img + ",ro"]) as vm:
        vm.wait_output("tick 1\n")
        status, body = vm.request("PUT", "/fork", {"count": 1}, timeout=60)
        check(status == 200, f"fork of a sandbox with a disk: {status} {body}")
        pid = body["clones"][0]["pid"]
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            check(b"--disk" in argv and (img + ",ro").encode() in argv,
                  f"the clone was not given the host disk: {argv}")
            fds = open_fds(pid)
            check(img in fds, f"the clone did not open the host disk: {fds}")
        finally:
            os.kill(pid, signal.SIGKILL)
    with Vm(None, restore=d, extra=["--disk", img, "--vsock-uds", new_uds]) as r:
        r.wait_output("tick 3\n")
        check(os.path.exists(new_uds), "restore did not serve vsock on the host's --vsock-uds")
    print("ok machine paths: disks and vsock from the command line, tampered paths refused")


def make_overlay_top(ovl, disk_size, chunk=64 << 10):
    """An overlay top (devices/OVERLAY.md) holding data in chunk 0, as if a guest had written
    it: the test guests never write their disks, and a snapshot freezes only a top with data."""
    n = (disk_size + chunk - 1) // chunk
    bm = bytearray((n + 7) // 8)
    bm[0] = 1
    hdr = b"COVEOVLM" + struct.pack("<IIQQIIII", 2, chunk, disk_size, n, zlib.crc32(bytes(bm)),
                                    0, 0, 0)
    hdr += struct.pack("<I", zlib.crc32(hdr))
    with open(ovl + ".map", "wb") as f:
        f.write(hdr + bytes(bm))
    with open(ovl, "wb") as f:
        f.write(b"W" * chunk + b"\0" * (disk_size - chunk))


def test_frozen_layers(tmp):
    """A snapshot freezes an overlay top and links it into the chain; restore reads frozen
    layers only as plain names inside the chain (never through a link), the base from --disk."""
    d = os.path.join(tmp, "chain")
    base = os.path.join(tmp, "base.img")
    with open(base, "wb") as f:
        f.write(b"\0" * (256 << 10))
    ovl = os.path.join(tmp, "user.ovl")
    make_overlay_top(ovl, 256 << 10)
    with Vm(guest("counter"), extra=["--snapshot-dir", d, "--disk", f"{base},overlay={ovl}"]) as vm:
        vm.wait_output("tick 1\n")
        status, body = vm.request("PUT", "/snapshot/create", {"snapshot_type": "Full"})
        check(status == 200, f"snapshot: {status} {body}")
        vm.stop(signal.SIGKILL)
    cfg = get_config(d)
    layers = cfg["disks"][0]["layers"]
    check(cfg["disks"][0]["overlay"] is True and len(layers) == 1 and "/" not in layers[0],
          f"frozen layers in the state file: {cfg}")
    lp = os.path.join(d, layers[0])
    check(os.stat(lp).st_ino == os.stat(ovl).st_ino and os.path.exists(lp + ".map"),
          f"the frozen user overlay is not linked into the chain: {os.listdir(d)}")
    refused([d], "the base under an overlay", "overlay disk without --disk")
    refused([d, "--disk", f"{base},overlay={ovl}"], "does not take overlay=", "overlay= given")
    with Vm(None, restore=d, extra=["--disk", base]) as r:
        r.wait_output("tick 2\n")
        fds = open_fds(r.proc.pid)
        check(lp in fds and base in fds and ovl not in fds,
              f"restore did not read the chain's layer and the host's base: {fds}")
    # The chain's layer swapped for a link to a host file: refused, nothing read through it
    # (the digest check before the guest runs opens it first, without following links).
    os.rename(lp, lp + ".orig")
    os.symlink(ovl, lp)
    refused([d, "--disk", base], "a link where a chain file should be", "frozen layer through a link")
    os.unlink(lp)
    os.rename(lp + ".orig", lp)
    # The frozen layer's map altered after the commit: refused by its digest, naming it.
    with open(lp + ".map", "r+b") as f:
        f.seek(os.path.getsize(lp + ".map") - 1)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    refused([d, "--disk", base], f"{layers[0]}.map: SHA-256 does not match the chain",
            "frozen layer map altered")
    print("ok frozen layers: linked into the chain, restored by name, links refused")


def seed(path, target):
    os.symlink(target, path)


def test_symlinked_temps(tmp):
    """Temp names planted as links to a canary: snapshots, compaction and overlay map writes
    replace the link with a real file of their own; the canary never changes."""
    canary = os.path.join(tmp, "authorized_keys")
    with open(canary, "wb") as f:
        f.write(b"ssh-ed25519 AAAA canary\n" * 50)
    before = sha(canary)
    d = os.path.join(tmp, "chain")
    os.mkdir(d, 0o700)
    planted = (".mem-000001.tmp", ".state-000001.tmp", ".chain.json.tmp", ".mem-000002.tmp",
               ".state-000002.tmp", ".mem-000003.tmp", ".state-000003.tmp", ".mem-000003-c.tmp",
               "chain.0000000002.json.tmp")
    for name in planted:
        seed(os.path.join(d, name), canary)
    od = os.path.join(tmp, "ovl")
    os.mkdir(od, 0o700)
    base = os.path.join(tmp, "base.img")
    with open(base, "wb") as f:
        f.write(b"\0" * 65536)
    ovl = os.path.join(od, "top.ovl")
    seed(ovl + ".map.tmp", canary)
    with Vm(guest("counter"), extra=["--snapshot-dir", d, "--snapshot-keep", "2",
                                     "--disk", f"{base},overlay={ovl}"]) as vm:
        vm.wait_output("tick 2\n")
        for kind in ("Full", "Diff", "Diff"):
            status, body = vm.request("PUT", "/snapshot/create", {"snapshot_type": kind})
            check(status == 200, f"{kind} snapshot with planted links: {status} {body}")
            check(sha(canary) == before, f"the {kind} snapshot wrote through a planted link")
        check(body.get("compacted"), f"the third snapshot did not compact: {body}")
    check(sha(canary) == before, "a snapshot wrote through a planted link into the canary")
    # Commits create fresh names (never unlink or replace): the planted links are left as they
    # were, never followed; chain_settle on the host side removes only regular files.
    for f in planted:
        check(os.path.islink(os.path.join(d, f)), f"{f}: a planted link was replaced or removed")
    for l in chain(d)["layers"]:
        for f in (l["mem"], l["state"]):
            check(not os.path.islink(os.path.join(d, f)), f"{f} is a link")
    check(not os.path.islink(ovl + ".map") and os.path.isfile(ovl + ".map"),
          "the overlay map is not a file of its own")

    # A link where the overlay data file goes: refused in one line, nothing written.
    ovl2 = os.path.join(od, "top2.ovl")
    seed(ovl2, canary)
    r = run_cove(["run", "--kernel", guest("counter"), "--disk", f"{base},overlay={ovl2}"])
    check(r.returncode != 0 and r.stdout == "", f"overlay data through a link: {r}")
    check(sha(canary) == before, "the overlay data file was opened through a link")

    # A chain directory others can write to (they could plant links at any time) is refused.
    d2 = os.path.join(tmp, "open-chain")
    os.mkdir(d2)
    os.chmod(d2, 0o777)
    r = run_cove(["run", "--kernel", guest("counter"), "--snapshot-dir", d2])
    check(r.returncode == 1 and "writable by others" in r.stderr and r.stdout == "",
          f"group/other-writable chain dir: {r.returncode} {r.stderr!r}")
    print("ok symlinked temps: links replaced by real files, the canary unchanged")


def test_console_file(tmp):
    """The console file: 0600, never through a link, capped by --console-max with one log line,
    and not inherited by clones."""
    canary = os.path.join(tmp, "bashrc")
    with open(canary, "wb") as f:
        f.write(b"alias ls='ls --color'\n")
    before = sha(canary)
    link = os.path.join(tmp, "console.out")
    seed(link, canary)
    r = run_cove(["run", "--kernel", guest("counter"), "--console", link, "--cmdline", "ticks=3"])
    check(r.returncode == 1 and "console" in r.stderr and r.stderr.count("\n") == 1,
          f"console through a link: {r.returncode} {r.stderr!r}")
    check(sha(canary) == before, "the console was written through a link")
    os.unlink(link)

    con = os.path.join(tmp, "capped.out")
    cap = 40  # bytes: a handful of ticks, reached in time on a loaded machine too
    old = os.umask(0)
    try:
        with Vm(guest("counter"), extra=["--console", con, "--console-max", f"{cap}B"]) as vm:
            end = time.monotonic() + 120  # a wait, not a goal: a loaded box ticks slowly
            while time.monotonic() < end and (not os.path.exists(con) or
                                              os.path.getsize(con) < cap):
                time.sleep(0.05)
            time.sleep(1.0)  # the guest goes on printing: the file must not grow
            size = os.path.getsize(con)
            mode = os.stat(con).st_mode & 0o777
            check(vm.alive(), "the capped console stopped the guest")
            vm.stop()
            err = vm.stderr()
    finally:
        os.umask(old)
    check(size == cap, f"console file is {size} bytes, the cap was {cap}")
    check(mode == 0o600, f"console file mode {mode:o}, want 600 (umask was 0)")
    check(err.count(f"reached its cap of {cap} bytes") == 1, f"want one cap log line: {err!r}")
    # A clone inherits neither the console file nor its cap's counter: it has its own.
    con2 = os.path.join(tmp, "parent.out")
    with Vm(guest("counter"), extra=["--console", con2, "--snapshot-dir",
                                     os.path.join(tmp, "cchain")]) as vm:
        end = time.monotonic() + 20
        while time.monotonic() < end and b"tick 1" not in open(con2, "rb").read():
            time.sleep(0.05)
        status, body = vm.request("PUT", "/fork", {"count": 1}, timeout=60)
        check(status == 200, f"fork: {status} {body}")
        pid = body["clones"][0]["pid"]
        try:
            fds = open_fds(pid)
            check(con2 not in fds, f"the clone holds the parent's console file: {fds}")
            check(body["clones"][0]["console"] in fds, f"the clone has no console of its own: {fds}")
        finally:
            os.kill(pid, signal.SIGKILL)
    r = run_cove(["run", "--kernel", guest("counter"), "--console-max", "0"])
    check(r.returncode == 2 and "--console-max" in r.stderr, f"--console-max 0: {r.stderr!r}")
    print("ok console file: 0600, no links, capped with one log line")


def flip_page_byte(path):
    """Flips one byte inside the page data of a memory layer (snapshot/mem_layer.h): the first
    page its bitmap holds. Header, bitmap and their CRCs stay valid."""
    with open(path, "r+b") as f:
        hdr = f.read(4096)
        bm_off, bm_len, data_off = struct.unpack_from("<QQQ", hdr, 48)
        f.seek(bm_off)
        bm = f.read(bm_len)
        page = next(i for i in range(bm_len * 8) if bm[i // 8] >> (i % 8) & 1)
        f.seek(data_off + page * 4096 + 100)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))
        return data_off + page * 4096 + 100, b


def test_digests(tmp):
    """Issue 27: every committed file's digest is recorded at commit; a byte flipped in a
    memory layer's page data, or a state file rewritten with valid CRCs, is refused with one line
    naming the file before the guest runs, and nothing in the directory changes. A chain from
    before digests restores with one warning and gets them at its next commit."""
    d = os.path.join(tmp, "chain")
    with Vm(guest("counter"), extra=["--snapshot-dir", d]) as vm:
        vm.wait_output("tick 2\n")
        for kind in ("Full", "Diff"):
            status, body = vm.request("PUT", "/snapshot/create", {"snapshot_type": kind})
            check(status == 200, f"{kind} snapshot: {status} {body}")
        vm.stop(signal.SIGKILL)
    c = chain(d)
    check(c["version"] == 2 and os.path.basename(chain_file(d)) == "chain.0000000002.json",
          f"the second commit is not generation 2: {os.listdir(d)}")
    for l in c["layers"]:
        for f in (l["mem"], l["state"]):
            check(c["sha256"].get(f) == tree_digest(os.path.join(d, f)),
                  f"{f}: recorded digest {c['sha256'].get(f)} is not its content's")
    mem = c["layers"][0]["mem"]
    state = c["layers"][-1]["state"]
    off, orig = flip_page_byte(os.path.join(d, mem))
    before = listing(d)
    refused([d], f"{mem}: SHA-256 does not match the chain", "page byte flipped")
    check(listing(d) == before, "a refused restore changed the chain directory")
    with open(os.path.join(d, mem), "r+b") as f:
        f.seek(off)
        f.write(orig)
    # The state file with one byte of a device section changed and every CRC recomputed.
    secs = read_state(os.path.join(d, state))
    sec = next(s for s in secs if s[0] != SEC_CONFIG and len(s[2]) > 0)
    sec[2] = bytes([sec[2][0] ^ 0x01]) + sec[2][1:]
    saved = open(os.path.join(d, state), "rb").read()
    write_state(os.path.join(d, state), secs)
    refused([d], f"{state}: SHA-256 does not match the chain", "state rewritten, CRCs valid")
    with open(os.path.join(d, state), "wb") as f:
        f.write(saved)
    with Vm(None, restore=d) as r:
        r.wait_output("tick ")  # the guest runs again once the files are as committed
    # A chain from before digests (tests/kvm/fixtures/chain-v2.tar.xz): one warning line.
    oldroot = os.path.join(tmp, "old")
    os.mkdir(oldroot, 0o700)
    subprocess.run(["tar", "-C", oldroot, "-xJf", os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "fixtures", "chain-v2.tar.xz")], check=True)
    old = os.path.join(oldroot, "chain")
    uds = os.path.join(tmp, "old.sock")
    with Vm(None, restore=old, extra=["--disk", os.path.join(old, "base.img"),
                                      "--vsock-uds", uds]) as r:
        with open(os.path.join(old, "LAST_TICK")) as f:
            last = int(f.read())
        r.wait_output(f"tick {last + 1}\n")
        status, body = r.request("PUT", "/snapshot/create", {"snapshot_type": "Diff"})
        check(status == 200 and body["layer_id"] == 3, f"old chain continues: {status} {body}")
        r.stop(signal.SIGKILL)
        err = r.stderr()
    warns = [l for l in err.splitlines() if "SHA-256" in l]
    check(len(warns) == 1 and "warn" in warns[0] and "no SHA-256 digests" in warns[0],
          f"want one warning line about the missing digests: {err!r}")
    c = chain(old)
    check(os.path.basename(chain_file(old)) == "chain.0000000001.json" and len(c["layers"]) == 3,
          f"the old chain's next commit: {os.listdir(old)}")
    for l in c["layers"]:
        for f in (l["mem"], l["state"]):
            check(c["sha256"].get(f) == tree_digest(os.path.join(old, f)),
                  f"{f}: no digest after the next commit")
    print("ok digests: flipped page byte and CRC-valid state rewrite refused, old chain warned once")


def run_all():
    names = os.environ.get("ONLY", "test_machine_paths test_frozen_layers test_symlinked_temps "
                                   "test_console_file test_digests").split()
    run_each([globals()[n] for n in names], "cove-hostile-")


if __name__ == "__main__":
    main(run_all)
