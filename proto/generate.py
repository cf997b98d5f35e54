"""Regenerate the Python gRPC modules from proto/*.proto.

Run with ``make proto`` (or ``python -m proto.generate``). The generated modules are
committed so that an install needs no protoc; ``tests/test_proto_generated.py`` fails
when they are stale. Imports are rooted at the repository top (``import
"proto/common.proto"``), so the generated code imports ``from proto import ..._pb2``.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
ROOT = PROTO_DIR.parent


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out_root: Path) -> None:
    """Run protoc (from grpcio-tools) for every .proto into ``out_root/proto``."""
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    (out_root / "proto").mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(p.relative_to(ROOT)) for p in proto_files()],
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")


def generated_names() -> list[str]:
    names = []
    for p in proto_files():
        stem = p.stem
        names += [f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"]
    return names


def stale_files() -> list[str]:
    """Names of generated modules that differ from a fresh generation (or are missing)."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = []
        for name in generated_names():
            fresh = Path(tmp) / "proto" / name
            current = PROTO_DIR / name
            if not current.exists() or not filecmp.cmp(fresh, current, shallow=False):
                stale.append(name)
        return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale modules; exit 1 if any")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: proto/{name}")
        return 1 if stale else 0
    generate(ROOT)
    print(f"generated {len(generated_names())} modules in {PROTO_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
