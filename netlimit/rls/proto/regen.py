"""Regenerate the Python modules of Envoy's rate limit protocol from the .proto
files beside this script::

    python -m netlimit.rls.proto.regen            # rewrite *_pb2.py(i), rls_pb2_grpc.py
    python -m netlimit.rls.proto.regen --check    # exit 1 if they are out of date

Needs grpcio-tools (the ``test`` extra); the sidecar itself needs only grpcio
and protobuf.  The .proto files carry Envoy's packages, message names and field
numbers for the few messages the service uses; ``tests/rls/test_proto_sync.py``
holds them to the descriptors compiled into a real Envoy binary and holds the
generated modules to the .proto files.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: the directory that holds the top-level ``netlimit`` package (import paths are
#: relative to it, so generated modules import ``netlimit.rls.proto.*``)
ROOT = HERE.parents[2]
PROTOS = ("envoy_core.proto", "envoy_type.proto", "envoy_ratelimit.proto", "rls.proto")
REL = HERE.relative_to(ROOT)


def generated_names() -> list[str]:
    out = [p.replace(".proto", "_pb2.py") for p in PROTOS]
    out += [p.replace(".proto", "_pb2.pyi") for p in PROTOS]  # type stubs: mypy sees the messages
    out.append("rls_pb2_grpc.py")
    return out


def _protoc(args: list[str]) -> None:
    try:
        from grpc_tools import protoc
    except ImportError:
        raise SystemExit("grpcio-tools is not installed: pip install 'netlimit[test]' (or grpcio-tools)") from None
    import importlib.resources

    wkt = str(importlib.resources.files("grpc_tools") / "_proto")  # google/protobuf/*.proto
    rc = protoc.main(["grpc_tools.protoc", f"-I{ROOT}", f"-I{wkt}", *args, *[str(REL / p) for p in PROTOS]])
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")


def generate(out_dir: Path) -> dict[str, str]:
    """Run protoc into ``out_dir``; {file name: generated text}."""
    _protoc([f"--python_out={out_dir}", f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}"])
    gen = out_dir / REL
    texts = {}
    for name in generated_names():
        path = gen / name
        if path.exists():
            texts[name] = path.read_text()
    return texts


def descriptor_set(out_file: Path) -> bytes:
    """The FileDescriptorSet protoc compiles from the .proto files (no imports)."""
    _protoc([f"--descriptor_set_out={out_file}"])
    return out_file.read_bytes()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 when a file differs")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="netlimit-protoc-") as d:
        texts = generate(Path(d))
    missing = sorted(set(generated_names()) - set(texts))
    if missing:
        print(f"protoc did not produce {', '.join(missing)}", file=sys.stderr)
        return 1
    stale = []
    for name, text in texts.items():
        target = HERE / name
        old = target.read_text() if target.exists() else ""
        if old == text:
            continue
        stale.append(name)
        if args.check:
            diff = difflib.unified_diff(
                old.splitlines(), text.splitlines(), f"{name} (committed)", f"{name} (generated)", lineterm="", n=1
            )
            print("\n".join(list(diff)[:40]), file=sys.stderr)
        else:
            target.write_text(text)
    if args.check:
        if stale:
            print(f"out of date: {', '.join(stale)}; run: python -m netlimit.rls.proto.regen", file=sys.stderr)
            return 1
        print("generated modules are up to date")
        return 0
    print(f"wrote {', '.join(stale)}" if stale else "nothing to do: generated modules are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
