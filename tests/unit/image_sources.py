#!/usr/bin/env python3
"""cove image import from each kind of source, with the real tools that make them (issue 32):
the e2e suite's OCI images (tests/e2e/make-oci-images: umoci, skopeo, musl-gcc), imported as an
OCI archive, as an OCI layout directory (a cache hit: the same manifest digest), as a
docker-archive, and from a private containers-storage that skopeo filled; an archive whose
entries climb out of its directory is refused with one line. Needs root (an import keeps the
image's owners); exits 77 saying what is missing otherwise.
usage: image_sources.py COVE SOURCE_ROOT"""
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

COVE, ROOT = sys.argv[1], sys.argv[2]


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(77)


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}")
        sys.exit(1)


def main():
    if os.geteuid() != 0:
        skip("cove image import keeps the image's owners: run as root")
    for t in ("umoci", "skopeo", "musl-gcc", "mkfs.ext4"):
        if not shutil.which(t, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
            skip(f"{t} is missing (tools/setup installs it)")
    tmp = tempfile.mkdtemp(prefix="cove-image-sources-")
    try:
        inputs = os.path.join(tmp, "in")
        r = subprocess.run([os.path.join(ROOT, "tests/e2e/make-oci-images"), inputs],
                           capture_output=True, text=True)
        check(r.returncode == 0, f"make-oci-images: {r.stderr[-800:]}")
        state = os.path.join(tmp, "state")
        cs = os.path.join(tmp, "cs")
        os.makedirs(cs)
        conf = os.path.join(cs, "storage.conf")
        with open(conf, "w") as f:
            f.write(f'[storage]\ndriver = "vfs"\nrunroot = "{cs}/run"\ngraphroot = "{cs}/root"\n')
        env = dict(os.environ, COVE_STATE_DIR=state, CONTAINERS_STORAGE_CONF=conf)

        def imp(src, *opts):
            r = subprocess.run([COVE, "image", "import", src, "--json", *opts],
                               capture_output=True, text=True, env=env)
            check(r.returncode == 0, f"cove image import {src}: {r.returncode} {r.stderr!r}")
            return json.loads(r.stdout)

        musl = os.path.join(inputs, "musl.oci.tar")
        a = imp(f"oci-archive:{musl}:latest")
        check(not a["cached"] and a["name"] == "musl:latest" and a["layers"] == 2, f"{a}")
        lay = os.path.join(tmp, "layout")
        with tarfile.open(musl) as t:
            t.extractall(lay)
        b = imp(f"oci:{lay}:latest", "--name", "from-layout")
        check(b["cached"] and b["digest"] == a["digest"], f"layout of the same image: {b}")
        c = imp(os.path.join(inputs, "distroless.docker.tar"))
        check(not c["cached"] and c["name"] == "localhost/distroless:latest", f"{c}")
        r = subprocess.run(["skopeo", "copy", "--quiet", f"oci-archive:{musl}:latest",
                            "containers-storage:localhost/musl:cs"], capture_output=True,
                           text=True, env=env)
        check(r.returncode == 0, f"skopeo into containers-storage: {r.stderr[-600:]}")
        d = imp("containers-storage:localhost/musl:cs")
        check(d["name"] == "localhost/musl:cs" and d["layers"] == 2, f"containers-storage: {d}")
        insp = {}
        for name in ("musl:latest", "localhost/musl:cs"):
            r = subprocess.run([COVE, "image", "inspect", name], capture_output=True, text=True,
                               env=env)
            check(r.returncode == 0, f"inspect {name}: {r.stderr!r}")
            insp[name] = json.loads(r.stdout)["config"]
        check(insp["musl:latest"] == insp["localhost/musl:cs"],
              f"the same image through containers-storage has another config: {insp}")
        # An archive whose entry climbs out: refused, nothing written beside the state root.
        evil = os.path.join(tmp, "evil.tar")
        with tarfile.open(evil, "w") as t:
            ti = tarfile.TarInfo("../../escaped")
            ti.size = 1
            t.addfile(ti, __import__("io").BytesIO(b"x"))
        r = subprocess.run([COVE, "image", "import", evil], capture_output=True, text=True,
                           env=env)
        check(r.returncode == 1 and "'..'" in r.stderr and r.stderr.count("\n") == 1,
              f"an archive with ../: {r.returncode} {r.stderr!r}")
        check(not os.path.exists(os.path.join(tmp, "escaped")) and
              not os.path.exists(os.path.join(state, "escaped")), "an entry escaped")
        print(f"PASS: image sources: OCI archive {a['ms']} ms, layout (cache hit) {b['ms']} ms, "
              f"docker-archive {c['ms']} ms, containers-storage via skopeo {d['ms']} ms; "
              f"an archive with '..' refused")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
