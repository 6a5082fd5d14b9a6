"""int8 parts of a Piper voice (engine/models/piper/int8.py), on the embedded voice: what is quantised, that a
quantised decoder still streams in chunks that join as its whole run, the gate's measures, and the kept build that
``piper_int8`` chooses from."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest

from rtvoice.engine.models.piper import context, graph, int8
from rtvoice.engine.models.piper.int8 import Int8Parts, Verdict
from rtvoice.engine.models.piper.stages import Stage

SENTENCE = "She opened the window and listened to the birds in the garden."


@pytest.fixture(scope="module")
def stages(piper_voice: Any) -> Any:
    return piper_voice.sentence_stages(SENTENCE, seed=3)


@pytest.fixture(scope="module")
def int8_decoder(piper_voice: Any, stages: Any) -> bytes:
    """The embedded voice's decoder with its first two stages in int8, calibrated on one sentence (the real build
    calibrates on ``CALIBRATION_TEXTS``; one keeps this test short)."""
    model = piper_voice.graphs.decoder.model
    nodes = int8.decoder_early_convolutions(model)
    return int8.quantised(model, nodes, [{piper_voice.graphs.latent: stages.latent[None]}])


def test_the_text_encoders_convolutions_are_chosen_not_the_duration_predictors(piper_voice: Any) -> None:
    graphs = piper_voice.graphs
    chosen = int8.encoder_convolutions(graphs.encoder, graphs.prior_mean, graphs.durations)
    convolutions = [n.name for n in onnx.load_from_string(graphs.encoder.model).graph.node if n.op_type == "Conv"]
    # Chosen by the graph's structure; the export's names say what each is.
    assert chosen == [name for name in convolutions if name.startswith("/enc_p/")]
    assert len(chosen) == 37  # 6 layers x (q, k, v, o, two FFN convolutions) + the projection


def test_the_decoders_first_two_stages_are_chosen(piper_voice: Any) -> None:
    chosen = int8.decoder_early_convolutions(piper_voice.graphs.decoder.model)
    assert chosen == [f"/dec/resblocks.{block}/convs.{conv}/Conv" for block in range(6) for conv in range(2)]


def test_an_int8_decoder_streams_in_chunks_that_join_as_its_whole_run(
    piper_voice: Any, stages: Any, int8_decoder: bytes
) -> None:
    """Static quantisation fixes every scale at build time, so a chunk with the decoder's full reach as context is
    its whole run's slice up to rounding: a float that chunking moves by one ulp can cross a quantisation step, so
    the joins lie about 40 dB under the speech (fp32's, over 100 dB; figures: docs/decisions.md), far under the
    int8 part's own distance from fp32."""
    kinds = {n.op_type for n in onnx.load_from_string(int8_decoder).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= kinds
    session = onnxruntime.InferenceSession(int8_decoder, providers=["CPUExecutionProvider"])
    hop, latent_name = piper_voice.hop, piper_voice.graphs.latent

    def decode(lo: int, hi: int) -> np.ndarray:
        (audio,) = session.run(None, {latent_name: stages.latent[None, :, lo:hi]})
        return np.asarray(audio).reshape(-1)

    whole = decode(0, stages.frames)
    reach = graph.context_frames(Stage(int8_decoder, [latent_name], piper_voice.graphs.decoder.outputs))
    chunked = context.tiled(decode, stages.frames, hop, 12, reach)
    power = float(np.mean(whole.astype(np.float64) ** 2))
    joins_db = context.below_db(power, whole, chunked)
    assert joins_db >= 30
    # Close to fp32 on the same latent, and not silence.
    snr = context.below_db(float(np.mean(stages.audio.astype(np.float64) ** 2)), stages.audio, whole)
    assert 15 < snr < joins_db, snr


def test_the_gates_measures(piper_voice: Any, stages: Any, int8_decoder: bytes) -> None:
    rate = piper_voice.info.sample_rate
    audio = stages.audio
    assert int8.dtw_log_mel_db(audio, audio, rate) == 0.0
    # A delay is what DTW aligns away; noise is not.
    delayed = np.concatenate([np.zeros(rate // 20, dtype=audio.dtype), audio])
    noisy = audio + np.random.default_rng(0).normal(0, 0.01, audio.shape).astype(audio.dtype)
    assert int8.dtw_log_mel_db(audio, delayed, rate) < 0.5 * int8.dtw_log_mel_db(audio, noisy, rate)
    assert int8.silence_added_db(audio, noisy, rate) > 10
    assert abs(int8.silence_added_db(audio, audio, rate)) < 1e-9
    other_seed = piper_voice.sentence_stages(SENTENCE, seed=4).audio
    assert 1.0 < int8.dtw_log_mel_db(audio, other_seed, rate) < 5.0  # a new noise seed: about 2.3 dB
    assert int8.word_error_rate(["It was a cold day."], [["it", "was", "a", "bold", "day"]]) == pytest.approx(0.2)


def test_the_kept_build_is_reused_and_auto_takes_only_what_passed(
    piper_voice: Any, int8_decoder: bytes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    graphs = piper_voice.graphs
    key = int8.build_key("weights", "2-D")
    verdict = Verdict(encoder=True, decoder=False, reasons=["decoder: DTW log-mel 1.80 dB from fp32 (at most 1.0)"])
    int8.keep(int8.kept_place(tmp_path, key), key, Int8Parts(graphs.encoder.model, int8_decoder, verdict))

    def nothing_to_build(*_: Any) -> Any:
        raise AssertionError("a kept build was built again")

    synthesis = int8.Synthesis(nothing_to_build, nothing_to_build, nothing_to_build, graphs.latent, 22050)

    def choose(mode: int8.Int8Mode, key: dict[str, Any] = key) -> Int8Parts:
        return int8.parts("v", mode, tmp_path, key, graphs.encoder, graphs.prior_mean, graphs.durations, b"", synthesis)

    with caplog.at_level(logging.INFO, logger="rtvoice.engine.models.piper.int8"):
        auto = choose("auto")
    assert (auto.encoder, auto.decoder, auto.verdict) == (graphs.encoder.model, None, verdict)
    assert "as built before" in caplog.text and "decoder stages 0-1 fp32" in caplog.text and "1.80 dB" in caplog.text
    on = choose("on")
    assert (on.encoder, on.decoder) == (graphs.encoder.model, int8_decoder)
    assert choose("off").encoder is None
    # Another onnxruntime (or weights, or recipe) is another key: built again, here refused, so fp32.
    caplog.clear()
    other = choose("auto", {**key, "onnxruntime": "0.0"})
    assert (other.encoder, other.decoder) == (None, None)
    assert "int8 could not be built" in caplog.text
