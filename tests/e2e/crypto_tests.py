"""e2e encrypted snapshots (issue 7), in the KVM box: a Linux guest snapshotted every second under
a data key wrapped by a SoftHSM2 (PKCS#11) key; restore decrypts pages on first touch
(userfaultfd) and the count goes on; no guest plaintext in the layers; rekey to a second key;
a tampered page fails --verify; the deleted key makes restore fail with one line."""
import os
import shutil
import subprocess
import time

import box_tests as bt
from covetest import Failure, chain_file, check, http_json, reseal_all
from snapshot_tests import COUNTER, counts, fresh, kill, layers, wait_file

SOFTHSM = "/usr/lib/softhsm/libsofthsm2.so"
PLAIN_MARK = b"Linux version"  # the guest kernel's banner, in its memory (log buffer)


def hsm_env(tmp):
    conf = os.path.join(tmp, "softhsm2.conf")
    os.makedirs(os.path.join(tmp, "tokens"), exist_ok=True)
    with open(conf, "w") as f:
        f.write(f"directories.tokendir = {tmp}/tokens\nobjectstore.backend = file\n"
                "log.level = ERROR\n")
    return dict(os.environ, SOFTHSM2_CONF=conf, COVE_PKCS11_PIN="1234")


def sh(args, env):
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    check(r.returncode == 0, f"{args}: {r.returncode} {r.stderr.strip()}")


def p11(env, *args):
    sh(["pkcs11-tool", "--module", SOFTHSM, "--login", "--pin", "1234", "--token-label", "cove"]
       + list(args), env)


def restore_counts(d, con, env, extra=()):
    fresh(con)
    r = subprocess.Popen([bt.COVE, "restore", d, "--console", con] + list(extra),
                         stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        text = wait_file(con, lambda t: len(counts(t)) >= 4, 120, "the restored guest to count", r)
    except Failure as e:
        # What restored, from which layers: the VMM's log and the chain it read.
        kill(r)
        err = r.stderr.read().decode(errors="replace")[-1500:]
        chain = [(x.get("id"), x.get("parent"), x.get("full"), x.get("present"), x.get("stored"))
                 for x in layers(d)]
        raise Failure(f"{e}; cove restore stderr {err!r}; chain (id, parent, full, present, "
                      f"stored) {chain}")
    finally:
        kill(r)
    c = counts(text)
    check(c == list(range(c[0], c[0] + len(c))) and c[0] > 1, f"restored counts {c}")
    return c


def restore_fails(d, want, env, extra=()):
    r = subprocess.run([bt.COVE, "restore", d] + list(extra), capture_output=True, text=True,
                       env=env, timeout=120, stdin=subprocess.DEVNULL)
    check(r.returncode == 1 and want in r.stderr and r.stderr.count("\n") == 1 and not r.stdout,
          f"want exit 1 and one line with {want!r}: {r.returncode} {r.stderr!r} {r.stdout[-200:]!r}")
    return r.stderr.strip()


# Pages written all over guest RAM while the guest counts, so the encrypted Diffs are not all
# small, and pages written between a snapshot's pre-copy and its pause (added after the
# pre-copy's extents, wherever they lie) are likelier: the sealer once refused such extents as
# out of order, and every encrypted Diff of a jailed run in CI failed with EINVAL.
CHURN = ("(while :; do dd if=/dev/urandom of=/tmp/churn bs=4k count=256 2>/dev/null; "
         "rm -f /tmp/churn; sleep 0.1; done) & " + COUNTER)


def test_encrypted_snapshots_pkcs11():
    tmp, d, plain = "/tmp/enc-hsm", "/tmp/enc-chain", "/tmp/enc-plain"
    con, con2, sock = "/tmp/enc.out", "/tmp/enc.restored", "/tmp/enc.api"
    fresh(tmp, d, plain, con, con2, sock, con + ".plain", sock + ".plain")
    env = hsm_env(tmp)
    sh(["softhsm2-util", "--init-token", "--free", "--label", "cove", "--pin", "1234",
        "--so-pin", "5678"], env)
    p11(env, "--keygen", "--key-type", "AES:32", "--label", "kek1")
    p11(env, "--keygen", "--key-type", "AES:32", "--label", "kek2")
    run = [bt.COVE, "run", "--kernel", bt.BZIMAGE, "--initrd", bt.INITRD, "--mem", "256M",
           "--cmdline", bt.cmdline_for(CHURN), "--snapshot-dir", d, "--snapshot-interval", "1s",
           "--snapshot-key", "pkcs11:token=cove;object=kek1", "--api-sock", sock,
           "--console", con, "--log-level", "info"]
    p = subprocess.Popen(run, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        wait_file(con, lambda t: len(counts(t)) >= 3, bt.BOOT_TIMEOUT, "the guest to count", p)
        # At least one layer must be committed after the counting began (sealing 256 MiB is
        # slow in the box: every layer so far may predate the first count).
        want = max(3, len(layers(d)) + 1)
        end = time.monotonic() + 120
        while len(layers(d)) < want and time.monotonic() < end and p.poll() is None:
            time.sleep(0.2)
        if len(layers(d)) < want:
            # Why no layer came: did cove exit, and what did it log (snapshot failures)?
            rc = p.poll()
            kill(p)
            err = p.stderr.read().decode(errors="replace")[-2000:]
            raise Failure(f"{len(layers(d))} of {want} layers after 120 s (cove "
                          f"{'exited ' + str(rc) if rc is not None else 'still running'}); "
                          f"chain: {layers(d)}; cove stderr {err!r}")
    finally:
        kill(p)

    # The control for the plaintext check: the same guest, snapshotted without a key.
    prun = [a for a in run if a not in ("--snapshot-key", "pkcs11:token=cove;object=kek1",
                                        "--snapshot-interval", "1s")]
    prun[prun.index(d)] = plain
    prun[prun.index(con)] = con + ".plain"
    prun[prun.index(sock)] = sock + ".plain"
    p = subprocess.Popen(prun, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        wait_file(con + ".plain", lambda t: len(counts(t)) >= 3, bt.BOOT_TIMEOUT,
                  "the plain control guest to count", p)
        status, body = http_json(sock + ".plain", "PUT", "/snapshot/create",
                                 {"snapshot_type": "Full"}, timeout=120)
        check(status == 200, f"plain control snapshot: {status} {body}")
    finally:
        kill(p)

    def holds_mark(dirname):
        for l in layers(dirname):
            with open(os.path.join(dirname, l["mem"]), "rb") as f:
                if PLAIN_MARK in f.read():
                    return True
        return False
    check(holds_mark(plain), "control: the plain layer lacks the kernel banner; the check is void")
    check(not holds_mark(d), "an encrypted layer holds the guest kernel banner in clear")
    k1, k2 = "pkcs11:token=cove;object=kek1", "pkcs11:token=cove;object=kek2"
    # The provider comes from the host: without --key the chain is refused.
    line = restore_fails(d, "give its key provider with --key", env)
    print(f"    no --key: {line}")
    c = restore_counts(d, con2, env, ["--key", k1])
    print(f"    encrypted chain of {len(layers(d))} layers; lazy restore counts {c[0]}..{c[-1]}")

    # Rekey to kek2 and delete kek1: the chain still restores.
    sh([bt.COVE, "rekey", d, "--from-pkcs11", k1, "--to-pkcs11", k2], env)
    p11(env, "--delete-object", "--type", "secrkey", "--label", "kek1")
    c = restore_counts(d, con2, env, ["--key", k2])
    print(f"    rekeyed to kek2, kek1 deleted: restore counts {c[0]}..{c[-1]}")

    # One flipped byte in a stored page of the newest layer that stores one (a layer the
    # restored sandbox wrote may hold none): --verify refuses before the guest runs.
    import struct
    for entry in reversed(layers(d)):
        lay = os.path.join(d, entry["mem"])
        with open(lay, "rb") as f:
            hdr = f.read(4096)
            nr_pages, bm_off, bm_len, data_off = struct.unpack_from("<QQQQ", hdr, 40)
            f.seek(bm_off + bm_len)
            stored = f.read(bm_len)
        page = next((w * 8 + b for w, byte in enumerate(stored) for b in range(8)
                     if byte >> b & 1), None)
        if page is not None:
            break
    check(page is not None, f"no layer of {d} stores a page")
    shutil.copy2(lay, lay + ".orig")
    cf = chain_file(d)
    shutil.copy2(cf, cf + ".orig")
    with open(lay, "r+b") as f:
        f.seek(data_off + page * 4096 + 7)
        b = f.read(1)
        f.seek(data_off + page * 4096 + 7)
        f.write(bytes([b[0] ^ 0x20]))
    # The chain's digest of the file refuses it first ("SHA-256 does not match"); an attacker
    # who rewrites the chain file too meets the page's GCM tag.
    line = restore_fails(d, "SHA-256 does not match", env, ["--key", k2, "--verify"])
    print(f"    tampered page: {line}")
    reseal_all(d)
    line = restore_fails(d, "failed authentication", env, ["--key", k2, "--verify"])
    print(f"    tampered page, chain digests rewritten: {line}")
    os.replace(lay + ".orig", lay)
    os.replace(cf + ".orig", cf)

    # Delete kek2: the KEK is gone, restore says so in one line.
    p11(env, "--delete-object", "--type", "secrkey", "--label", "kek2")
    line = restore_fails(d, "the KEK may be revoked", env, ["--key", k2])
    print(f"    revoked: {line}")
    fresh(tmp, d, plain, con, con2, sock, con + ".plain", sock + ".plain")


TESTS = [test_encrypted_snapshots_pkcs11]
