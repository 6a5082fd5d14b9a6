"""int8 where it is not heard: a Piper voice's text-encoder convolutions and its decoder's first two upsampling stages,
quantised statically (onnxruntime's QDQ format, per output channel, activation ranges calibrated on sentences rtvoice
ships), built when a voice first loads and kept in the data directory under the weights' hash and onnxruntime's
version, so a restart reuses it.

Static quantisation fixes every scale at build time, so a chunk's output does not depend on the rest of its sentence:
chunked runs still join as the whole run does (``context.py``). Each part is judged at build time against fp32 on the
calibration sentences, and kept only where it passes (``Verdict``):

- the decoder part, on the same latent as fp32: a DTW log-mel distance of at most ``DECODER_DTW_DB`` and no more
  than ``SILENCE_ADDED_DB`` of level added where fp32 is silent (a noise floor is what int8 adds first);
- the whole voice with the parts that passed: a recogniser's word error rate no worse than fp32's by more than
  ``WER_MARGIN`` (PocketSphinx, the ``int8`` extra; without it nothing can be judged and ``auto`` keeps fp32).

Figures and the reasons for the choice: ``docs/decisions.md``.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime
import soxr
from rapidfuzz.distance import Levenshtein

from rtvoice.engine.durable import key_name, write_atomically
from rtvoice.engine.models.piper.stages import Stage

log = logging.getLogger(__name__)

Int8Mode = Literal["auto", "on", "off"]
"""``auto``: int8 for the parts that pass the gate; ``on``: int8 for both parts whatever the gate says; ``off``: fp32,
nothing built."""

RECIPE_VERSION = 1
"""Goes up whenever what is quantised, how, or the calibration sentences change, so a kept build is made again."""

CALIBRATION_TEXTS = (
    "Warming up the voice, and measuring how long its speech is.",
    "Hello! This is the voice speaking while the rest of the sentence is still being made.",
    "I went to the store in the morning and bought three apples.",
    "Please call me back before five o'clock tomorrow afternoon.",
    "My sister bought a small house near the river last summer.",
    "The weather will be cold and windy until the end of the week.",
)
"""Plain sentences of the kind rtvoice speaks (its warm-up sentence, its page's greeting, its word-timing checks): the
activation ranges come from them, and the gate judges on them (words a recogniser's dictionary holds)."""

WER_MARGIN = 0.01
"""Most the int8 voice's word error rate on the calibration sentences may exceed fp32's."""
DECODER_DTW_DB = 1.0
"""Most DTW log-mel distance of the int8 decoder's audio from fp32's on the same latent (another noise seed is about
2.3 dB from itself; an mp3 at 64 kbit/s about 0.7 dB)."""
SILENCE_ADDED_DB = 1.0
"""Most the int8 decoder may raise the level of fp32's silent frames (``QUIET_BELOW_DB`` under its loudest)."""
QUIET_BELOW_DB = 40.0
RECOGNISER_RATE = 16_000


@dataclass(frozen=True)
class Verdict:
    """The gate's figures for one voice and whether each part passed (reasons for those that did not)."""

    encoder: bool
    decoder: bool
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Int8Parts:
    """What a voice runs: the int8 model of each part it takes (None: fp32), and the verdict behind the choice."""

    encoder: bytes | None
    decoder: bytes | None
    verdict: Verdict


@dataclass(frozen=True)
class Synthesis:
    """What the gate asks of the voice (``PiperVoice``'s stages with given encoder and decoder models)."""

    encoder_feeds: Callable[[str, int], dict[str, np.ndarray]]
    """The encoder's feeds for a calibration text and a seed."""
    latent: Callable[[str, int, bytes | None], np.ndarray]
    """A text's whole latent with its seed, on the given encoder model (None: fp32): [channels, frames]."""
    decode: Callable[[np.ndarray, bytes | None], np.ndarray]
    """A latent's audio on the given decoder model (None: fp32)."""
    latent_input: str
    sample_rate: int


# -- what is quantised ----------------------------------------------------------------------------------------------


def encoder_convolutions(stage: Stage, prior_mean: str, durations: str) -> list[str]:
    """The text encoder's convolutions: those before its projection to the prior's statistics, the one convolution
    that feeds the prior mean but not the durations. The duration predictor's (many tiny nodes, and the durations
    themselves) stay fp32."""
    import onnx  # needed only to build (a kept build is read without: ``prepare.py``)

    from rtvoice.engine.models.piper import graph

    model = onnx.load_from_string(stage.model)
    nodes = list(model.graph.node)
    producer = {t: i for i, n in enumerate(nodes) for t in n.output if t}
    to_durations = graph.ancestors({durations}, nodes, producer)
    projections = [
        i for i in graph.ancestors({prior_mean}, nodes, producer) - to_durations if nodes[i].op_type == "Conv"
    ]
    chosen: set[int] = set(projections)
    for index in projections:
        chosen |= {i for i in graph.ancestors(set(nodes[index].input), nodes, producer) if nodes[i].op_type == "Conv"}
    return [nodes[i].name for i in sorted(chosen)]


def decoder_early_convolutions(model_bytes: bytes, stages: int = 2) -> list[str]:
    """The convolutions of the decoder's first ``stages`` upsampling stages (HiFi-GAN's residual blocks after each of
    its first transposed convolutions); the later stages, at audio rate, add an audible noise floor in int8."""
    import onnx  # needed only to build

    nodes = list(onnx.load_from_string(model_bytes).graph.node)
    upsamples = [i for i, n in enumerate(nodes) if n.op_type == "ConvTranspose"]
    if len(upsamples) <= stages:
        return []
    return [n.name for i, n in enumerate(nodes) if n.op_type == "Conv" and upsamples[0] < i < upsamples[stages]]


def quantised(model_bytes: bytes, nodes: list[str], feeds: Sequence[dict[str, np.ndarray]]) -> bytes:
    """``model_bytes`` with ``nodes`` quantised to int8 (QDQ, per channel, 7-bit weights so AVX2's u8s8 products do
    not saturate), activation ranges from running ``feeds``."""
    import onnx  # needed only to build
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Feeds(CalibrationDataReader):
        def __init__(self) -> None:
            self.remaining = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.remaining, None)

    with tempfile.TemporaryDirectory(prefix="rtvoice-int8-") as directory:
        target = Path(directory) / "int8.onnx"
        quantize_static(
            onnx.load_from_string(model_bytes),  # it changes the model it is given
            target,
            Feeds(),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["Conv"],
            per_channel=True,
            reduce_range=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            nodes_to_quantize=nodes,
        )
        return target.read_bytes()


# -- how it is judged -----------------------------------------------------------------------------------------------


def log_mel_db(audio: np.ndarray, sample_rate: int, n_fft: int = 1024, hop: int = 256, mels: int = 80) -> np.ndarray:
    """Log-mel power spectrogram in dB, [frames, mels], floored 80 dB under its loudest bin."""
    padded = np.pad(audio.astype(np.float64), (n_fft // 2, n_fft // 2))
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop] * np.hanning(n_fft)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2

    def to_mel(hz: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + hz / 700.0)

    edges = 700.0 * (10.0 ** (np.linspace(0.0, to_mel(np.array(sample_rate / 2)), mels + 2) / 2595.0) - 1.0)
    bins = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)
    low, centre, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    filters = np.clip(np.minimum((bins - low) / (centre - low), (high - bins) / (high - centre)), 0.0, None)
    mel = power @ filters.T
    return 10.0 * np.log10(np.maximum(mel, mel.max() * 1e-8 + 1e-30))


def dtw_log_mel_db(reference: np.ndarray, test: np.ndarray, sample_rate: int) -> float:
    """Mean absolute log-mel difference (dB) of two renderings along their cheapest alignment (DTW with unit steps),
    per frame of the longer one."""
    a, b = log_mel_db(reference, sample_rate), log_mel_db(test, sample_rate)
    cost = np.abs(a[:, None, :] - b[None, :, :]).mean(axis=-1)
    total = np.full(cost.shape[1] + 1, np.inf)
    total[0] = 0.0
    for row in cost:
        # The row's recurrence min(diagonal, up, left) as a prefix minimum: left steps accumulate the row's costs.
        through = np.minimum(total[:-1], total[1:]) + row
        running = np.concatenate(([0.0], np.cumsum(row)))
        best = np.minimum.accumulate(through - running[1:]) + running[1:]
        total = np.concatenate(([np.inf], best))
    return float(total[-1] / max(len(a), len(b)))


def silence_added_db(reference: np.ndarray, test: np.ndarray, sample_rate: int) -> float:
    """How much higher ``test``'s level is than ``reference``'s over the 20 ms frames where ``reference`` is
    ``QUIET_BELOW_DB`` under its loudest frame (0 when it has none)."""
    frame = sample_rate // 50
    count = min(len(reference), len(test)) // frame
    ref = (reference[: count * frame].astype(np.float64).reshape(count, frame) ** 2).mean(axis=1)
    out = (test[: count * frame].astype(np.float64).reshape(count, frame) ** 2).mean(axis=1)
    quiet = ref < ref.max() * 10 ** (-QUIET_BELOW_DB / 10)
    if not quiet.any():
        return 0.0
    return float(10.0 * np.log10((out[quiet].mean() + 1e-20) / (ref[quiet].mean() + 1e-20)))


def words_of(text: str) -> list[str]:
    return re.sub(r"[^a-z' ]", " ", text.lower()).split()


def transcribe(audio: np.ndarray, sample_rate: int) -> list[str]:
    """The words PocketSphinx's US English model hears in ``audio`` (float, ``sample_rate``)."""
    from pocketsphinx import Decoder

    pcm = np.clip(soxr.resample(audio, sample_rate, RECOGNISER_RATE) * 32767, -32768, 32767).astype("<i2")
    decoder = Decoder(samprate=RECOGNISER_RATE, loglevel="ERROR")
    decoder.start_utt()
    decoder.process_raw(pcm.tobytes(), full_utt=True)
    decoder.end_utt()
    hypothesis = decoder.hyp()
    return [] if hypothesis is None else str(hypothesis.hypstr).split()


def word_error_rate(texts: Sequence[str], heard: Sequence[list[str]]) -> float:
    """Word errors (substitutions, insertions, deletions) over the words of ``texts``."""
    errors = sum(Levenshtein.distance(words_of(text), words) for text, words in zip(texts, heard, strict=True))
    return errors / max(1, sum(len(words_of(text)) for text in texts))


def recogniser_missing() -> str | None:
    """Why no word error rate can be had here, or None."""
    try:
        import pocketsphinx  # noqa: F401
    except ImportError:
        return "no recogniser to judge int8 by (install rtvoice's int8 extra: pocketsphinx)"
    return None


def judge(synthesis: Synthesis, encoder: bytes, decoder: bytes | None) -> Verdict:
    """The gate: the decoder part on fp32's latents (DTW, silences), then the voice with the parts that pass against
    fp32 (word error rate). ``decoder`` None: the voice has no early decoder stages to quantise."""
    reasons: list[str] = []
    figures: dict[str, float] = {}
    rate = synthesis.sample_rate
    latents = [synthesis.latent(text, seed, None) for seed, text in enumerate(CALIBRATION_TEXTS)]
    fp32_audio = [synthesis.decode(latent, None) for latent in latents]
    decoder_ok = decoder is not None
    if decoder is not None:
        int8_audio = [synthesis.decode(latent, decoder) for latent in latents]
        distance = max(dtw_log_mel_db(a, b, rate) for a, b in zip(fp32_audio, int8_audio, strict=True))
        added = max(silence_added_db(a, b, rate) for a, b in zip(fp32_audio, int8_audio, strict=True))
        figures.update(decoder_dtw_db=round(distance, 3), decoder_silence_added_db=round(added, 2))
        if not distance <= DECODER_DTW_DB:
            decoder_ok = False
            reasons.append(f"decoder: DTW log-mel {distance:.2f} dB from fp32 (at most {DECODER_DTW_DB})")
        if not added <= SILENCE_ADDED_DB:
            decoder_ok = False
            reasons.append(f"decoder: {added:.1f} dB added in silences (at most {SILENCE_ADDED_DB})")
    missing = recogniser_missing()
    if missing is not None:
        return Verdict(False, False, [*reasons, missing], figures)
    fp32_wer = word_error_rate(CALIBRATION_TEXTS, [transcribe(audio, rate) for audio in fp32_audio])
    chosen_decoder = decoder if decoder_ok else None
    int8_heard = [
        transcribe(synthesis.decode(synthesis.latent(text, seed, encoder), chosen_decoder), rate)
        for seed, text in enumerate(CALIBRATION_TEXTS)
    ]
    int8_wer = word_error_rate(CALIBRATION_TEXTS, int8_heard)
    figures.update(fp32_wer=round(fp32_wer, 4), int8_wer=round(int8_wer, 4))
    if int8_wer <= fp32_wer + WER_MARGIN:
        return Verdict(True, decoder_ok, reasons, figures)
    reasons.append(f"word error rate {int8_wer:.3f} against fp32's {fp32_wer:.3f} (at most {WER_MARGIN} more)")
    return Verdict(False, False, reasons, figures)


# -- built once, kept -----------------------------------------------------------------------------------------------


def build_key(weights_sha256: str, decoder_layout: str) -> dict[str, Any]:
    """What a build follows from: the weights, the decoder's layout (``layout.py``), the recipe, onnxruntime."""
    return {
        "weights_sha256": weights_sha256,
        "decoder_layout": decoder_layout,
        "recipe": RECIPE_VERSION,
        "onnxruntime": onnxruntime.__version__,
    }


def parts(
    voice_id: str,
    mode: Int8Mode,
    directory: Path | None,
    key: dict[str, Any],
    encoder_stage: Stage,
    prior_mean: str,
    durations: str,
    decoder_model: bytes,
    synthesis: Synthesis,
) -> Int8Parts:
    """The int8 parts ``mode`` asks for: built (with the gate's verdict) and kept in ``directory`` under ``key``, or
    read back from it. Any failure leaves the voice fp32, with the reason in the log."""
    fp32 = Int8Parts(None, None, Verdict(False, False))
    if mode == "off":
        return fp32
    missing = recogniser_missing()
    if mode == "auto" and missing is not None:  # the gate could not pass: building would only cost the start
        log.info("voice %s: fp32 (%s)", voice_id, missing)
        return fp32
    place = None if directory is None else kept_place(directory, key)
    try:
        kept = read_kept(place, key)
        if kept is None:
            kept = _build(voice_id, encoder_stage, prior_mean, durations, decoder_model, synthesis)
            keep(place, key, kept)
        else:
            log.info("voice %s: int8 parts as built before (%s)", voice_id, place)
    except Exception as error:  # onnxruntime's quantiser and the recogniser each fail their own way
        log.warning("voice %s: fp32 (int8 could not be built: %s)", voice_id, error)
        return fp32
    verdict = kept.verdict
    use_encoder = kept.encoder is not None and (mode == "on" or verdict.encoder)
    use_decoder = kept.decoder is not None and (mode == "on" or verdict.decoder)
    log.info(
        "voice %s: encoder %s, decoder stages 0-1 %s (piper_int8=%s; gate: %s%s)",
        voice_id,
        "int8" if use_encoder else "fp32",
        "int8" if use_decoder else "fp32",
        mode,
        ", ".join(f"{name} {value}" for name, value in verdict.figures.items()) or "not judged",
        "".join(f"; {reason}" for reason in verdict.reasons),
    )
    if mode == "on" and verdict.reasons:
        log.warning("voice %s: int8 taken though the gate says: %s", voice_id, "; ".join(verdict.reasons))
    return Int8Parts(kept.encoder if use_encoder else None, kept.decoder if use_decoder else None, verdict)


def _build(
    voice_id: str,
    encoder_stage: Stage,
    prior_mean: str,
    durations: str,
    decoder_model: bytes,
    synthesis: Synthesis,
) -> Int8Parts:
    log.info("voice %s: building its int8 parts (once for these weights and this onnxruntime)", voice_id)
    encoder_nodes = encoder_convolutions(encoder_stage, prior_mean, durations)
    encoder = quantised(
        encoder_stage.model,
        encoder_nodes,
        [synthesis.encoder_feeds(text, seed) for seed, text in enumerate(CALIBRATION_TEXTS)],
    )
    decoder_nodes = decoder_early_convolutions(decoder_model)
    decoder = None
    if decoder_nodes:
        latents = [synthesis.latent(text, seed, None) for seed, text in enumerate(CALIBRATION_TEXTS)]
        decoder = quantised(
            decoder_model, decoder_nodes, [{synthesis.latent_input: latent[None]} for latent in latents]
        )
    return Int8Parts(encoder, decoder, judge(synthesis, encoder, decoder))


def kept_place(directory: Path, key: dict[str, Any]) -> Path:
    """Where the build for ``key`` is kept under ``directory``."""
    return directory / key_name(key)


def read_kept(place: Path | None, key: dict[str, Any]) -> Int8Parts | None:
    """The build kept at ``place`` for ``key``; None when there is none (or it cannot be read)."""
    if place is None:
        return None
    try:
        kept = json.loads((place / "verdict.json").read_text(encoding="utf-8"))
        if kept["key"] != key:
            return None
        encoder = (place / "encoder.onnx").read_bytes()
        decoder_path = place / "decoder.onnx"
        decoder = decoder_path.read_bytes() if decoder_path.exists() else None
        return Int8Parts(encoder, decoder, Verdict(**kept["verdict"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not built yet, or not readable: build


def keep(place: Path | None, key: dict[str, Any], built: Int8Parts) -> None:
    """``built`` kept at ``place`` for ``key``: each file whole or not at all (a server starting beside this one may
    read them), the verdict last, as it is what a reader looks for first."""
    if place is None:
        return
    try:
        place.mkdir(parents=True, exist_ok=True)
        files: dict[str, bytes] = {"encoder.onnx": built.encoder or b""}
        if built.decoder is not None:
            files["decoder.onnx"] = built.decoder
        files["verdict.json"] = json.dumps({"key": key, "verdict": asdict(built.verdict)}, indent=1).encode()
        for name, data in files.items():
            write_atomically(place / name, data)
    except OSError as error:
        log.warning("could not keep the int8 parts in %s: %s", place, error)
