"""The protocol files: the generated modules match the .proto files, and the
.proto files match Envoy's own (package, message, field names, numbers,
labels and types), as compiled into a real Envoy binary."""

from __future__ import annotations

import importlib

import grpc
import pytest
from google.protobuf import descriptor_pb2
from rls_helpers import embedded_descriptors, envoy_binary

from netlimit.rls.proto import regen

MODULES = {p: "netlimit.rls.proto." + p.replace(".proto", "_pb2") for p in regen.PROTOS}

#: our file -> Envoy's file holding the same package
ENVOY_FILES = {
    "envoy_core.proto": "envoy/config/core/v3/base.proto",
    "envoy_type.proto": "envoy/type/v3/ratelimit_unit.proto",
    "envoy_ratelimit.proto": "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "rls.proto": "envoy/service/ratelimit/v3/rls.proto",
}


def _strip_json_names(fd):
    """protoc's descriptor sets carry json_name; the Python modules embed them without."""

    def walk(msgs):
        for m in msgs:
            for f in m.field:
                f.ClearField("json_name")
            walk(m.nested_type)

    walk(fd.message_type)
    return fd


def test_generated_descriptors_equal_what_protoc_compiles_now(tmp_path):
    """Version-independent: the descriptor embedded in each *_pb2.py is exactly
    the one protoc builds from the .proto file today."""
    fds = descriptor_pb2.FileDescriptorSet.FromString(regen.descriptor_set(tmp_path / "set.pb"))
    compiled = {f.name.rsplit("/", 1)[-1]: _strip_json_names(f) for f in fds.file}
    assert set(compiled) == set(regen.PROTOS)
    for proto, modname in MODULES.items():
        mod = importlib.import_module(modname)
        ours = descriptor_pb2.FileDescriptorProto.FromString(mod.DESCRIPTOR.serialized_pb)
        assert ours == compiled[proto], f"{modname} is out of date with {proto}: run python -m netlimit.rls.proto.regen"


def test_generated_files_are_what_regen_writes(tmp_path):
    """Byte for byte, when the installed grpcio-tools is the one that generated them."""
    import grpc_tools

    from netlimit.rls.proto import rls_pb2_grpc

    texts = regen.generate(tmp_path)
    made_by = rls_pb2_grpc.GRPC_GENERATED_VERSION
    installed = getattr(grpc_tools, "__version__", None) or importlib.metadata.version("grpcio-tools")
    if installed != made_by:
        # the descriptors are compared above whatever the version; the text
        # (headers, version checks) is protoc's own and differs between versions
        assert texts["rls_pb2_grpc.py"].count("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit") == 1
        return
    for name, text in texts.items():
        assert (regen.HERE / name).read_text() == text, (
            f"{name} differs from what grpcio-tools {installed} generates: run python -m netlimit.rls.proto.regen"
        )


def test_regen_check_passes():
    assert regen.main(["--check"]) == 0


def test_method_path_is_envoys():
    from netlimit.rls.proto import rls_pb2

    svc = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"]
    m = svc.methods_by_name["ShouldRateLimit"]
    assert svc.full_name == "envoy.service.ratelimit.v3.RateLimitService"
    assert m.input_type.full_name == "envoy.service.ratelimit.v3.RateLimitRequest"
    assert m.output_type.full_name == "envoy.service.ratelimit.v3.RateLimitResponse"
    assert grpc.__version__  # the runtime the generated stubs check against


def _fields(msg) -> list[tuple]:
    return sorted((f.name, f.number, f.label, f.type, f.type_name) for f in msg.field)


def _walk(msgs, prefix: str):
    for m in msgs:
        full = f"{prefix}.{m.name}"
        yield full, m
        yield from _walk(m.nested_type, full)


def _enums(fd) -> dict[str, list[tuple[str, int]]]:
    out = {f".{fd.package}.{e.name}": sorted((v.name, v.number) for v in e.value) for e in fd.enum_type}
    for full, m in _walk(fd.message_type, f".{fd.package}"):
        for e in m.enum_type:
            out[f"{full}.{e.name}"] = sorted((v.name, v.number) for v in e.value)
    return out


def test_messages_match_envoys_compiled_descriptors():
    """Every message, field and enum value of our .proto files exists in Envoy
    1.40's own descriptors (compiled into the binary) with the same number,
    label and type; and every field Envoy has on these messages, we have."""
    binary = envoy_binary()
    theirs = embedded_descriptors(binary, ENVOY_FILES.values())
    missing = sorted(set(ENVOY_FILES.values()) - set(theirs))
    assert not missing, f"no compiled descriptor for {missing} found in {binary}"
    compared = []
    for proto, modname in MODULES.items():
        ours = descriptor_pb2.FileDescriptorProto.FromString(importlib.import_module(modname).DESCRIPTOR.serialized_pb)
        env = theirs[ENVOY_FILES[proto]]
        assert ours.package == env.package, proto
        env_msgs = dict(_walk(env.message_type, f".{env.package}"))
        for full, m in _walk(ours.message_type, f".{ours.package}"):
            assert full in env_msgs, f"{full} is not a message of Envoy's {ENVOY_FILES[proto]}"
            assert _fields(m) == _fields(env_msgs[full]), f"{full}: fields differ from Envoy's"
            compared.append(full)
        env_enums = _enums(env)
        for full, values in _enums(ours).items():
            assert values == env_enums.get(full), f"{full}: values differ from Envoy's {env_enums.get(full)}"
        for s in ours.service:
            es = {x.name: x for x in env.service}[s.name]
            assert [(x.name, x.input_type, x.output_type) for x in s.method] == [
                (x.name, x.input_type, x.output_type) for x in es.method
            ]
    assert len(compared) == 9, compared  # HeaderValue, Descriptor (+Entry, Override), Request, Response (+4)


def test_only_header_value_is_taken_from_base_proto():
    ours = descriptor_pb2.FileDescriptorProto.FromString(
        importlib.import_module(MODULES["envoy_core.proto"]).DESCRIPTOR.serialized_pb
    )
    assert [m.name for m in ours.message_type] == ["HeaderValue"]


@pytest.mark.parametrize("proto", regen.PROTOS)
def test_every_proto_file_says_it_mirrors_envoy(proto):
    text = (regen.HERE / proto).read_text()
    assert "Envoy" in text.split("syntax", 1)[0]
