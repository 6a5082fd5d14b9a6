"""The embedded Piper voice, split into streamable stages: equality with the whole graph, chunking, batching."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest

from rtvoice.engine.models.base import SynthesisOptions
from rtvoice.engine.models.piper import context, graph, measure, pace, prepare
from rtvoice.engine.models.piper.measure import SentenceStages
from rtvoice.engine.models.piper.voice import PiperVoice
from rtvoice.engine.voices import embedded_voice_path
from tests.audio import SAME_SPEECH_DB, rms, snr_db

SENTENCE = "The quick brown fox jumps over the lazy dog near the river, and then it runs far away into the woods."


def run_session(voice: PiperVoice, text: str, seed: int, speed: float = 1.0) -> np.ndarray:
    session = voice.open_session(SynthesisOptions(seed=seed, speed=speed))
    session.add_segment(text)
    audio = []
    while (step := session.next_step()) is not None:
        (result,) = voice.run([step.payload])
        out = session.complete(step, result)
        if out is not None:
            audio.append(out)
    return np.concatenate(audio)


def whole_segment(voice: PiperVoice, text: str, seed: int) -> np.ndarray:
    """The same segment through the three stages in one pass each, with the same noise."""
    return voice.sentence_stages(text, seed).audio


def test_split_points_come_from_the_graph_structure() -> None:
    model = onnx.load(str(embedded_voice_path()))
    graphs = graph.split(model)
    conv_pre = next(n for n in model.graph.node if graphs.latent in n.input)
    assert conv_pre.op_type == "Conv"
    assert graphs.latent in graphs.flow.outputs and graphs.decoder.inputs == [graphs.latent]
    assert graphs.prior_noise in graphs.flow.inputs and graphs.duration_noise
    # Context is derived from the convolutions: positive and far below a chunk.
    assert 0 < graph.context_frames(graphs.decoder) < 32 and 0 < graph.context_frames(graphs.flow) < 64


def test_split_graph_equals_the_original(piper_voice: PiperVoice) -> None:
    """With the noise off, encoder -> flow -> decoder reproduces the unsplit ONNX model."""
    ids = np.array([piper_voice.phoneme_ids(SENTENCE)], dtype=np.int64)
    lengths = np.array([ids.shape[1]], dtype=np.int64)
    scales = np.array([0.0, 1.0, 0.0], dtype=np.float32)
    original = onnxruntime.InferenceSession(str(embedded_voice_path()), providers=["CPUExecutionProvider"])
    (reference,) = original.run(None, {"input": ids, "input_lengths": lengths, "scales": scales})
    g = piper_voice.graphs
    feeds = {
        "input": ids,
        "input_lengths": lengths,
        "scales": scales,
        **{
            name: np.zeros((1, c, ids.shape[1]), np.float32)
            for name, c in zip(g.duration_noise, piper_voice.duration_noise_channels, strict=True)
        },
    }
    encoded = dict(zip(g.encoder.outputs, piper_voice.encoder.run(None, feeds), strict=True))
    flow_feeds = {k: v for k, v in encoded.items() if k in g.flow.inputs}
    flow_feeds[g.prior_noise] = np.zeros_like(encoded[g.prior_mean])
    (latent,) = piper_voice.flow.run(None, flow_feeds)
    (audio,) = piper_voice.decoder.run(None, {g.latent: latent})
    assert audio.size == reference.size
    assert snr_db(reference.reshape(-1), audio.reshape(-1)) >= 60


def streamed_audio(voice: PiperVoice, stages: SentenceStages, flow_frames: int, decoder_frames: int) -> np.ndarray:
    """A sentence's audio made in flow windows of ``flow_frames`` and decoder chunks of ``decoder_frames``, at the
    voice's measured contexts."""
    latent = context.tiled(stages.flow, stages.frames, 1, flow_frames, voice.flow_context)

    def decode(lo: int, hi: int) -> np.ndarray:
        (audio,) = voice.decoder.run(None, {voice.graphs.latent: latent[None, :, lo:hi]})
        return audio.reshape(-1)

    return context.tiled(decode, stages.frames, voice.hop, decoder_frames, voice.decoder_context)


def test_context_is_measured_within_the_graphs_reach(piper_voice: PiperVoice) -> None:
    """Each stage's context is the least at which a sentence made in the plan's smallest chunks sounds as its whole
    run (at load, on the voice's own speech), at most what its convolutions reach. Other sentences and seeds at that
    context match their whole runs too, in the smallest chunks and in flow windows of one frame, the worst the plan
    can make: far inside what the tests take as the same speech."""
    g = piper_voice.graphs
    assert 0 < piper_voice.flow_context <= graph.context_frames(g.flow)
    assert 0 < piper_voice.decoder_context <= graph.context_frames(g.decoder)
    smallest = piper_voice.geometry.first_chunk
    long_one, short_one = (
        piper_voice.sentence_stages(text, seed)
        for seed, text in ((3, SENTENCE), (4, "One moment while I look that up for you. It seems the card expired."))
    )
    in_smallest = [
        snr_db(stages.audio, streamed_audio(piper_voice, stages, smallest, smallest))
        for stages in (long_one, short_one)
    ]
    in_single_frames = snr_db(short_one.audio, streamed_audio(piper_voice, short_one, 1, smallest))
    print(
        f"streamed against whole: {min(in_smallest):.1f} dB or more in the smallest chunks, {in_single_frames:.1f} "
        "in 1-frame flow windows"
    )
    assert min(in_smallest) >= context.TOLERANCE_DB - 20  # measured on one sentence: others within 20 dB
    assert in_single_frames >= SAME_SPEECH_DB + 10


def test_least_context_of_a_known_filter() -> None:
    """A stage that is a filter with taps decaying away from the centre: the least context that meets the tolerance,
    and one frame less does not; the full reach is exact."""
    signal = np.random.default_rng(5).standard_normal(400)
    reach = 20
    taps = np.exp(-np.abs(np.arange(-reach, reach + 1)) / 2.0)

    def run(lo: int, hi: int) -> np.ndarray:
        chunk = signal[lo:hi]
        return np.convolve(chunk, taps, mode="full")[reach : reach + len(chunk)]  # zeros past the chunk's ends

    whole = run(0, len(signal))
    power = float(np.mean(whole**2))

    def streamed(frames_around: int) -> np.ndarray:
        return context.tiled(run, len(signal), 1, 10, frames_around)

    least = context.least_context(streamed, whole, reach, tolerance_db=60)
    assert 0 < least < reach
    assert context.below_db(power, whole, streamed(least)) >= 60 > context.below_db(power, whole, streamed(least - 1))
    assert np.allclose(streamed(reach), whole, rtol=0, atol=1e-12)
    assert context.least_context(streamed, whole, reach, tolerance_db=math.inf) == reach


def test_measured_contexts_are_kept_for_the_same_weights_and_measure(tmp_path: Path) -> None:
    """What a measure gave is read back for the same key; another key, a spoilt file or no directory measures again,
    and a directory that cannot be written still gives the measure."""
    measured: list[int] = []

    def measured_now() -> list[int]:
        measured.append(1)
        return [27, 10]

    key = {"weights_sha256": "ab" * 32, "version": context.MEASURE_VERSION}
    assert measure.remembered(tmp_path, key, measured_now) == [27, 10] and len(measured) == 1
    assert measure.remembered(tmp_path, key, measured_now) == [27, 10] and len(measured) == 1
    assert measure.remembered(tmp_path, {**key, "version": key["version"] + 1}, measured_now) == [27, 10]
    assert len(measured) == 2
    for kept in tmp_path.glob("*.json"):
        kept.write_text("{not json")
    assert measure.remembered(tmp_path, key, measured_now) == [27, 10] and len(measured) == 3
    assert measure.remembered(None, key, measured_now) == [27, 10] and len(measured) == 4
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert measure.remembered(blocked, key, measured_now) == [27, 10] and len(measured) == 5
    assert not list(tmp_path.glob("*.tmp"))


def test_a_kept_split_is_read_back_whole_and_a_spoilt_one_made_again(tmp_path: Path) -> None:
    """``prepare.prepared`` keeps what it made (the stages, their interfaces, the 2-D decoder) and reads back the same;
    a manifest for other weights or code, or one that is not JSON, makes it again; a place it cannot write still gives
    the split."""
    model_bytes = embedded_voice_path().read_bytes()
    weights = hashlib.sha256(model_bytes).hexdigest()
    made = prepare.prepared(model_bytes, weights, tmp_path)
    (manifest,) = tmp_path.glob(f"*/{prepare.MANIFEST}")
    assert made.two_d_decoder is not None and made.decoder_channels and made.duration_noise_channels
    assert prepare.prepared(model_bytes, weights, tmp_path) == made
    kept = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**kept, "key": {**kept["key"], "splitter_sha256": "0" * 64}}))
    assert prepare.prepared(model_bytes, weights, tmp_path) == made
    assert json.loads(manifest.read_text())["key"] == kept["key"], "not made and kept again"
    manifest.write_text("{not json")
    # Made again, it removes the splits of these weights by other code; another voice's stays.
    superseded, other_voice = tmp_path / "superseded", tmp_path / "other-voice"
    for folder, changed in ((superseded, {"onnx": "0.0"}), (other_voice, {"weights_sha256": "ab" * 32})):
        folder.mkdir()
        (folder / prepare.MANIFEST).write_text(json.dumps({"key": {**kept["key"], **changed}}))
    assert prepare.prepared(model_bytes, weights, tmp_path) == made
    assert not superseded.exists() and other_voice.exists()
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert prepare.prepared(model_bytes, weights, blocked) == made
    assert not list(tmp_path.glob("*/.*.tmp"))


def kept_measures(directory: Path) -> dict[str | None, dict[str, Any]]:
    """What ``measure.remembered`` keeps in ``directory``, by what each is (None: the context frames)."""
    files = [json.loads(path.read_text()) for path in directory.glob("*.json")]
    return {kept["key"].get("what"): kept for kept in files}


def test_a_voice_keeps_what_it_measured_and_a_restart_reads_it_back(
    piper_voice: PiperVoice,
    piper_measured_dir: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A voice loaded with a directory for them (the fixture's, empty before it) keeps what it measured there: its
    contexts under its weights' digest, its decoder's layout under the machine's processor and cores too (reading
    them back is ``measure.remembered``'s, tested above). Loaded again, it reads them instead of timing them, and
    makes the exported decoder's session only where that is the decoder it runs."""
    kept = kept_measures(piper_measured_dir)
    weights = hashlib.sha256(embedded_voice_path().read_bytes()).hexdigest()
    assert kept[None]["key"]["weights_sha256"] == weights
    assert kept[None]["value"] == [piper_voice.flow_context, piper_voice.decoder_context]
    layout_key = kept["decoder layout"]["key"]
    assert layout_key["weights_sha256"] == weights and layout_key["processor"] and layout_key["cores"] >= 1
    assert kept["decoder layout"]["value"] in ("2-D", "as exported")
    made: list[Any] = []
    session_of = onnxruntime.InferenceSession

    def counted(model: Any, *args: Any, **kwargs: Any) -> onnxruntime.InferenceSession:
        made.append(model)
        return session_of(model, *args, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", counted)
    with caplog.at_level(logging.INFO, logger="rtvoice.engine.models.piper.measure"):
        again = PiperVoice(embedded_voice_path(), measured_dir=piper_measured_dir, wide_threads=2)
    monkeypatch.undo()
    exported_sessions = sum(model == again.graphs.decoder.model for model in made)
    runs_exported = kept["decoder layout"]["value"] != "2-D"
    # Where it runs the exported decoder: its session, and the one on both cores that timing its first calls opens
    # (kept or not). Where it runs the 2-D one: none.
    assert exported_sessions == (2 if runs_exported else 0), exported_sessions
    read_back = [r.getMessage() for r in caplog.records if "as measured before" in r.getMessage()]
    assert len(read_back) == 2 and not [r for r in caplog.records if "ms as exported" in r.getMessage()], read_back
    assert (again.flow_context, again.decoder_context) == (piper_voice.flow_context, piper_voice.decoder_context)
    # The first calls on both cores were timed now, and kept: the kinds the voice runs wide.
    assert sorted(kept_measures(piper_measured_dir)["first calls on every core"]["value"]) == sorted(again.wide_kinds())


def test_chunked_decode_equals_whole_decode(piper_voice: PiperVoice) -> None:
    streamed = run_session(piper_voice, SENTENCE, seed=7)
    whole = whole_segment(piper_voice, SENTENCE, seed=7)
    assert len(streamed) == len(whole)
    snr = snr_db(whole, streamed)
    print(f"chunked vs whole decode: {snr:.1f} dB")
    assert snr >= 40


def test_unbudgeted_plan_starts_small_then_takes_the_largest_chunks(piper_voice: PiperVoice) -> None:
    """Without a scheduler's budget (no costs known): a small first chunk, then chunks up to the cap."""
    session = piper_voice.open_session(SynthesisOptions(seed=1))
    session.add_segment(SENTENCE)
    sizes = []
    while (step := session.next_step()) is not None:
        (result,) = piper_voice.run([step.payload])
        audio = session.complete(step, result)
        if audio is not None:
            sizes.append(len(audio) // piper_voice.hop)
    geometry = piper_voice.geometry
    assert sizes[0] == geometry.first_chunk
    assert max(sizes) <= geometry.max_chunk * 1.5 and sizes[1] > sizes[0]


def test_seed_makes_speech_reproducible(piper_voice: PiperVoice) -> None:
    first = run_session(piper_voice, SENTENCE, seed=3)
    assert np.array_equal(first, run_session(piper_voice, SENTENCE, seed=3))
    other = run_session(piper_voice, SENTENCE, seed=4)
    assert len(other) != len(first) or not np.array_equal(other, first)


@pytest.mark.parametrize("speed", [0.5, 0.8, 1.5, 2.0, 4.0])
def test_speed_gives_one_over_speed_of_the_frames(piper_voice: PiperVoice, speed: float) -> None:
    """A sentence at ``speed`` is 1/speed of its length at speed 1, to a frame: its frames are picked from the same
    encoding (``pace.py``), so the speech is the same voice, not another draw."""
    hop = piper_voice.hop
    normal = run_session(piper_voice, SENTENCE, seed=1)
    paced = run_session(piper_voice, SENTENCE, seed=1, speed=speed)
    assert abs(len(paced) - len(normal) / speed) <= hop and len(paced) % hop == 0
    assert rms(paced) > 0.5 * rms(normal)


def test_pace_keeps_every_token_until_it_cannot_and_hits_the_sum() -> None:
    durations = np.array([1, 2, 1, 6, 1, 1, 3, 1, 8, 1, 2, 1, 1, 5, 1, 0, 0])
    for speed in (0.25, 0.5, 1.5, 2.0, 2.2):
        paced = pace.paced_durations(durations, speed)
        assert paced.sum() == np.floor(durations.sum() / speed + 0.5), speed
        assert ((paced > 0) == (durations > 0)).all(), "a token lost or a pad given frames"
    fastest = pace.paced_durations(durations, 4.0)  # 9 frames for 15 spoken tokens: some get none
    assert fastest.sum() == 9 and not fastest[durations == 0].any()
    picks = pace.frame_picks(np.array([2, 0, 3]), np.array([1, 0, 2]))
    assert picks.tolist() == [0, 2, 2]  # token 0's first frame, then token 2's (frames 2-4) twice


def test_unspeakable_segment_gives_no_audio(piper_voice: PiperVoice) -> None:
    session = piper_voice.open_session(SynthesisOptions(seed=1))
    session.add_segment("...")
    step = session.next_step()
    (result,) = piper_voice.run([step.payload])
    assert session.complete(step, result) is None and session.idle and session.segments_done == 1


@pytest.mark.parametrize("kind", ["encode", "flow", "decode"])
def test_batched_steps_equal_single_steps(piper_voice: PiperVoice, kind: str) -> None:
    """Streams of different lengths in one call give what each gives alone (per-stream seeded noise)."""
    texts = ["Hello there.", SENTENCE, "A somewhat longer sentence, so the batch needs padding here and there."]

    def first_step(text: str, seed: int):  # type: ignore[no-untyped-def]
        session = piper_voice.open_session(SynthesisOptions(seed=seed))
        session.add_segment(text)
        while True:
            step = session.next_step()
            if step.kind == kind:
                return step
            (result,) = piper_voice.run([step.payload])
            session.complete(step, result)

    if kind == "decode":  # decoder batches share a chunk length, as the scheduler's batch key requires
        steps = [first_step(t, s) for t, s in zip(texts, (1, 2, 3), strict=True)]
        steps = [s for s in steps if s.batch_key == steps[1].batch_key]
        assert len(steps) >= 2
    else:
        steps = [first_step(t, s) for t, s in zip(texts, (1, 2, 3), strict=True)]
    singles = [piper_voice.run([s.payload])[0] for s in steps]
    # Same seeds again: the encoder draws noise from each stream's generator.
    if kind == "encode":
        steps = [first_step(t, s) for t, s in zip(texts, (1, 2, 3), strict=True)]
    batched = piper_voice.run([s.payload for s in steps])
    for single, batch in zip(singles, batched, strict=True):
        if kind == "encode":
            assert single.frames == batch.frames
            for name, value in single.frame_inputs.items():
                if value.ndim == 2:
                    assert snr_db(value, batch.frame_inputs[name]) >= 60, name
        else:
            assert single.shape == batch.shape
            assert snr_db(single, batch) >= 60
