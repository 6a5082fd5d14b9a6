"""Regenerate ``cosyvoice_pb2.py`` and ``cosyvoice_pb2_grpc.py`` from ``cosyvoice.proto`` (a developer tool).

    python -m rtvoice.app.cosyvoice_grpc.generate

The generated modules are committed, so a server needs only grpcio and protobuf (the ``grpc`` extra),
never protoc. protoc runs on a copy of the .proto laid out at its installed package path, so the
generated service module imports its messages as ``rtvoice.app.cosyvoice_grpc.cosyvoice_pb2``.
Needs ``grpcio-tools`` (the ``test`` extra).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = HERE / "cosyvoice.proto"
PACKAGE_PATH = Path("rtvoice", "app", "cosyvoice_grpc")
OUTPUTS = ("cosyvoice_pb2.py", "cosyvoice_pb2_grpc.py")


def generate(proto: Path = PROTO, package_path: Path | None = PACKAGE_PATH) -> dict[str, str]:
    """The generated modules' text by file name. ``package_path=None`` lays the .proto out flat, as
    CosyVoice's own clients generate it (``import cosyvoice_pb2``)."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as root:
        relative = (package_path or Path()) / proto.name
        (Path(root) / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(proto, Path(root) / relative)
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{root}",
                f"--python_out={root}",
                f"--grpc_python_out={root}",
                str(Path(root) / relative),
            ]
        )
        if code != 0:
            raise RuntimeError(f"protoc failed on {proto} (exit {code})")
        out = (Path(root) / relative).parent
        return {name: (out / name).read_text() for name in OUTPUTS}


def main() -> None:
    for name, text in generate().items():
        (HERE / name).write_text(text)
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
