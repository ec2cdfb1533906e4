"""The Debian Python image of issue 32 under podman with cove-oci (issue 33), a module of its own
beside `containers` (each box run stays well inside its 900 s): podman's pull of the 170 MiB
archive alone takes over two minutes under the box's emulated CPU."""
import os
import time

import box_tests as bt
import containers_tests as ct

DEBIAN_OCI = "/work/oci-deb/debian.oci.tar"


def test_podman_debian_python():
    """The Debian Python image (issue 32's, tests/e2e/oci-from-tree) under podman with
    cove-oci: `python3 -c 'print(6*7)'` prints 42. The first run makes the root's disk (kept
    by the root's digest) and its implicit template; a second run of the same image makes no
    disk and restores the template."""
    ct.need_inputs()
    if not os.path.exists(DEBIAN_OCI):
        raise bt.Failure(f"no {DEBIAN_OCI}: tests/e2e/run makes it from the Debian image "
                         f"(guest/image/build, debugfs); its output says why it did not")
    ct.cgroups()
    env = ct.podman_env()

    def podman(*args, timeout=600, check_rc=None):
        return ct.run(["podman"] + list(args), timeout=timeout, env=env, check_rc=check_rc)

    t0 = time.monotonic()
    rc, out, err = podman("pull", "oci-archive:" + DEBIAN_OCI)
    bt.check(rc == 0, f"podman pull {DEBIAN_OCI}: rc={rc} {err[-1500:]!r}")
    image_id = out.strip().splitlines()[-1]
    print(f"    podman pull of the Debian Python archive: {time.monotonic() - t0:.1f} s")
    before = ct.image_cache_roots()
    times = []
    for n in range(2):
        t0 = time.monotonic()
        rc, out, err = podman("run", "--rm", "--pull", "never", "--network", "none", image_id,
                              "python3", "-c", "print(6*7)")
        times.append(time.monotonic() - t0)
        bt.check(rc == 0 and out == "42\n" and err == "",
                 f"podman run python3 (run {n + 1}): rc={rc} out={out!r} err={err[-1500:]!r}")
        roots = ct.image_cache_roots()
        bt.check(len(roots) == len(before) + 1,
                 f"after run {n + 1}: want one new root disk, have {roots} (before: {before})")
    # The user and cwd of the image reach the process; the disk is shared, not the settings.
    rc, out, err = podman("run", "--rm", "--pull", "never", "--network", "none", "--user",
                          "root", "--workdir", "/tmp", image_id, "sh", "-c",
                          "id -u; pwd; python3 -c 'import sys; print(sys.version_info[:2])'")
    bt.check(rc == 0 and out.split("\n")[:3] == ["0", "/tmp", "(3, 11)"],
             f"podman run --user root --workdir /tmp: rc={rc} {out!r} {err[-800:]!r}")
    bt.check(not ct.oci_sandboxes(), f"left after podman run --rm: {ct.oci_sandboxes()}")
    print(f"    podman run python3 -c 'print(6*7)': 42; first run {times[0]:.1f} s (the root's "
          f"disk and template made), second {times[1]:.1f} s (no disk made)")


# podman's pull of the 170 MiB archive takes 130 s under the box's emulated CPU, and the first
# run makes the root's disk and template from 154 MiB of files.
test_podman_debian_python.time_limit = 720

TESTS = [test_podman_debian_python]
