"""Kubernetes' path (issue 34): containerd 1.6's CRI plugin runs cove-oci as the runtime handler
`cove` (a RuntimeClass names it), driven by tests/e2e/cri_client.py in place of the kubelet (no
kubelet or crictl is packaged). A pod's own container ("pause") gets no VM; each app container is
its own microVM. Real containerd and its runc shim with BinaryName, in the KVM box."""
import base64
import os
import subprocess
import time

import box_tests as bt
import containers_tests as ct

WORK = "/tmp/cri"
SOCK = WORK + "/containerd.sock"
MUSL = "localhost/musl:latest"


def start_containerd():
    os.makedirs(WORK + "/cni", exist_ok=True)
    with open(WORK + "/config.toml", "w") as f:
        f.write(f"""version = 2
root = "{WORK}/root"
state = "{WORK}/state"
oom_score = 0
[grpc]
  address = "{SOCK}"
[ttrpc]
  address = "{SOCK}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  # The pod's own container runs nothing under cove-oci: any local image serves.
  sandbox_image = "{MUSL}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # no CAP_SYS_RESOURCE for the box's root: the pod's oom_score_adj -998 cannot be set
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    conf_dir = "{WORK}/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "cove"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.cove]
      runtime_type = "io.containerd.runc.v2"
      pod_annotations = ["cove.dev/*"]
      container_annotations = ["cove.dev/*"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.cove.options]
        BinaryName = "{ct.OCI}"
""")
    return ct.run_containerd(WORK, SOCK)


def wait_exited(cri, cid, timeout=180):
    deadline = time.monotonic() + timeout
    st = {}
    while time.monotonic() < deadline:
        st = cri.call("ContainerStatus", {"container_id": cid})["status"]
        if st.get("state") == "CONTAINER_EXITED":
            return st
        time.sleep(0.5)
    raise bt.Failure(f"container {cid[:12]}: {st.get('state')}, not exited within {timeout} s")


def test_cri_pod_lifecycle():
    """A host-network pod with handler `cove`: RunPodSandbox (no VM for its own container),
    CreateContainer and StartContainer of the musl image (a microVM), ExecSync of `uname -r`
    (the guest's kernel, not the box's) and of an exit 7, ContainerStatus, StopContainer
    (TERM: exit 143), RemoveContainer; a second container that exits with 3 reports 3; its
    output is in the CRI log file; StopPodSandbox and RemovePodSandbox leave no VM."""
    ct.need_inputs()
    try:
        import cri_client
    except ImportError as e:
        raise bt.Failure(f"the CRI client needs python3-grpcio in the box: {e}")
    subprocess.run(["rm", "-rf", WORK])
    os.makedirs(ct.WORK, exist_ok=True)  # where cove keeps the containers' sandboxes
    ct.cgroups()
    # A host-network pod gets copies of the host's /etc/hosts and /etc/resolv.conf; the box has
    # no resolv.conf (no network), so one naming only loopback.
    if not os.path.exists("/etc/resolv.conf"):
        with open("/etc/resolv.conf", "w") as f:
            f.write("nameserver 127.0.0.1\n")
    p = start_containerd()
    try:
        ct.run(["ctr", "-a", SOCK, "-n", "k8s.io", "image", "import", "--snapshotter", "native",
                "--base-name", "localhost/musl", os.path.join(ct.IMAGES, "musl.oci.tar")],
               check_rc=0)
        cri = cri_client.CRI("unix://" + SOCK)
        ver = cri.call("Version", {"version": "v1"})
        bt.check(ver.get("runtime_name") == "containerd", f"CRI Version: {ver}")
        pod = {"metadata": {"name": "pod1", "namespace": "default", "uid": "pod1-uid",
                            "attempt": 0},
               "log_directory": WORK + "/logs/pod1",
               "annotations": {"cove.dev/mem": "256M"},
               "linux": {"security_context": {"namespace_options": {"network": "NODE"}}}}
        t0 = time.monotonic()
        pod_id = cri.call("RunPodSandbox", {"config": pod, "runtime_handler": "cove"})[
            "pod_sandbox_id"]
        t_pod = time.monotonic() - t0
        bt.check(not ct.oci_sandboxes(), f"the pod's own container made a VM: "
                 f"{ct.oci_sandboxes()}")
        c1 = {"metadata": {"name": "c1", "attempt": 0}, "image": {"image": MUSL},
              "command": ["sh", "-c",
                          "echo hello-from-cri; trap 'exit 143' TERM; "
                          "while :; do echo tick; sleep 1; done"],
              "log_path": "c1.log", "linux": {}}
        t0 = time.monotonic()
        cid = cri.call("CreateContainer", {"pod_sandbox_id": pod_id, "config": c1,
                                           "sandbox_config": pod})["container_id"]
        cri.call("StartContainer", {"container_id": cid})
        t_start = time.monotonic() - t0
        bt.check(len(ct.oci_sandboxes()) == 1, f"one VM for c1: {ct.oci_sandboxes()}")
        st = cri.call("ContainerStatus", {"container_id": cid})["status"]
        bt.check(st.get("state") == "CONTAINER_RUNNING", f"c1 after StartContainer: {st}")
        # (the musl image's busybox has no uname link: its shell runs the applet)
        r = cri.call("ExecSync", {"container_id": cid, "cmd": ["sh", "-c", "uname -r"],
                                  "timeout": 120})
        release = base64.b64decode(r.get("stdout", "")).decode().strip()
        bt.check(r.get("exit_code", 0) == 0 and release and release != os.uname().release,
                 f"ExecSync uname -r: {r} (box: {os.uname().release})")
        r = cri.call("ExecSync", {"container_id": cid, "cmd": ["sh", "-c", "echo out; exit 7"],
                                  "timeout": 120})
        bt.check(r.get("exit_code") == 7 and base64.b64decode(r.get("stdout", "")) == b"out\n",
                 f"ExecSync exit 7: {r}")
        # The streaming calls: containerd hands back a URL on its stream server, spoken to
        # over WebSocket (Kubernetes' v4 channel protocol) as the kubelet's clients do.
        t0 = time.monotonic()
        url = cri.call("Exec", {"container_id": cid, "cmd": ["sh", "-c",
                                "echo streamed; echo to-err >&2; exit 4"],
                                "stdout": True, "stderr": True})["url"]
        out, err, status = cri_client.stream(url)
        bt.check(out == b"streamed\n" and err == b"to-err\n" and
                 cri_client.exit_code(status) == 4,
                 f"streaming Exec: stdout {out!r} stderr {err!r} status {status}")
        t_exec = time.monotonic() - t0
        url = cri.call("Attach", {"container_id": cid, "stdout": True, "stderr": True})["url"]
        out, err, status = cri_client.stream(url, until=lambda o: o.count(b"tick") >= 2)
        bt.check(out.count(b"tick") >= 2, f"Attach to c1: {out[-300:]!r} {status}")
        print(f"    streaming Exec over WebSocket: stdout, stderr and exit 4 in {t_exec:.1f} s; "
              f"Attach: c1's ticks live")
        cri.call("StopContainer", {"container_id": cid, "timeout": 10})
        st = wait_exited(cri, cid)
        bt.check(st.get("exit_code") == 143, f"c1 after StopContainer: {st}")
        with open(os.path.join(pod["log_directory"], "c1.log")) as f:
            log = f.read()
        bt.check(" stdout F hello-from-cri" in log, f"c1's CRI log: {log[-600:]!r}")
        cri.call("RemoveContainer", {"container_id": cid})
        # A container whose process exits with 3: ContainerStatus says 3.
        c2 = {"metadata": {"name": "c2", "attempt": 0}, "image": {"image": MUSL},
              "command": ["sh", "-c", "exit 3"], "log_path": "c2.log", "linux": {}}
        cid2 = cri.call("CreateContainer", {"pod_sandbox_id": pod_id, "config": c2,
                                            "sandbox_config": pod})["container_id"]
        cri.call("StartContainer", {"container_id": cid2})
        st = wait_exited(cri, cid2)
        bt.check(st.get("exit_code") == 3, f"c2 (exit 3): {st}")
        cri.call("RemoveContainer", {"container_id": cid2})
        cri.call("StopPodSandbox", {"pod_sandbox_id": pod_id})
        cri.call("RemovePodSandbox", {"pod_sandbox_id": pod_id})
        bt.check(not ct.oci_sandboxes(), f"left after the pod: {ct.oci_sandboxes()}")
        print(f"    CRI with handler cove: RunPodSandbox {t_pod:.1f} s (no VM), c1 created and "
              f"started {t_start:.1f} s; ExecSync uname -r = {release} (box "
              f"{os.uname().release}); exit 7; StopContainer: 143; c2 exit 3; pod removed")
    except Exception as e:
        if type(e).__name__ in ("_InactiveRpcError", "RpcError"):
            raise bt.Failure(f"CRI call failed: {e}; containerd's log: "
                             f"{open(WORK + '/containerd.log').read()[-2500:]}")
        raise
    finally:
        ct.stop_containerd(p)


TESTS = [test_cri_pod_lifecycle]
