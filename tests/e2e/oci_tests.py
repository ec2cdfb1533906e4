"""OCI images (issue 32) on the real Linux guest in the KVM box: cove image import of an OCI
archive and a docker-archive built locally on the host (tests/e2e/make-oci-images, no registry),
the second import a cache hit, and sandboxes made from them with cove create --image: cove's
init initramfs switches into the image's root and keeps cove-init on a tmpfs at /.cove; cove
exec runs the image's own programs as its User, in its WorkingDir, with its Env; an Entrypoint
is the sandbox's main process, restarted when it exits or ending the VM (--on-exit stop)."""
import json
import os
import socket
import subprocess
import time
import urllib.request

import box_tests as bt

COVE = bt.COVE
STATE = "/tmp/cove-oci"
RUN = "/tmp/cove-ocirun"
ENV = dict(os.environ, COVE_STATE_DIR=STATE, COVE_RUN_DIR=RUN, COVE_GUEST_DIR="/work")
INPUTS = "/work/oci"


def cove(*args, timeout=300):
    try:
        r = subprocess.run([COVE] + list(args), capture_output=True, timeout=timeout, env=ENV)
    except subprocess.TimeoutExpired:
        raise bt.Failure(f"cove {' '.join(args)[:120]} timed out after {timeout} s")
    return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")


def tail(name, f="vmm.log", n=1500):
    try:
        with open(os.path.join(STATE, name, f), errors="replace") as fh:
            return fh.read()[-n:]
    except OSError as e:
        return f"({e})"


def console(name):
    return tail(name, "console.log", 6000)


def need_inputs():
    if not os.path.exists(os.path.join(INPUTS, "musl.oci.tar")):
        raise bt.Skip("no OCI images (tests/e2e/run builds them with tests/e2e/make-oci-images)")


def imported(source, *opts):
    t0 = time.monotonic()
    rc, out, err = cove("image", "import", source, "--json", *opts)
    bt.check(rc == 0, f"cove image import {source}: rc={rc} {err.strip()!r}")
    import json_shapes  # docs/CLI.md's shape "image import"
    doc = json.loads(out)
    bad = json_shapes.problems(json_shapes.load("/work/CLI.md"), "image import", doc)
    bt.check(not bad, f"cove image import --json does not fit its shape: {bad}")
    return doc, time.monotonic() - t0


def create(name, image, *opts):
    t0 = time.monotonic()
    rc, out, err = cove("create", name, "--image", image, "--snapshot-every", "off", *opts)
    bt.check(rc == 0, f"cove create {name} --image {image}: rc={rc} {err.strip()!r}; vmm.log "
             f"{tail(name)!r}")
    return time.monotonic() - t0


def test_oci_musl_image():
    """An OCI archive (two layers, the second whiting out a file) of a musl userland: imported,
    then imported again as a cache hit; a sandbox from it runs a musl-linked program, and cove
    exec runs as the image's User (app, from its /etc/passwd), in its WorkingDir, with its
    Env. cove-init lives on /.cove (a tmpfs), not in the image. The sandbox stops and its next
    exec restores it."""
    need_inputs()
    subprocess.run(["rm", "-rf", STATE, RUN])
    src = "oci-archive:" + os.path.join(INPUTS, "musl.oci.tar") + ":latest"
    rc, out, err = cove("image", "import", os.path.join(INPUTS, "musl.oci.tar"))
    bt.check(rc == 1 and "name one" in err,
             f"an archive of two images, none named: rc={rc} {out!r} {err!r}")
    first, t1 = imported(src)
    bt.check(not first["cached"] and first["layers"] == 2 and first["name"] == "musl:latest",
             f"first import: {first}")
    again, t2 = imported(src)
    bt.check(again["cached"] and again["layers"] == 0 and again["digest"] == first["digest"],
             f"second import: {again}")
    print(f"    import: {t1:.2f} s ({first['entries']} entries, {first['layers']} layers), "
          f"again {t2:.2f} s: a cache hit, nothing unpacked (cove image import says "
          f"{again['ms']} ms)")
    took = create("m1", "musl:latest")
    rc, out, err = cove("exec", "m1", "--", "hello-musl")
    bt.check(rc == 0 and out == "hello from musl\n",
             f"the musl program: rc={rc} {out!r} {err!r}; console {console('m1')!r}")
    rc, out, err = cove("exec", "m1", "--", "sh", "-c",
                        "id -u; id -g; pwd; echo $OCI_GREETING; cat layer2; "
                        "test -e /etc/remove-me || echo whiteout; ls /.cove; "
                        "grep ' /.cove ' /proc/mounts | cut -d' ' -f3")
    want = ["1000", "1000", "/srv/app", "musl", "second", "whiteout", "cove-fetch", "cove-init",
            "tmpfs"]
    bt.check(rc == 0 and out.split() == want, f"exec defaults: rc={rc} {out!r} {err!r}")
    rc, out, err = cove("exec", "m1", "--user", "root", "--cwd", "/", "--env",
                        "OCI_GREETING=mine", "--", "sh", "-c", "id -u; pwd; echo $OCI_GREETING")
    bt.check(rc == 0 and out.split() == ["0", "/", "mine"],
             f"the caller's --user/--cwd/--env win: {out!r} {err!r}")
    print(f"    cove create --image musl:latest: {took:.1f} s; hello-musl ran; exec as uid "
          f"1000 in /srv/app with OCI_GREETING=musl; /.cove is a tmpfs with cove-init")
    rc, out, err = cove("stop", "m1")
    bt.check(rc == 0, f"cove stop m1: rc={rc} {err!r}")
    rc, out, err = cove("exec", "m1", "--", "hello-musl")
    bt.check(rc == 0 and out == "hello from musl\n", f"after the stop: rc={rc} {out!r} {err!r}")
    # The image's names: rm keeps the sandbox working (it holds a hard link of the root).
    rc, out, err = cove("image", "rm", "musl:latest")
    bt.check(rc == 0, f"cove image rm: rc={rc} {err!r}")
    rc, out, err = cove("image", "ls", "--json")
    bt.check(rc == 0 and json.loads(out)["images"] == [], f"cove image ls after rm: {out!r}")
    rc, out, err = cove("stop", "m1")
    rc, out, err = cove("exec", "m1", "--", "hello-musl")
    bt.check(rc == 0 and out == "hello from musl\n",
             f"after cove image rm and a stop: rc={rc} {out!r} {err!r}")
    print("    stopped and reconnected; cove image rm left the sandbox working")
    cove("rm", "m1")


def _get(port, timeout=60):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                return r.read().decode()
        except OSError as e:
            last = e
            time.sleep(0.5)
    raise bt.Failure(f"GET through cove forward: {last}")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_oci_distroless_entrypoint():
    """A docker-archive of one static program (no shell, no /etc/passwd): its Entrypoint is an
    HTTP server, the sandbox's main process, as the numeric User 65532 in WorkingDir /data;
    cove forward reaches it. cove exec runs the program itself with the image's defaults."""
    need_inputs()
    data, t = imported("docker-archive:" + os.path.join(INPUTS, "distroless.docker.tar"))
    bt.check(data["name"] == "localhost/distroless:latest" and data["layers"] == 1,
             f"import: {data}")
    took = create("d1", "localhost/distroless:latest")
    rc, out, err = cove("exec", "d1", "--", "/oci-server", "--whoami")
    bt.check(rc == 0 and out.strip() == "uid=65532 gid=65532 cwd=/data greeting=distroless",
             f"exec in the distroless sandbox: rc={rc} {out!r} {err!r}")
    port = _free_port()
    fwd = subprocess.Popen([COVE, "forward", "d1", f"{port}:8080"], env=ENV,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        body = _get(port)
    finally:
        fwd.terminate()
        fwd.wait(timeout=30)
    bt.check(body == "oci-server uid=65532 cwd=/data\n",
             f"the Entrypoint's answer: {body!r}; console {console('d1')!r}")
    print(f"    import {t:.2f} s; cove create --image (docker-archive) {took:.1f} s; the "
          f"Entrypoint answered through cove forward as uid 65532 in /data")
    cove("rm", "d1")


def test_oci_main_process_exit():
    """The main process exits: by default cove-init starts it again (after 1 s, then 2 s, 4 s);
    with --on-exit stop the VM ends with it."""
    need_inputs()
    data, t = imported("oci-archive:" + os.path.join(INPUTS, "musl.oci.tar") + ":exit")
    bt.check(data["name"] == "musl:exit", f"import: {data}")
    create("r1", "musl:exit", "--cold")  # a template's build would hold the restarts
    time.sleep(8)
    rc, out, err = cove("exec", "r1", "--", "sh", "-c", "wc -l < /tmp/main-runs")
    bt.check(rc == 0 and out.strip().isdigit() and int(out) >= 3,
             f"restarts: rc={rc} {out!r} {err!r}; console {console('r1')!r}")
    bt.check("restarting it in" in console("r1"), f"console: {console('r1')!r}")
    runs = int(out)
    cove("rm", "r1")
    rc, out, err = cove("create", "r2", "--image", "musl:exit", "--on-exit", "stop",
                        "--snapshot-every", "off")
    deadline = time.monotonic() + 120
    state = None
    while time.monotonic() < deadline:
        rc2, out2, err2 = cove("ls", "--json")
        state = {s["name"]: s.get("state") for s in json.loads(out2)["sandboxes"]}.get("r2")
        if state != "running":
            break
        time.sleep(1)
    bt.check(state != "running" and "exit 3" in console("r2"),
             f"--on-exit stop: state {state!r} (create rc={rc} {err.strip()[-300:]!r}); "
             f"console {console('r2')!r}")
    print(f"    restart: {runs} runs in 8 s (1 s, 2 s, 4 s apart); --on-exit stop: the VM "
          f"ended (cove create rc={rc}, cove ls says {state})")
    cove("rm", "r2")


def _exec_out(name, script):
    rc, out, err = cove("exec", name, "--", "sh", "-c", script)
    bt.check(rc == 0, f"cove exec {name} {script!r}: rc={rc} {out!r} {err!r}; console "
             f"{console(name)[-1500:]!r}")
    return out


def test_oci_image_templates():
    """Images and templates: the default cove create --image builds the implicit template of
    the image once and the next create restores it; cove template create --image with a setup
    command, and two sandboxes from it (the setup's file in both, a write in one not in the
    other, the image's exec defaults in each); a fork of an image's sandbox; removing the
    image, the template and the fork's parent breaks none of the sandboxes made from them."""
    need_inputs()
    imported("oci-archive:" + os.path.join(INPUTS, "musl.oci.tar") + ":latest")
    t0 = time.monotonic()
    rc, out, err = cove("create", "w1", "--image", "musl:latest", "--snapshot-every", "off")
    t_first = time.monotonic() - t0
    bt.check(rc == 0 and "building the implicit template" in err and "implicit template" in out,
             f"first warm create: rc={rc} {out!r} {err!r}")
    t0 = time.monotonic()
    rc, out, err = cove("create", "w2", "--image", "musl:latest", "--snapshot-every", "off")
    t_second = time.monotonic() - t0
    bt.check(rc == 0 and "building" not in err and "from the implicit template" in out,
             f"second warm create: rc={rc} {out!r} {err!r}")
    t0 = time.monotonic()
    rc, out, err = cove("create", "c1", "--image", "musl:latest", "--cold", "--snapshot-every",
                        "off")
    t_cold = time.monotonic() - t0
    bt.check(rc == 0 and "template" not in out, f"cold create: rc={rc} {out!r} {err!r}")
    for n in ("w1", "w2", "c1"):
        got = _exec_out(n, "id -u; pwd; echo $OCI_GREETING; hostname; hello-musl").split()
        bt.check(got == ["1000", "/srv/app", "musl", n, "hello", "from", "musl"],
                 f"{n}: exec defaults and hostname: {got}")
    ids = {n: _exec_out(n, "cat /proc/sys/kernel/random/boot_id").strip()
           for n in ("w1", "w2")}
    bt.check(ids["w1"] != ids["w2"], f"two warm creates share a boot_id: {ids}")
    print(f"    cove create --image: first {t_first:.1f} s (builds the implicit template), "
          f"second {t_second:.1f} s (restores it), --cold {t_cold:.1f} s")

    # An explicit template from the image, with a setup command run as root.
    rc, out, err = cove("template", "create", "mt", "--image", "musl:latest", "--run",
                        "echo set-up > /srv/app/setup-file && chown 1000 /srv/app/setup-file")
    bt.check(rc == 0, f"cove template create --image: rc={rc} {out!r} {err!r}")
    for n in ("t1", "t2"):
        rc, out, err = cove("create", n, "--from", "mt", "--snapshot-every", "off")
        bt.check(rc == 0, f"cove create {n} --from mt: rc={rc} {out!r} {err!r}")
    _exec_out("t1", "echo mine > /srv/app/t1-only")
    got = _exec_out("t2", "cat /srv/app/setup-file; id -u; test -e /srv/app/t1-only || "
                    "echo not-shared; hostname").split()
    bt.check(got == ["set-up", "1000", "not-shared", "t2"], f"t2: {got}")
    # Neither the image nor the template is needed any more by what was made from them.
    rc, out, err = cove("template", "rm", "mt")
    bt.check(rc == 0, f"cove template rm mt: rc={rc} {err!r}")
    rc, out, err = cove("image", "rm", "musl:latest")
    bt.check(rc == 0, f"cove image rm: rc={rc} {err!r}")
    rc, out, err = cove("fork", "w1", "f1")
    bt.check(rc == 0, f"cove fork w1 f1: rc={rc} {out!r} {err!r}")
    cove("rm", "w1")
    for n in ("t1", "f1"):
        rc, out, err = cove("stop", n)
        bt.check(rc == 0, f"cove stop {n}: rc={rc} {err!r}")
    got = _exec_out("t1", "cat /srv/app/t1-only /srv/app/setup-file; id -u").split()
    bt.check(got == ["mine", "set-up", "1000"], f"t1 after template rm, image rm, stop: {got}")
    got = _exec_out("f1", "id -u; hostname; hello-musl").split()
    bt.check(got == ["1000", "f1", "hello", "from", "musl"],
             f"f1 after its parent's rm and a stop: {got}")
    print("    template mt from the image with a setup command: t1, t2 made from it (its file "
          "in both, t1's write not in t2); after cove template rm, cove image rm and cove rm "
          "of the fork's parent, t1 and the fork f1 stop and restore")
    for n in ("w2", "c1", "t1", "t2", "f1"):
        cove("rm", n)


TESTS = [test_oci_musl_image, test_oci_distroless_entrypoint, test_oci_main_process_exit,
         test_oci_image_templates]
