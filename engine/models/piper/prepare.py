"""A Piper voice's weights made ready to run: split into stages (``graph.py``), with the decoder's 2-D form
(``layout.py``) and what the split finds by running the graph; kept in the data directory, so a start reads them back.

Made once per weights: splitting needs onnx, whose import alone takes about 1.4 s (its ``ml_dtypes`` extension), and
the split and the 2-D form about 1 s more, on every start before (``docs/decisions.md``). A kept split is read
with no onnx at all, so ``graph`` and ``layout`` are imported only where one is made.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import shutil
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rtvoice.engine.durable import key_name, write_atomically
from rtvoice.engine.models.piper.stages import PiperGraphs, Stage

log = logging.getLogger(__name__)

MANIFEST = "stages.json"
"""Written last: a folder without it (or with another key in it) holds no usable split."""
SPLITTER_SOURCES = ("graph.py", "layout.py", "prepare.py")
"""The code a kept split follows from: a change to any of them makes the split again."""
_STAGE_FILES = {"encoder": "encoder.onnx", "flow": "flow.onnx", "decoder": "decoder.onnx"}
_TWO_D_FILE = "decoder-2d.onnx"


@dataclass(frozen=True)
class Prepared:
    """What a voice's load starts from."""

    graphs: PiperGraphs
    duration_noise_channels: list[int]
    """Channels of each duration-noise input (``graphs.duration_noise``)."""
    two_d_decoder: Stage | None
    """The decoder with its 1-D convolutions run as 2-D ones; None when it has none (``layout.py``)."""
    decoder_channels: int | None
    """Channels of the decoder's input, as its first convolution reads them; None when none reads it directly."""


def prepared(model_bytes: bytes, weights_sha256: str, directory: Path | None) -> Prepared:
    """The weights ``model_bytes`` (whose hash is ``weights_sha256``) split, as kept under ``directory`` before or
    made now and kept there (None: made each time). A folder that cannot be read or written is made again or left
    out."""
    key = _key(weights_sha256)
    if directory is None or key is None:
        return _make(model_bytes)
    place = directory / key_name(key)
    kept = _read(place, key)
    if kept is not None:
        log.info("stages as split before (%s)", place)
        return kept
    made = _make(model_bytes)
    _keep(place, key, made)
    _drop_superseded(directory, key)
    return made


def _key(weights_sha256: str) -> dict[str, Any] | None:
    """What a split follows from: the weights, the splitter's code, onnx (which writes the stages); None when the
    splitter's code cannot be read, so no split can be told apart from another."""
    try:
        sources = hashlib.sha256(b"".join((Path(__file__).parent / name).read_bytes() for name in SPLITTER_SOURCES))
    except OSError:
        return None
    return {
        "weights_sha256": weights_sha256,
        "splitter_sha256": sources.hexdigest(),
        "onnx": importlib.metadata.version("onnx"),
    }


def _make(model_bytes: bytes) -> Prepared:
    # Imported here: onnx is needed only to make a split (see the module's note).
    import onnx

    from rtvoice.engine.models.piper import graph, layout

    model = onnx.load_from_string(model_bytes)
    graphs = graph.split(model)
    channels = [graph.noise_channels(model, name) for name in graphs.duration_noise]
    return Prepared(graphs, channels, layout.two_dimensional(graphs.decoder), layout.input_channels(graphs.decoder))


def _read(place: Path, key: dict[str, Any]) -> Prepared | None:
    """The split kept at ``place`` for ``key``; None when there is none, or it cannot be read."""
    try:
        manifest = json.loads((place / MANIFEST).read_text(encoding="utf-8"))
        if manifest["key"] != key:  # a clash of digests, or written by hand
            return None
        names = manifest["graphs"]
        interfaces = manifest["interfaces"]

        def stage(name: str, file: str) -> Stage:
            return Stage((place / file).read_bytes(), interfaces[name]["inputs"], interfaces[name]["outputs"])

        two_d = stage("decoder", _TWO_D_FILE) if manifest["two_d"] else None
        graphs = PiperGraphs(
            stage("encoder", _STAGE_FILES["encoder"]),
            stage("flow", _STAGE_FILES["flow"]),
            stage("decoder", _STAGE_FILES["decoder"]),
            **names,
        )
        return Prepared(graphs, manifest["duration_noise_channels"], two_d, manifest["decoder_channels"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not made yet, or not readable: make it


def _keep(place: Path, key: dict[str, Any], made: Prepared) -> None:
    """``made`` kept at ``place``: each file whole or not at all (a server starting beside this one may read them),
    the manifest last."""
    graphs = made.graphs
    stages = {"encoder": graphs.encoder, "flow": graphs.flow, "decoder": graphs.decoder}
    names = {f.name: getattr(graphs, f.name) for f in fields(graphs) if f.name not in stages}
    manifest = {
        "key": key,
        "graphs": names,
        "interfaces": {name: {"inputs": s.inputs, "outputs": s.outputs} for name, s in stages.items()},
        "duration_noise_channels": made.duration_noise_channels,
        "two_d": made.two_d_decoder is not None,
        "decoder_channels": made.decoder_channels,
    }
    try:
        place.mkdir(parents=True, exist_ok=True)
        for name, stage in stages.items():
            write_atomically(place / _STAGE_FILES[name], stage.model)
        if made.two_d_decoder is not None:
            write_atomically(place / _TWO_D_FILE, made.two_d_decoder.model)
        write_atomically(place / MANIFEST, json.dumps(manifest, indent=1).encode())
    except OSError as error:
        log.warning("could not keep the voice's split stages in %s: %s", place, error)


def _drop_superseded(directory: Path, key: dict[str, Any]) -> None:
    """Remove the splits of the same weights made by other code or another onnx (after an upgrade: 67 MB each for
    the embedded voice). A start of the old code that was reading one makes its own again."""
    for manifest in directory.glob(f"*/{MANIFEST}"):
        try:
            other = json.loads(manifest.read_text(encoding="utf-8"))["key"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written, or not ours to judge
        if other != key and other.get("weights_sha256") == key["weights_sha256"]:
            log.info("removing %s, a split of these weights by other code", manifest.parent)
            shutil.rmtree(manifest.parent, ignore_errors=True)
