"""CosyVoice's gRPC service (``cosyvoice.CosyVoice/Inference``), on its own port (``RTVOICE_GRPC_PORT``).

``cosyvoice.proto`` is the interface; ``cosyvoice_pb2*.py`` are generated from it (``generate.py``) and
committed; ``server.py`` serves it. Importing this package needs no grpcio: only starting the server does.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rtvoice.app.access import Access
    from rtvoice.app.drain import Drain
    from rtvoice.app.metrics import RequestMetrics
    from rtvoice.engine.engine import Engine

INSTALL_HINT = "pip install -e '.[grpc]'"


DEPENDENCIES = {"grpc": "grpcio", "google.protobuf": "protobuf"}
"""Module -> the package that installs it."""


def missing_dependencies() -> list[str]:
    """The packages the gRPC service needs that are not installed."""
    missing = []
    for module, package in DEPENDENCIES.items():
        try:
            found = find_spec(module) is not None
        except ModuleNotFoundError:  # ``google`` itself is missing
            found = False
        if not found:
            missing.append(package)
    return missing


def require_grpc() -> None:
    """Raise RuntimeError, saying what to install, when the gRPC service cannot run here."""
    missing = missing_dependencies()
    if missing:
        raise RuntimeError(
            f"RTVOICE_GRPC_PORT is set but {', '.join(missing)} is not installed; install with: {INSTALL_HINT}"
        )


async def serve(
    engine: Engine,
    host: str,
    port: int,
    requests: RequestMetrics,
    access: Access | None = None,
    drain: Drain | None = None,
) -> Any:
    """Start the service in the running event loop and return the ``grpc.aio`` server (the caller stops it);
    RuntimeError with what to install when grpcio is missing, or when the port cannot be bound. With ``access``
    and ``drain`` its calls take the same keys, quotas, request ids, access lines and drain as HTTP."""
    require_grpc()
    from rtvoice.app.cosyvoice_grpc.server import start

    return await start(engine, host, port, requests, access, drain)
