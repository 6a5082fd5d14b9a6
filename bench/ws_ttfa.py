"""Time to first audio over the WebSockets, with text streamed like an LLM writes it and in whole sentences:
rtvoice's own ``/v1/tts/stream`` and Cartesia's ``/tts/websocket``, side by side in one run.

    python -m bench.ws_ttfa [--runs 20] [--chars 4] [--interval-ms 20]

rtvoice runs as its own process; one connection per protocol, open at the same
time, speaks one utterance per run, as a voice agent does turn after turn, and
the two protocols take turns run by run so they share the machine's conditions.
rtvoice's protocol sends ``text`` ... ``flush`` and waits for ``done``; Cartesia's
opens a context per utterance and ends it with ``continue: false``, as Pipecat's
and LiveKit's Cartesia services do, and asks for word timestamps as they do
(``add_timestamps``), so both protocols carry word timings. Two ways of sending the same text:

* tokens: ``--chars`` characters every ``--interval-ms`` (4 every 20 ms is ~50 tokens/s, a brisk LLM); on
  Cartesia's protocol with the default ``max_buffer_delay_ms`` (Pipecat's token mode);
* sentences: each sentence whole, in one message, as soon as the previous one was sent; on Cartesia's protocol
  with ``max_buffer_delay_ms: 0`` (Pipecat's sentence mode and LiveKit).

TTFA is measured by the client, from sending the message that completed the
first segment (found with the engine's own segmenter) to the first audio; the
server's ``audio_start.ttfa_ms`` (rtvoice's protocol only: same start, measured
when the frame left) and the time from the first message to the first audio
(which includes waiting for the LLM to finish its first sentence) are shown
beside it, and the ratio of the two protocols' TTFA p50s. Figures are p50/p95
over the runs, after two warm-up runs.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import websockets

from bench.ttfa import TEXTS
from rtvoice.engine.settings import EngineSettings
from rtvoice.engine.text import Segmenter
from testkit.servers import start_rtvoice


@dataclass
class Run:
    ttfa_s: float
    server_ttfa_s: float | None
    first_message_to_audio_s: float
    audio_s: float
    total_s: float


@dataclass
class Results:
    runs: list[Run] = field(default_factory=list)

    @staticmethod
    def p(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def row(self, attr: str) -> tuple[float, float] | None:
        values = [getattr(run, attr) for run in self.runs]
        if any(value is None for value in values):
            return None
        return statistics.median(values), self.p(values, 0.95)


def token_messages(text: str, chars: int) -> list[str]:
    return [text[i : i + chars] for i in range(0, len(text), chars)]


def sentence_messages(text: str) -> list[str]:
    # Each sentence with its trailing space: a sentence end followed by whitespace is complete at once.
    return [m.group(0) for m in re.finditer(r"[^.!?]+[.!?]+\s*", text)]


def completing_message(messages: list[str]) -> int:
    """Index of the message after which the server's segmenter has its first segment."""
    segmenter = Segmenter.of(EngineSettings())
    for index, message in enumerate(messages):
        if segmenter.push(message):
            return index
    return len(messages)  # only the flush completes it


async def send_paced(
    ws: websockets.ClientConnection, frames: list[dict[str, object]], interval_s: float, sent_at: list[float]
) -> None:
    """The text frames ``interval_s`` apart, then the closing frame at once; notes when each left."""
    for index, frame in enumerate(frames):
        if index and interval_s and index < len(frames) - 1:
            await asyncio.sleep(interval_s)
        await ws.send(json.dumps(frame))
        sent_at.append(time.perf_counter())


Reading = tuple[str, bytes, float | None]
"""What one received message says: its kind (``audio``, ``done``, ``error`` or anything else), the audio it
carries, and the server's own TTFA when it reports one."""


async def utterance(
    ws: websockets.ClientConnection,
    frames: list[dict[str, object]],
    completing: int,
    interval_s: float,
    rate: int,
    read: Callable[[str | bytes], Reading],
) -> Run:
    """Send the frames (the last one closes the utterance) and receive until its ``done``."""
    sent_at: list[float] = []
    sender = asyncio.create_task(send_paced(ws, frames, interval_s, sent_at))
    first_audio = None
    server_ttfa = None
    samples = 0
    while True:
        kind, audio, reported_ttfa = read(await ws.recv())
        if reported_ttfa is not None:
            server_ttfa = reported_ttfa
        if audio:
            if first_audio is None:
                first_audio = time.perf_counter()
            samples += len(audio) // 2
        if kind == "done":
            break
        if kind == "error":
            raise RuntimeError(audio)
    await sender
    end = time.perf_counter()
    assert first_audio is not None
    return Run(
        ttfa_s=first_audio - sent_at[completing],
        server_ttfa_s=server_ttfa,
        first_message_to_audio_s=first_audio - sent_at[0],
        audio_s=samples / rate,
        total_s=end - sent_at[0],
    )


def read_rtvoice(message: str | bytes) -> Reading:
    if isinstance(message, bytes):
        return "audio", message, None
    event = json.loads(message)
    if event["type"] == "error":
        return "error", message.encode(), None
    return event["type"], b"", event["ttfa_ms"] / 1000 if event["type"] == "audio_start" else None


async def one_utterance(ws: websockets.ClientConnection, messages: list[str], interval_s: float, rate: int) -> Run:
    """rtvoice's protocol: ``text`` messages, then ``flush``; until ``done``."""
    frames: list[dict[str, object]] = [{"type": "text", "text": message} for message in messages]
    return await utterance(
        ws, [*frames, {"type": "flush"}], completing_message(messages), interval_s, rate, read_rtvoice
    )


CARTESIA_FORMAT = {"container": "raw", "encoding": "pcm_s16le"}
_context_ids = itertools.count()


def cartesia_reader(context_id: str) -> Callable[[str | bytes], Reading]:
    def read(message: str | bytes) -> Reading:
        event = json.loads(message)
        if event.get("context_id") != context_id:
            return "other", b"", None
        if event["type"] == "chunk":
            return "audio", base64.b64decode(event["data"]), None
        if event["type"] == "error":
            return "error", str(event).encode(), None
        return event["type"], b"", None

    return read


async def cartesia_utterance(
    ws: websockets.ClientConnection, messages: list[str], interval_s: float, rate: int, buffer_delay_ms: int | None
) -> Run:
    """Cartesia's protocol: one context, each message a transcript with ``continue: true``, then
    ``continue: false``; until ``done``."""
    context_id = f"bench-{next(_context_ids)}"
    request: dict[str, object] = {
        "model_id": "sonic-3",
        "voice": {"mode": "id", "id": ""},
        "context_id": context_id,
        "output_format": {**CARTESIA_FORMAT, "sample_rate": rate},
        "add_timestamps": True,
    }
    if buffer_delay_ms is not None:
        request["max_buffer_delay_ms"] = buffer_delay_ms
    frames = [{**request, "transcript": message, "continue": True} for message in messages]
    completing = 0 if buffer_delay_ms == 0 else completing_message(messages)
    return await utterance(
        ws,
        [*frames, {**request, "transcript": "", "continue": False}],
        completing,
        interval_s,
        rate,
        cartesia_reader(context_id),
    )


async def measure(
    base_url: str, messages: list[str], interval_s: float, runs: int, cartesia_buffer_delay_ms: int | None
) -> dict[str, Results]:
    """Both protocols, one connection each, taking turns run by run."""
    results = {"/v1/tts/stream": Results(), "/tts/websocket": Results()}
    async with (
        websockets.connect(f"{base_url}/v1/tts/stream", max_size=None) as rtvoice_ws,
        websockets.connect(
            f"{base_url}/tts/websocket?cartesia_version=2025-04-16",
            max_size=None,
            additional_headers={"X-API-Key": "bench"},
        ) as cartesia_ws,
    ):
        await rtvoice_ws.send(json.dumps({"type": "start"}))
        rate = json.loads(await rtvoice_ws.recv())["sample_rate"]
        for index in range(runs + 2):
            # Which protocol goes first alternates, so neither always follows the other's tail of work.
            if index % 2:
                cartesia_run = await cartesia_utterance(
                    cartesia_ws, messages, interval_s, rate, cartesia_buffer_delay_ms
                )
                rtvoice_run = await one_utterance(rtvoice_ws, messages, interval_s, rate)
            else:
                rtvoice_run = await one_utterance(rtvoice_ws, messages, interval_s, rate)
                cartesia_run = await cartesia_utterance(
                    cartesia_ws, messages, interval_s, rate, cartesia_buffer_delay_ms
                )
            if index >= 2:  # the first two warm the connections and caches
                results["/v1/tts/stream"].runs.append(rtvoice_run)
                results["/tts/websocket"].runs.append(cartesia_run)
        await rtvoice_ws.send(json.dumps({"type": "end"}))
        async for _ in rtvoice_ws:
            pass
    return results


def _ms(row: tuple[float, float] | None, index: int) -> str:
    return "-" if row is None else f"{row[index] * 1e3:.1f}ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--chars", type=int, default=4, help="characters per token message")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="time between token messages")
    args = parser.parse_args()

    server = start_rtvoice()
    base_url = server.url.replace("http://", "ws://")
    try:
        header = (
            f"{'text':24} {'sent as':26} {'route':15} {'audio s':>8} {'TTFA p50':>9} {'TTFA p95':>9} "
            f"{'server p50':>10} {'server p95':>10} {'1st msg->audio p50':>18} {'p50 / ws p50':>12}"
        )
        print(header)
        print("-" * len(header))
        for label, text in TEXTS.items():
            modes = {
                f"tokens ({args.chars} ch / {args.interval_ms:g} ms)": (
                    token_messages(text, args.chars),
                    args.interval_ms / 1000,
                    None,
                ),
                "whole sentences": (sentence_messages(text), 0.0, 0),
            }
            for mode, (messages, interval_s, buffer_delay_ms) in modes.items():
                results = asyncio.run(measure(base_url, messages, interval_s, args.runs, buffer_delay_ms))
                reference = results["/v1/tts/stream"].row("ttfa_s")
                for route, result in results.items():
                    ttfa = result.row("ttfa_s")
                    server_ttfa = result.row("server_ttfa_s")
                    first = result.row("first_message_to_audio_s")
                    ratio = ttfa[0] / reference[0] if ttfa and reference else float("nan")
                    print(
                        f"{label:24} {mode:26} {route:15} {result.runs[-1].audio_s:8.2f} {_ms(ttfa, 0):>9} "
                        f"{_ms(ttfa, 1):>9} {_ms(server_ttfa, 0):>10} {_ms(server_ttfa, 1):>10} "
                        f"{_ms(first, 0):>18} {ratio:12.2f}"
                    )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
