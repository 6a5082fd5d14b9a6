"""The voice-agent frameworks' own TTS clients, unmodified, pointed at rtvoice by URL alone.

- Pipecat (pipecat-ai): a pipeline with each of ``OpenAITTSService``, ``PiperHttpTTSService`` and
  ``CartesiaTTSService`` (fed like an LLM's output: sentence and token aggregation);
- LiveKit Agents: ``openai.TTS`` (``synthesize``, and the ``StreamAdapter`` an AgentSession wraps it in) and
  ``cartesia.TTS`` (streaming over the WebSocket, and ``synthesize`` over /tts/bytes).

Each checks that real audio arrived at the rate the client asked for: its length against what the engine
makes of the same text (Piper's durations are drawn, so close rather than equal) and its level. Where the client
takes word timestamps (both Cartesia clients), they must come one per word, in order, inside the audio, and close
to where an independent forced aligner (PocketSphinx) finds the words in the audio the client received.
"""

from __future__ import annotations

import asyncio
import re
import statistics
from typing import Any

import aiohttp
import numpy as np
import pytest

from testkit.alignment import forced_alignment
from tests.conftest import Server
from tests.engine_output import EMBEDDED_VOICE_RATE, synthesize

pytest.importorskip("pipecat")
pytest.importorskip("livekit.agents")

from livekit.agents import tts as livekit_tts  # noqa: E402
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT  # noqa: E402
from livekit.plugins import cartesia as livekit_cartesia  # noqa: E402
from livekit.plugins import openai as livekit_openai  # noqa: E402
from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    ErrorFrame,
    Frame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.task import PipelineParams  # noqa: E402
from pipecat.pipeline.worker import PipelineWorker  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.services.cartesia.tts import CartesiaTTSService  # noqa: E402
from pipecat.services.openai.tts import OpenAITTSService  # noqa: E402
from pipecat.services.piper.tts import PiperHttpTTSService  # noqa: E402
from pipecat.services.tts_service import TextAggregationMode  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

TEXT = "Hello there. How can I help you today?"
TOKENS = ["Hel", "lo the", "re. How", " can I", " help", " you to", "day?"]
"""TEXT as an LLM streams it."""
SPOKEN = "hello|there|how|can|i|help|you|today"
"""TEXT's words as the aligner's dictionary spells them."""
WORDS = TEXT.split()
MAX_MAE_S = 0.08
"""The target for word starts against the forced alignment (about 30-40 ms measured: bench/word_timing.py)."""
API_KEY = "sk-rtvoice-test"


@pytest.fixture(scope="module")
def reference_s() -> float:
    """Seconds of audio the engine makes of TEXT."""
    return len(synthesize(TEXT, seed=1)) / EMBEDDED_VOICE_RATE


def check(pcm: bytes, rate: int, reference_s: float) -> None:
    samples = np.frombuffer(pcm, dtype="<i2")
    assert 0.8 < len(samples) / rate / reference_s < 1.25, (len(samples) / rate, reference_s)
    assert np.sqrt(np.mean((samples / 32767.0) ** 2)) > 0.02


def check_word_starts(pcm: bytes, starts_s: list[float], relative: bool = False) -> None:
    """Word starts (seconds in ``pcm``, 16 kHz) in order and near the forced alignment's; ``relative``: known only
    up to an offset (compared from the first word on)."""
    assert len(starts_s) == len(WORDS) and starts_s == sorted(starts_s), starts_s
    origin_s = starts_s[0] if relative else 0.0  # Pipecat's clock starts before the audio, by however long it took
    assert 0 <= starts_s[0] - origin_s and starts_s[-1] - origin_s < len(pcm) / 2 / 16000, (starts_s, len(pcm))
    aligned = forced_alignment(np.frombuffer(pcm, dtype="<i2"), SPOKEN.split("|"))
    if relative:
        starts_s = [s - starts_s[0] + aligned[0] for s in starts_s]
    assert statistics.fmean(abs(s - a) for s, a in zip(starts_s, aligned, strict=True)) <= MAX_MAE_S, (
        starts_s,
        aligned,
    )


# -- Pipecat ---------------------------------------------------------------------------------------------------


class Collector(FrameProcessor):
    """The pipeline's sink: keeps the TTS audio frames, the spoken text (what reaches the LLM context), errors."""

    def __init__(self) -> None:
        super().__init__()
        self.audio: list[TTSAudioRawFrame] = []
        self.texts: list[str] = []
        self.text_pts: list[int | None] = []
        """Each spoken text's presentation time (ns): set from word timestamps, when the service has them."""
        self.errors: list[ErrorFrame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.audio.append(frame)
        elif isinstance(frame, TTSTextFrame):
            self.texts.append(frame.text)
            self.text_pts.append(frame.pts)
        elif isinstance(frame, ErrorFrame):
            self.errors.append(frame)
        await self.push_frame(frame, direction)


async def run_pipeline(tts: Any, frames: list[Frame], rate: int, collector: Collector | None = None) -> bytes:
    """``tts`` in a pipeline at ``rate``: the frames in, then EndFrame, which waits for the audio to finish.
    Returns the audio; checks that the spoken text came out as TTSTextFrames (what the LLM context keeps)."""
    collector = collector or Collector()
    worker = PipelineWorker(
        Pipeline([tts, collector]), params=PipelineParams(audio_out_sample_rate=rate), enable_rtvi=False
    )
    await worker.queue_frames([*frames, EndFrame()])
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await asyncio.wait_for(runner.run(), 60)
    assert not collector.errors, collector.errors
    assert collector.audio and {frame.sample_rate for frame in collector.audio} == {rate}
    assert " ".join(text.strip() for text in collector.texts) == TEXT, collector.texts
    return b"".join(frame.audio for frame in collector.audio)


def llm_response() -> list[Frame]:
    return [LLMFullResponseStartFrame(), *[LLMTextFrame(token) for token in TOKENS], LLMFullResponseEndFrame()]


def test_pipecat_openai_tts_service(server: Server, reference_s: float) -> None:
    tts = OpenAITTSService(api_key=API_KEY, base_url=f"{server.url}/v1")
    check(asyncio.run(run_pipeline(tts, [TTSSpeakFrame(TEXT)], 24000)), 24000, reference_s)


def test_pipecat_piper_http_tts_service(server: Server, reference_s: float) -> None:
    """The WAV header says 22.05 kHz; Pipecat reads it and resamples to the pipeline's 16 kHz."""

    async def run() -> bytes:
        async with aiohttp.ClientSession() as session:
            tts = PiperHttpTTSService(base_url=f"{server.url}/synthesize", aiohttp_session=session)
            return await run_pipeline(tts, llm_response(), 16000)

    check(asyncio.run(run()), 16000, reference_s)


@pytest.mark.parametrize("mode", [TextAggregationMode.SENTENCE, TextAggregationMode.TOKEN])
def test_pipecat_cartesia_tts_service(server: Server, reference_s: float, mode: TextAggregationMode) -> None:
    """Sentences with max_buffer_delay_ms 0, or the LLM's tokens as they come with Cartesia's buffering. The
    service asks for word timestamps and turns each word into a TTSTextFrame timed to its audio (what tells a
    pipeline which words were heard before an interruption)."""
    tts = CartesiaTTSService(
        api_key=API_KEY,
        url=f"{server.url.replace('http://', 'ws://')}/tts/websocket",
        sample_rate=16000,
        text_aggregation_mode=mode,
    )
    collector = Collector()
    pcm = asyncio.run(run_pipeline(tts, llm_response(), 16000, collector))
    check(pcm, 16000, reference_s)
    assert [text.strip() for text in collector.texts] == WORDS
    # Presentation times come from the word timestamps (from the first audio on): compare them from the first word.
    assert all(pts is not None for pts in collector.text_pts)
    check_word_starts(pcm, [pts / 1e9 for pts in collector.text_pts], relative=True)  # type: ignore[operator]


SSML = '<speak>Hello <mark name="a"/>there. How can I <foo>help</foo> you today?<mark name="end"/></speak>'
"""TEXT as SSML with marks (one after the last word, which comes in a ``timestamps`` message with no words) and an
element the server ignores (``done`` says so): rtvoice's extensions to Cartesia's messages."""


def test_pipecat_cartesia_tts_service_takes_marks_and_ignored_in_stride(server: Server, reference_s: float) -> None:
    """Pipecat's service errs on unknown message types and needs ``word_timestamps`` in every ``timestamps``
    message: rtvoice's marks and ``ignored`` ride where it passes over them, and the words are still the text's."""
    tts = CartesiaTTSService(
        api_key=API_KEY, url=f"{server.url.replace('http://', 'ws://')}/tts/websocket", sample_rate=16000
    )
    collector = Collector()
    check(asyncio.run(run_pipeline(tts, [TTSSpeakFrame(SSML)], 16000, collector)), 16000, reference_s)
    assert [text.strip() for text in collector.texts] == WORDS


# -- LiveKit Agents --------------------------------------------------------------------------------------------


async def collect(stream: Any, rate: int, transcript: list[Any] | None = None) -> bytes:
    """The stream's audio; its timed transcript (the frames' TimedStrings) into ``transcript``."""
    frames = [event.frame async for event in stream]
    assert frames and {frame.sample_rate for frame in frames} == {rate} and {f.num_channels for f in frames} == {1}
    if transcript is not None:
        transcript += [timed for frame in frames for timed in frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]
    return b"".join(bytes(frame.data) for frame in frames)


def push_tokens(stream: Any) -> Any:
    for token in TOKENS:
        stream.push_text(token)
    stream.end_input()
    return stream


def test_livekit_openai_synthesize(server: Server, reference_s: float) -> None:
    async def run() -> bytes:
        tts = livekit_openai.TTS(base_url=f"{server.url}/v1", api_key=API_KEY)
        try:
            return await collect(tts.synthesize(TEXT), 24000)
        finally:
            await tts.aclose()

    check(asyncio.run(run()), 24000, reference_s)


def test_livekit_openai_through_the_stream_adapter(server: Server, reference_s: float) -> None:
    """What an AgentSession does with a TTS that cannot stream: sentences from the LLM's tokens, one request each."""

    async def run() -> bytes:
        tts = livekit_openai.TTS(base_url=f"{server.url}/v1", api_key=API_KEY)
        adapter = livekit_tts.StreamAdapter(tts=tts)
        try:
            return await collect(push_tokens(adapter.stream()), 24000)
        finally:
            await adapter.aclose()
            await tts.aclose()

    check(asyncio.run(run()), 24000, reference_s)


def test_livekit_cartesia_streaming_and_synthesize(server: Server, reference_s: float) -> None:
    """cartesia.TTS with rtvoice's URL as base_url: the WebSocket for streams (word timestamps asked for, as by
    default: they become the aligned transcript, each word a TimedString on the audio that holds it),
    /tts/bytes for synthesize."""
    transcript: list[Any] = []

    async def run() -> tuple[bytes, bytes]:
        async with aiohttp.ClientSession() as session:
            tts = livekit_cartesia.TTS(base_url=server.url, api_key=API_KEY, sample_rate=16000, http_session=session)
            try:
                streamed = await collect(push_tokens(tts.stream()), 16000, transcript)
                whole = await collect(tts.synthesize(TEXT), 16000)
            finally:
                await tts.aclose()
            return streamed, whole

    streamed, whole = asyncio.run(run())
    check(streamed, 16000, reference_s)
    check(whole, 16000, reference_s)
    # The aligned transcript is the text as sent, word by word, and its times are where the words are.
    assert "".join(str(timed) for timed in transcript) == TEXT, transcript
    assert [str(timed).strip() for timed in transcript] == WORDS
    assert all(timed.start_time < timed.end_time <= len(streamed) / 2 / 16000 + 0.002 for timed in transcript)
    check_word_starts(streamed, [timed.start_time for timed in transcript])


def test_livekit_cartesia_streams_ssml_with_marks(server: Server, reference_s: float) -> None:
    """LiveKit's cartesia.TTS passes over rtvoice's marks and ``ignored``; its transcript aligns each word with
    the text it sent (markup and all, as it sent it)."""
    transcript: list[Any] = []

    async def run() -> bytes:
        async with aiohttp.ClientSession() as session:
            tts = livekit_cartesia.TTS(base_url=server.url, api_key=API_KEY, sample_rate=16000, http_session=session)
            try:
                stream = tts.stream()
                for token in SSML.split(" "):
                    stream.push_text(token + " ")
                stream.end_input()
                return await collect(stream, 16000, transcript)
            finally:
                await tts.aclose()

    check(asyncio.run(run()), 16000, reference_s)
    assert [re.sub(r"<[^>]*>", "", str(timed)).strip() for timed in transcript] == WORDS, transcript
