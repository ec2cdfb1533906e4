"""A small CRI (runtime.v1) client standing in for the kubelet, which Debian does not package
(nor crictl). It needs only Debian's python3-grpcio and python3-protobuf: the CRI message types
are rebuilt from the descriptor containerd itself carries. gogo-protobuf registers each .proto
file as a gzipped FileDescriptorProto inside the binary; the one whose package is runtime.v1 is
found by its gzip header, parsed, freed of its gogo import and option extensions, and turned into
classes.
Requests and replies are plain dicts (protobuf's JSON mapping, field names as in the .proto)."""
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
