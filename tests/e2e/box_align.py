#!/usr/bin/env python3
"""e2e: the KVM box boots whatever the byte lengths of its initramfs segments.

For each length mod 4, a gzip-compressed cpio segment of exactly that length (the gzip header's
file name is varied to get it) is followed by an uncompressed cpio segment; the box must reach
its /init and read a file from each. The archives are written here, not by kvm-box, and the
check is the boot itself, so kvm-box's own padding is not trusted.
"""
import gzip
import io
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpio_newc(files):
    """A newc cpio archive of {name: bytes} (regular files, mode 0644) plus directories."""
    out = io.BytesIO()
    ino = 500

    def entry(name, mode, body):
        nonlocal ino
        ino += 1
        nb = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(body), 0, 0, 0, 0, len(nb), 0)
        hdr = b"070701" + b"".join(b"%08X" % v for v in fields)
        out.write(hdr + nb)
        out.write(b"\0" * (-(len(hdr) + len(nb)) % 4))
        out.write(body)
        out.write(b"\0" * (-len(body) % 4))

    dirs = sorted({os.path.dirname(n) for n in files if os.path.dirname(n)})
    for d in dirs:
        entry(d, 0o040755, b"")
    for name, body in sorted(files.items()):
        entry(name, 0o100644, body)
    entry("TRAILER!!!", 0, b"")
    return out.getvalue()


def gzip_of_length_mod4(data, want):
    """gzip data with a header file name chosen so that len(result) % 4 == want."""
    for n in range(1, 16):
        buf = io.BytesIO()
        with gzip.GzipFile(filename="x" * n, fileobj=buf, mode="wb", mtime=0) as g:
            g.write(data)
        if len(buf.getvalue()) % 4 == want:
            return buf.getvalue()
    raise RuntimeError("no file name length gave the wanted gzip length")


def main():
    if not shutil.which("qemu-system-x86_64"):
        print("SKIP: qemu-system-x86_64 is missing (tools/setup installs it)")
        return 77
    failed = 0
    tmp = tempfile.mkdtemp(prefix="box-align-")
    try:
        for r in range(4):
            gz = gzip_of_length_mod4(cpio_newc({"align/gz": f"gz-{r}\n".encode()}), r)
            raw = cpio_newc({"align/raw": f"raw-{r}\n".encode()})
            gz_path = os.path.join(tmp, f"seg{r}.cpio.gz")
            raw_path = os.path.join(tmp, f"seg{r}.cpio")
            with open(gz_path, "wb") as f:
                f.write(gz)
            with open(raw_path, "wb") as f:
                f.write(raw)
            assert os.path.getsize(gz_path) % 4 == r
            p = subprocess.run([os.path.join(ROOT, "tools", "kvm-box"), "--timeout", "180",
                                "--segment", gz_path, "--segment", raw_path, "--",
                                "cat", "/align/gz", "/align/raw"],
                               capture_output=True, text=True)
            ok = p.returncode == 0 and f"gz-{r}" in p.stdout and f"raw-{r}" in p.stdout
            print(f"{'ok' if ok else 'FAIL'}: gzip segment of {len(gz)} bytes "
                  f"(length mod 4 = {r}) then an uncompressed cpio: kvm-box status "
                  f"{p.returncode}")
            if not ok:
                failed += 1
                sys.stdout.write(p.stdout[-2000:])
                sys.stdout.write(p.stderr[-2000:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"box_align: {4 - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
