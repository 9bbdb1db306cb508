"""Generate (or check) the committed protobuf/gRPC code from ``protos/``.

``protos/tpuctl/proto/NAME.proto`` becomes ``tpuctl/proto/NAME_pb2.py`` (+ ``.pyi``) and, for files that
declare a service, ``NAME_pb2_grpc.py`` (+ ``.pyi``). ``check`` regenerates into a scratch folder and
fails (exit 1) naming every file that differs, so CI catches a proto edited without regenerating.
"""

from __future__ import annotations

import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_PACKAGE = Path("tpuctl") / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def _protoc(out_dir: Path) -> None:
    from grpc_tools import protoc  # dev extra only

    bin_dir = Path(sys.executable).parent
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    if not protos:
        raise SystemExit("no .proto files under protos/")
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    # grpc_tools writes an empty *_pb2_grpc.py for files without services: drop them.
    for path in (out_dir / OUT_PACKAGE).glob("*_pb2_grpc.py"):
        if "class " not in path.read_text():
            path.unlink()
            stub = path.with_suffix(".pyi")
            if stub.exists():
                stub.unlink()


def _generated(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in (folder / OUT_PACKAGE).iterdir() if p.name.endswith(GENERATED_SUFFIXES)}


def generate() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _protoc(Path(tmp))
        target = ROOT / OUT_PACKAGE
        for old in _generated(ROOT).values():
            old.unlink()
        for name, path in _generated(Path(tmp)).items():
            shutil.copyfile(path, target / name)
            print(f"wrote {OUT_PACKAGE / name}")


def check() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        _protoc(Path(tmp))
        fresh, committed = _generated(Path(tmp)), _generated(ROOT)
        stale = sorted(set(fresh) ^ set(committed))
        stale += sorted(n for n in set(fresh) & set(committed) if not filecmp.cmp(fresh[n], committed[n], False))
    if stale:
        print("generated protobuf code is stale against protos/: " + ", ".join(stale), file=sys.stderr)
        print("hint: run `make protos` and commit the result", file=sys.stderr)
        return 1
    print(f"generated protobuf code is current ({len(committed)} files)")
    return 0


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "check"
    if command == "generate":
        generate()
    elif command == "check":
        sys.exit(check())
    else:
        raise SystemExit(f"usage: {sys.argv[0]} generate|check")
