#!/usr/bin/env python3
"""Encrypted snapshots on this machine's /dev/kvm (issue 7): key-cmd and SoftHSM2 (PKCS#11) key
providers, restore continues, no plaintext in the layers, revoked KEK refused with one line,
rekey, tampered ciphertext/header refused before the guest runs or stopping the VM at the touch."""
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import zlib

from covetest import COVE, Vm, chain_json, check, reseal_all, guest, main, run_cove, run_each, wait_file_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
KEYCMD = os.path.join(HERE, "..", "..", "tools", "key-cmd-openssl")
SOFTHSM = "/usr/lib/softhsm/libsofthsm2.so"
BASE, COUNT, STRIDE = 0x1000000, 64, 1


def sh(cmd, **kw):
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, **kw)
    check(r.returncode == 0, f"{cmd}: {r.returncode} {r.stderr.strip()}")
    return r.stdout


def chain(d):
    return chain_json(d)


def stamped_snapshot(d, key_spec, env=None):
    """A stamper guest: Full after round 1, Diff after round 2, then killed."""
    cmdline = f"stamp_base={BASE:#x} stamp_count={COUNT} stamp_stride={STRIDE} rounds=3"
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        with Vm(guest("stamper"), extra=["--cmdline", cmdline, "--snapshot-dir", d,
                                         "--snapshot-key", key_spec]) as vm:
            vm.wait_output(f"stamped round 1 pages {COUNT}\n")
            vm.snapshot("Full")
            vm.send_input(b"n")
            vm.wait_output(f"stamped round 2 pages {COUNT}\n")
            vm.snapshot("Diff")
            vm.stop(signal.SIGKILL)
    finally:
        os.environ.clear()
        os.environ.update(old)


def restore_continues(d, key, env=None, extra=()):
    reseal_all(d)  # the files as they are now (a test put tampered bytes back)
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        with Vm(None, restore=d, extra=["--key", key] + list(extra)) as r:
            r.send_input(b"n")
            r.wait_output(f"stamped round 3 pages {COUNT}\n")
    finally:
        os.environ.clear()
        os.environ.update(old)


def expect_fail(d, want, key=None, env=None, extra=()):
    # The digests resealed: what is tested here is what comes behind them (GCM, the formats).
    reseal_all(d)
    e = dict(os.environ)
    e.update(env or {})
    extra = (["--key", key] if key else []) + list(extra)
    r = subprocess.run([COVE, "restore", d] + extra, capture_output=True, text=True,
                       timeout=60, env=e, stdin=subprocess.DEVNULL)
    check(r.returncode == 1 and want in r.stderr and r.stderr.count("\n") == 1,
          f"want exit 1 and one line with {want!r}; got {r.returncode} {r.stderr!r}")
    check(r.stdout == "", f"the guest ran: {r.stdout[-200:]!r}")
    return r.stderr.strip()


def stamp_bytes(round_, i):
    return struct.pack("<Q", round_ << 32 | i)


def layer_files(d):
    return [os.path.join(d, l["mem"]) for l in chain(d)["layers"]]


def test_key_cmd(tmp):
    d = os.path.join(tmp, "chain")
    kek, kek2 = os.path.join(tmp, "kek.pem"), os.path.join(tmp, "kek2.pem")
    sh(f"'{KEYCMD}' --genkey '{kek}'")
    sh(f"'{KEYCMD}' --genkey '{kek2}'")
    spec = f"key-cmd:'{KEYCMD}' '{kek}'"
    stamped_snapshot(d, spec)
    c = chain(d)
    check(len(c["layers"]) == 2 and os.path.exists(os.path.join(d, "keys")), f"chain: {c}")
    # Where a plain layer holds each stamped page, the encrypted one holds something else.
    seen = 0
    for path in layer_files(d):
        with open(path, "rb") as f:
            hdr = f.read(4096)
            data_off = struct.unpack_from("<Q", hdr, 64)[0]
            for r in (1, 2):
                for i in range(COUNT):
                    pfn = (BASE >> 12) + ((r - 1) * COUNT + i) * STRIDE
                    f.seek(data_off + pfn * 4096)
                    got = f.read(8)
                    check(got != stamp_bytes(r, i), f"{path}: page {pfn:#x} holds its stamp in clear")
                    seen += got != b"\0" * 8
    check(seen >= 2 * COUNT, f"only {seen} stamped pages hold ciphertext")
    restore_continues(d, spec)
    print("ok key-cmd: encrypted Full+Diff, restore continues, no plaintext stamps")

    # Rekey to a second KEK, then revoke the first: restore still works.
    r = run_cove(["rekey", d, "--to-key-cmd", f"'{KEYCMD}' '{kek2}'"], timeout=60)
    check(r.returncode == 2 and "old key provider is required" in r.stderr,
          f"rekey without --from: {r.returncode} {r.stderr!r}")
    r = run_cove(["rekey", d, "--from-key-cmd", f"'{KEYCMD}' '{kek}'",
                  "--to-key-cmd", f"'{KEYCMD}' '{kek2}'"], timeout=60)
    check(r.returncode == 0, f"rekey: {r.returncode} {r.stderr!r}")
    spec2 = f"key-cmd:'{KEYCMD}' '{kek2}'"
    os.rename(kek, kek + ".revoked")
    restore_continues(d, spec2)
    print("ok rekey: restore works under the new KEK with the old one gone")
    line = expect_fail(d, "records another key-cmd key provider", key=spec)
    print(f"ok old provider after rekey: {line}")
    # Revoke the current KEK: one clear line, nothing runs.
    os.rename(kek2, kek2 + ".revoked")
    line = expect_fail(d, "the KEK may be revoked", key=spec2)
    print(f"ok revoked: {line}")
    os.rename(kek2 + ".revoked", kek2)

    # Tampering: one flipped bit in a stored page's ciphertext.
    lay = layer_files(d)[-1]
    keep = lay + ".orig"
    shutil.copy2(lay, keep)
    with open(lay, "rb") as f:
        hdr = f.read(4096)
    data_off = struct.unpack_from("<Q", hdr, 64)[0]
    page = (BASE >> 12) + COUNT * STRIDE  # first page of round 2: stored in the Diff layer
    with open(lay, "r+b") as f:
        f.seek(data_off + page * 4096 + 100)
        b = f.read(1)
        f.seek(data_off + page * 4096 + 100)
        f.write(bytes([b[0] ^ 1]))
    line = expect_fail(d, "failed authentication", key=spec2, extra=["--verify"])
    print(f"ok tampered page, --verify: {line}")
    shutil.copy2(keep, lay)
    # A changed bit in the "pages with data" bitmap, with both CRCs made right again: only the
    # sealed digest can tell.
    bm_len = struct.unpack_from("<Q", hdr, 56)[0]
    with open(lay, "r+b") as f:
        f.seek(4096)
        bms = bytearray(f.read(2 * bm_len))
        # Clear one "has data" bit: that page would read as zeros (still a subset of "held").
        k = next(j for j in range(bm_len) if bms[bm_len + j])
        bms[bm_len + k] &= bms[bm_len + k] - 1
        f.seek(4096)
        f.write(bms)
        h = bytearray(hdr)
        struct.pack_into("<I", h, 108, zlib.crc32(bytes(bms)))
        struct.pack_into("<I", h, 4092, zlib.crc32(bytes(h[:4092])))
        f.seek(0)
        f.write(h)
    line = expect_fail(d, "header or page bitmap failed authentication", key=spec2)
    print(f"ok tampered bitmap: {line}")
    shutil.copy2(keep, lay)
    os.unlink(keep)
    restore_continues(d, spec2)


def test_lazy_tamper_stops_vm(tmp):
    """Without --verify a bad page is caught when first touched: the VM stops, exit 1."""
    d = os.path.join(tmp, "chain2")
    kek = os.path.join(tmp, "kek3.pem")
    sh(f"'{KEYCMD}' --genkey '{kek}'")
    spec = f"key-cmd:'{KEYCMD}' '{kek}'"
    with Vm(guest("counter"), extra=["--snapshot-dir", d, "--snapshot-key", spec]) as vm:
        vm.wait_output("tick 2\n")
        vm.snapshot("Full")
        vm.stop(signal.SIGKILL)
    lay = layer_files(d)[0]
    with open(lay, "rb") as f:
        hdr = f.read(4096)
    data_off = struct.unpack_from("<Q", hdr, 64)[0]
    with open(lay, "r+b") as f:
        f.seek(data_off + 0x111 * 4096 + 8)  # the counter guest's stack page: touched at once
        b = f.read(1)
        f.seek(data_off + 0x111 * 4096 + 8)
        f.write(bytes([b[0] ^ 0x80]))
    reseal_all(d)
    r = subprocess.run([COVE, "restore", d, "--key", spec], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    check(r.returncode == 1 and "failed authentication" in r.stderr,
          f"lazy tamper: exit {r.returncode}, stderr {r.stderr!r}")
    check("tick" not in r.stdout, f"the guest ran on the bad page: {r.stdout[-200:]!r}")
    print(f"ok lazy tamper: {r.stderr.strip().splitlines()[-1]}")


def rewrite_keys_config(d, config):
    """DIR/keys with its provider config replaced (same wrapped key) and a valid CRC."""
    path = os.path.join(d, "keys")
    with open(path, "rb") as f:
        b = f.read()
    cl, wl = struct.unpack_from("<II", b, 32)
    cfg = config.encode()
    hdr = bytearray(b[:56])
    struct.pack_into("<I", hdr, 32, len(cfg))
    body = bytes(hdr) + cfg + b[56 + cl:56 + cl + wl]
    with open(path, "wb") as f:
        f.write(body + struct.pack("<I", zlib.crc32(body)))
    return b


def test_keys_file_cannot_name_provider(tmp):
    """Issue 12 item 1: a chain's keys file naming a key command never gets it run."""
    d = os.path.join(tmp, "chain")
    kek = os.path.join(tmp, "kek.pem")
    marker = os.path.join(tmp, "marker")
    sh(f"'{KEYCMD}' --genkey '{kek}'")
    spec = f"key-cmd:'{KEYCMD}' '{kek}'"
    stamped_snapshot(d, spec)
    orig = rewrite_keys_config(d, f"touch '{marker}'; '{KEYCMD}' '{kek}'")
    line = expect_fail(d, "give its key provider with --key")
    print(f"ok no --key: {line}")
    line = expect_fail(d, "records another key-cmd key provider", key=spec)
    print(f"ok --key differs from the record: {line}")
    r = run_cove(["rekey", d, "--to-key-cmd", f"'{KEYCMD}' '{kek}'"], timeout=60)
    check(r.returncode == 2, f"rekey without --from: {r.returncode} {r.stderr!r}")
    r = run_cove(["rekey", d, "--from-key-cmd", f"'{KEYCMD}' '{kek}'",
                  "--to-key-cmd", f"'{KEYCMD}' '{kek}'"], timeout=60)
    check(r.returncode == 1 and "records another key-cmd key provider" in r.stderr,
          f"rekey from the honest provider: {r.returncode} {r.stderr!r}")
    check(not os.path.exists(marker), "the keys file's key command ran")
    with open(os.path.join(d, "keys"), "wb") as f:
        f.write(orig)
    # The honest chain: restore with the host's key, then the restored sandbox's own
    # snapshot (it continues the chain) uses the host's provider too.
    with Vm(None, restore=d, extra=["--key", spec]) as r:
        r.send_input(b"n")
        r.wait_output(f"stamped round 3 pages {COUNT}\n")
        r.snapshot("Diff")
    check(len(chain(d)["layers"]) == 3, f"chain after the restored snapshot: {chain(d)}")
    check(not os.path.exists(marker), "a key command from the chain ran")
    print("ok the restored sandbox snapshots with the host's provider")


def test_counter_rollback(tmp):
    """Issue 12 item 5: every layer has its own salt; a rolled-back or deleted layer-seq is
    refused with one line (the sandbox keeps running); the honest counter works again."""
    d = os.path.join(tmp, "chain")
    kek = os.path.join(tmp, "kek.pem")
    sh(f"'{KEYCMD}' --genkey '{kek}'")
    spec = f"key-cmd:'{KEYCMD}' '{kek}'"
    stamped_snapshot(d, spec)
    salts = []
    for path in layer_files(d):
        with open(path, "rb") as f:
            salts.append(f.read(128)[112:128])
    check(len(set(salts)) == len(salts) and all(x != bytes(16) for x in salts),
          f"layer salts are not distinct and non-zero: {[x.hex() for x in salts]}")
    seq = os.path.join(d, "layer-seq")
    # Under its filter the VMM moves the counter by create-only steps layer-seq.N (N the next
    # id, snapshot/DIGEST.md): the counter is the larger of layer-seq and its steps. A rollback
    # (a copied or restored old chain) takes the steps back too.
    def steps():
        return [f for f in os.listdir(d) if re.fullmatch(r"layer-seq\.\d{20}", f)]

    def drop_steps():
        for f in steps():
            os.unlink(os.path.join(d, f))

    with open(seq, "rb") as f:
        nxt = max([struct.unpack_from("<Q", f.read())[0]] + [int(f[10:]) for f in steps()])
    honest = struct.pack("<Q", nxt)
    honest += struct.pack("<I", zlib.crc32(honest))
    ids = [l["id"] for l in chain(d)["layers"]]
    check(nxt > max(ids), f"counter {nxt} is not above the chain's layers {ids}")
    rolled = struct.pack("<Q", 1)
    rolled += struct.pack("<I", zlib.crc32(rolled))
    # Restoring in place (it would continue the chain) is refused before the guest runs.
    with open(seq, "wb") as f:
        f.write(rolled)
    drop_steps()
    line = expect_fail(d, "is not above layer", key=spec)
    print(f"ok restore with a rolled-back layer-seq: {line}")
    os.unlink(seq)
    line = expect_fail(d, "layer-seq is missing", key=spec)
    print(f"ok restore with a deleted layer-seq: {line}")
    with open(seq, "wb") as f:
        f.write(honest)
    with Vm(None, restore=d, extra=["--key", spec]) as r:
        r.send_input(b"n")
        r.wait_output(f"stamped round 3 pages {COUNT}\n")
        for what, content in (("rolled back", rolled), ("deleted", None)):
            drop_steps()
            if content is None:
                os.unlink(seq)
            else:
                with open(seq, "wb") as f:
                    f.write(content)
            status, body = r.request("PUT", "/snapshot/create", {"snapshot_type": "Diff"},
                                     timeout=60)
            msg = body.get("fault_message", "") if isinstance(body, dict) else str(body)
            check(status != 200 and ("is not above layer" in msg or "is missing" in msg)
                  and "\n" not in msg, f"{what} counter: {status} {body}")
            check(r.alive(), f"a {what} counter stopped the sandbox")
            check(chain(d)["layers"][-1]["id"] == ids[-1], f"{what}: the chain moved on")
            print(f"ok {what} layer-seq: {msg}")
        with open(seq, "wb") as f:
            f.write(honest)
        r.snapshot("Diff")
    check(len(chain(d)["layers"]) == 3, f"honest counter: {chain(d)}")
    print("ok honest counter: the chain continues")


SECRET = b"cove-kvm-secret-disk-pattern-91c4"
OCHUNK, ODISK = 64 << 10, 1 << 20


def make_overlay(ovl, chunks):
    """An overlay (format version 2) whose top holds SECRET in the given chunks, as a guest's
    writes leave it: the test guests here have no virtio-blk driver."""
    nr = (ODISK + OCHUNK - 1) // OCHUNK
    bm = bytearray((nr + 7) // 8)
    with open(ovl, "wb") as f:
        f.truncate(ODISK)
        for c in chunks:
            f.seek(c * OCHUNK + 4000)
            f.write(SECRET)
            bm[c // 8] |= 1 << (c % 8)
    hdr = bytearray(52)
    hdr[0:8] = b"COVEOVLM"
    struct.pack_into("<IIQQIIII", hdr, 8, 2, OCHUNK, ODISK, nr, zlib.crc32(bytes(bm)), 0, 0, 0)
    struct.pack_into("<I", hdr, 48, zlib.crc32(bytes(hdr[:48])))
    with open(ovl + ".map", "wb") as f:
        f.write(bytes(hdr) + bytes(bm))


def files_holding(d, needle):
    hits = []
    for root, _, names in os.walk(d):
        for n in names:
            p = os.path.join(root, n)
            with open(p, "rb") as f:
                if needle in f.read():
                    hits.append(p)
    return hits


def sealed_disk_setup(tmp, chunks):
    """A key-cmd KEK, a base image and an overlay on it holding SECRET in `chunks`; returns
    (--snapshot-key spec, base path, overlay path)."""
    kek = os.path.join(tmp, "kek.pem")
    sh(f"'{KEYCMD}' --genkey '{kek}'")
    base, ovl = os.path.join(tmp, "base.img"), os.path.join(tmp, "disk.ovl")
    with open(base, "wb") as f:
        f.write(b"\x5a" * ODISK)
    make_overlay(ovl, chunks)
    return f"key-cmd:'{KEYCMD}' '{kek}'", base, ovl


def test_sealed_disk_layers(tmp):
    """Issue 12 item 4: an encrypted snapshot seals the frozen overlay layer (data and map);
    no plaintext remains; restore authenticates the map (a flipped byte: one line) and
    --verify every chunk (a flipped data byte: one line)."""
    d = os.path.join(tmp, "chain")
    spec, base, ovl = sealed_disk_setup(tmp, [0, 3, 15])
    check(files_holding(tmp, SECRET) == [ovl], "control: the pattern is not where it should be")
    with Vm(guest("counter"), extra=["--disk", f"{base},overlay={ovl}", "--snapshot-dir", d,
                                     "--snapshot-key", spec]) as vm:
        vm.wait_output("tick 2\n")
        vm.snapshot("Full")
        vm.stop(signal.SIGKILL)
    hits = files_holding(tmp, SECRET)
    check(not hits, f"plaintext disk data after an encrypted snapshot: {hits}")
    # The frozen layer was sealed into new files beside the top (X-sealed.ovl and its map: a
    # filtered VMM replaces no file) and linked into the chain; the plain top was emptied.
    check(os.path.getsize(ovl) == 0, f"the plain top still holds {os.path.getsize(ovl)} bytes")
    ovl = ovl[:-len(".ovl")] + "-sealed.ovl"
    with open(ovl + ".map", "rb") as f:
        m = f.read()
    check(struct.unpack_from("<I", m, 8)[0] == 3 and struct.unpack_from("<I", m, 36)[0] == 3,
          f"the frozen map is not sealed: {m[:48]!r}")
    with Vm(None, restore=d, extra=["--key", spec, "--verify", "--disk", base]) as r:
        r.wait_output("tick")
    print("ok sealed disk layer: no plaintext; restore --verify authenticates it")
    # One flipped byte in a sealed chunk: --verify refuses before the guest runs.
    with open(ovl, "r+b") as f:
        f.seek(3 * OCHUNK + 4005)
        b = f.read(1)
        f.seek(3 * OCHUNK + 4005)
        f.write(bytes([b[0] ^ 1]))
    line = expect_fail(d, "chunk 3 failed authentication", key=spec, extra=["--verify", "--disk", base])
    print(f"ok tampered disk chunk: {line}")
    with open(ovl, "r+b") as f:
        f.seek(3 * OCHUNK + 4005)
        f.write(b)
    # The map: clear a chunk's bit (it would read the base), both CRCs made right again.
    bad = bytearray(m)
    bad[152] &= ~1
    struct.pack_into("<I", bad, 32, zlib.crc32(bytes(bad[152:])))
    struct.pack_into("<I", bad, 148, zlib.crc32(bytes(bad[:148])))
    with open(ovl + ".map", "wb") as f:
        f.write(bytes(bad))
    line = expect_fail(d, "failed authentication", key=spec, extra=["--disk", base])
    print(f"ok tampered disk map: {line}")
    # A downgrade: the sealed layer replaced by a frozen layer in clear (valid CRCs).
    with open(ovl, "rb") as f:
        sealed_data = f.read()
    make_overlay(ovl, [0])
    with open(ovl + ".map", "r+b") as f:
        h = bytearray(f.read(52))
        struct.pack_into("<I", h, 36, 1)  # frozen
        struct.pack_into("<I", h, 48, zlib.crc32(bytes(h[:48])))
        f.seek(0)
        f.write(h)
    line = expect_fail(d, "in clear in an encrypted chain", key=spec, extra=["--disk", base])
    print(f"ok clear disk layer in an encrypted chain: {line}")
    with open(ovl, "wb") as f:
        f.write(sealed_data)
    with open(ovl + ".map", "wb") as f:
        f.write(m)
    reseal_all(d)
    with Vm(None, restore=d, extra=["--key", spec, "--disk", base]) as r:
        r.wait_output("tick")


def test_fork_encrypted(tmp):
    """Clones of an encrypted sandbox restore with the parent's host-side --snapshot-key; the
    parent's sealed disk layer stays readable from the clone's own chain (same data key)."""
    d = os.path.join(tmp, "chain")
    spec, base, ovl = sealed_disk_setup(tmp, [1, 2])
    with Vm(guest("counter"), extra=["--disk", f"{base},overlay={ovl}", "--snapshot-dir", d,
                                     "--snapshot-key", spec]) as vm:
        vm.wait_output("tick 2\n")
        status, body = vm.request("PUT", "/fork", {"count": 1}, timeout=60)
        check(status == 200 and len(body["clones"]) == 1, f"fork: {status} {body}")
        c = body["clones"][0]
        try:
            out = wait_file_bytes(c["console"], b"tick", 20)
            check(b"tick" in out, f"the encrypted clone printed nothing: {out[-200:]!r}")
            with open(f"/proc/{c['pid']}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            check(b"--key" in argv, f"the clone has no host-side --key: {argv}")
            # The clone's own chain (new chain id, the parent's data key).
            cv = Vm.__new__(Vm)
            cv.sock = c["api_sock"]
            status, body2 = cv.request("PUT", "/snapshot/create", {"snapshot_type": "Full"},
                                       timeout=60)
            check(status == 200, f"clone snapshot: {status} {body2}")
        finally:
            try:
                os.kill(c["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        check(not files_holding(tmp, SECRET), "plaintext disk data after the fork")
        with Vm(None, restore=c["snapshot_dir"], extra=["--key", spec, "--verify", "--disk", base]) as r:
            r.wait_output("tick")
        shutil.rmtree(c["snapshot_dir"], ignore_errors=True)
        if os.path.exists(c["console"]):
            os.unlink(c["console"])
    print("ok fork of an encrypted sandbox; the clone's chain reads the parent's sealed layer")


def test_pkcs11(tmp):
    for tool in ("softhsm2-util", "pkcs11-tool"):
        check(shutil.which(tool), f"{tool} is missing (tools/setup installs softhsm2 and opensc)")
    check(os.path.exists(SOFTHSM), f"{SOFTHSM} is missing (softhsm2)")
    conf = os.path.join(tmp, "softhsm2.conf")
    os.mkdir(os.path.join(tmp, "tokens"))
    with open(conf, "w") as f:
        f.write(f"directories.tokendir = {tmp}/tokens\nobjectstore.backend = file\nlog.level = ERROR\n")
    env = {"SOFTHSM2_CONF": conf, "COVE_PKCS11_PIN": "1234"}
    e = dict(os.environ, **env)
    sh("softhsm2-util --init-token --free --label cove --pin 1234 --so-pin 5678", env=e)
    sh(f"pkcs11-tool --module {SOFTHSM} --login --pin 1234 --keygen --key-type AES:32 "
       f"--label kek1 --token-label cove", env=e)
    d = os.path.join(tmp, "chain-p11")
    spec = "pkcs11:token=cove;object=kek1"
    stamped_snapshot(d, spec, env=env)
    restore_continues(d, spec, env=env)
    print("ok pkcs11: snapshot and restore with a SoftHSM2 token")
    sh(f"pkcs11-tool --module {SOFTHSM} --login --pin 1234 --token-label cove --delete-object "
       f"--type secrkey --label kek1", env=e)
    line = expect_fail(d, "the KEK may be revoked", key=spec, env=env)
    print(f"ok pkcs11 revoked: {line}")


def run_all():
    run_each((test_key_cmd, test_lazy_tamper_stops_vm, test_keys_file_cannot_name_provider,
              test_counter_rollback, test_sealed_disk_layers, test_fork_encrypted, test_pkcs11),
             "cove-crypt-")


if __name__ == "__main__":
    main(run_all)
