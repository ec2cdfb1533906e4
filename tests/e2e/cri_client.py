"""A small CRI (runtime.v1) client standing in for the kubelet, which Debian does not package
(nor crictl). It needs only Debian's python3-grpcio and python3-protobuf: the CRI message types
are rebuilt from the descriptor containerd itself carries. gogo-protobuf registers each .proto
file as a gzipped FileDescriptorProto inside the binary; the one whose package is runtime.v1 is
found by its gzip header, parsed, freed of its gogo import and option extensions, and turned into
classes.
Requests and replies are plain dicts (protobuf's JSON mapping, field names as in the .proto)."""
import base64
import hashlib
import json
import os
import socket
import struct
import urllib.parse
import zlib

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

# Go's compress/gzip header at BestCompression: no name, no mtime, XFL 2, OS unknown (255).
GO_GZIP = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
SERVICES = {"RuntimeService": "runtime.v1.RuntimeService",
            "ImageService": "runtime.v1.ImageService"}


def _descriptor(binary):
    """The runtime.v1 FileDescriptorProto embedded in the containerd executable."""
    with open(binary, "rb") as f:
        data = f.read()
    at = data.find(GO_GZIP)
    while at >= 0:
        d = zlib.decompressobj(31)
        try:
            raw = d.decompress(data[at:at + (4 << 20)], 8 << 20)
        except zlib.error:
            raw = b""
        if raw and d.eof:
            fdp = descriptor_pb2.FileDescriptorProto()
            try:
                fdp.ParseFromString(raw)
            except Exception:  # not a descriptor: another gzipped blob
                fdp = None
            if fdp is not None and fdp.package == "runtime.v1" and fdp.service:
                return fdp
        at = data.find(GO_GZIP, at + 1)
    raise RuntimeError(f"no runtime.v1 descriptor in {binary}")


class CRI:
    def __init__(self, endpoint, containerd="/usr/bin/containerd", timeout=300):
        fdp = _descriptor(containerd)
        del fdp.dependency[:]
        # gogo's options are extensions unknown here: dropped, and the options the runtime
        # needs (map_entry: annotations and labels are maps) kept.
        fdp.DiscardUnknownFields()
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        fd = pool.FindFileByName(fdp.name)
        self.types = {n: message_factory.GetMessageClass(md) if hasattr(
            message_factory, "GetMessageClass") else
            message_factory.MessageFactory(pool).GetPrototype(md)
            for n, md in fd.message_types_by_name.items()}
        self.methods = {}
        for s in fd.services_by_name.values():
            for m in s.methods:
                self.methods[m.name] = (s.full_name, m.input_type.name, m.output_type.name)
        self.channel = grpc.insecure_channel(endpoint)
        self.timeout = timeout

    def call(self, method, request=None, timeout=None):
        """method(request dict) -> reply dict; a gRPC error raises grpc.RpcError."""
        service, req_t, rep_t = self.methods[method]
        req = json_format.ParseDict(request or {}, self.types[req_t]())
        stub = self.channel.unary_unary(f"/{service}/{method}",
                                        request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=self.types[rep_t].FromString)
        rep = stub(req, timeout=timeout or self.timeout)
        return json_format.MessageToDict(rep, preserving_proto_field_name=True,
                                         including_default_value_fields=True)


WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455


def _ws_frames(sock):
    """Frames from a WebSocket server (unmasked, RFC 6455): (opcode, payload) until close."""
    buf = b""

    def need(n):
        nonlocal buf
        while len(buf) < n:
            d = sock.recv(65536)
            if not d:
                raise ConnectionError("the stream server closed the connection mid-frame")
            buf += d
        out, buf = buf[:n], buf[n:]
        return out

    while True:
        b0, b1 = need(2)
        n = b1 & 0x7f
        if n == 126:
            n = struct.unpack(">H", need(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", need(8))[0]
        mask = need(4) if b1 & 0x80 else None
        data = need(n)
        if mask:
            data = bytes(c ^ mask[i % 4] for i, c in enumerate(data))
        yield b0 & 0x0f, data
        if b0 & 0x0f == 8:
            return


def stream(url, timeout=120, until=None):
    """A CRI streaming URL (Exec or Attach: containerd's stream server) read over WebSocket
    with Kubernetes' v4.channel.k8s.io protocol: each binary frame's first byte is its channel
    (1 stdout, 2 stderr, 3 the error channel's status JSON). Returns (stdout, stderr, status);
    until(stdout) true ends it early (an Attach)."""
    u = urllib.parse.urlparse(url)
    key = base64.b64encode(os.urandom(16)).decode()
    out, err, status = b"", b"", None
    with socket.create_connection((u.hostname, u.port), timeout=timeout) as s:
        path = u.path + ("?" + u.query if u.query else "")
        s.sendall((f"GET {path} HTTP/1.1\r\nHost: {u.netloc}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                   "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: v4.channel.k8s.io"
                   "\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            d = s.recv(1)
            if not d:
                raise ConnectionError(f"no WebSocket upgrade from {url}: {head!r}")
            head += d
        lines = head.decode(errors="replace").split("\r\n")
        want = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        if " 101 " not in lines[0] + " " or not any(
                l.lower().startswith("sec-websocket-accept:") and l.split(":", 1)[1].strip()
                == want for l in lines):
            raise ConnectionError(f"the stream server did not upgrade: {lines[:6]}")
        for op, data in _ws_frames(s):
            if op in (1, 2) and data:
                ch, body = data[0], data[1:]
                if ch == 1:
                    out += body
                elif ch == 2:
                    err += body
                elif ch == 3 and body:
                    status = json.loads(body)
            if until and until(out):
                break
    return out, err, status


def exit_code(status):
    """The exit code a v4 error-channel status names (0 for Success)."""
    if not status or status.get("status") == "Success":
        return 0
    for c in (status.get("details") or {}).get("causes") or []:
        if c.get("reason") == "ExitCode":
            return int(c.get("message"))
    raise ValueError(f"no exit code in {status}")


def _selftest():
    """Only that the descriptor is found and its types built (no daemon needed)."""
    c = CRI("unix:///nonexistent")
    for m in ("RunPodSandbox", "CreateContainer", "StartContainer", "ExecSync",
              "ContainerStatus", "StopContainer", "RemoveContainer", "StopPodSandbox",
              "RemovePodSandbox"):
        assert m in c.methods, m
    print(f"cri_client: {len(c.methods)} methods, {len(c.types)} types")


if __name__ == "__main__":
    _selftest()
