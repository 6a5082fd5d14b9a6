"""Time to first audio over the WebSocket protocol, with text streamed like an LLM writes it and in whole sentences.

    python -m bench.ws_ttfa [--runs 20] [--chars 4] [--interval-ms 20]

rtvoice runs as its own process; one connection speaks one utterance per run
(``text`` ... ``flush``, then wait for ``done``), as a voice agent does turn
after turn. Two ways of sending the same text:

* tokens: ``--chars`` characters every ``--interval-ms`` (4 every 20 ms is ~50 tokens/s, a brisk LLM);
* sentences: each sentence whole, in one ``text`` message, as soon as the previous one was sent.

TTFA is measured by the client, from sending the message that completed the
first segment (found with the engine's own segmenter) to the first binary
frame; the server's ``audio_start.ttfa_ms`` (same start, measured when the
frame left) and the time from the first message to the first audio (which
includes waiting for the LLM to finish its first sentence) are shown beside it.
Figures are p50/p95 over the runs, after two warm-up runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from dataclasses import dataclass, field

import websockets

from bench.servers import start_rtvoice
from bench.ttfa import TEXTS
from rtvoice.engine.settings import Settings
from rtvoice.engine.text import Segmenter


@dataclass
class Run:
    ttfa_s: float
    server_ttfa_s: float
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

    def row(self, attr: str) -> tuple[float, float]:
        values = [getattr(run, attr) for run in self.runs]
        return statistics.median(values), self.p(values, 0.95)


def token_messages(text: str, chars: int) -> list[str]:
    return [text[i: i + chars] for i in range(0, len(text), chars)]


def sentence_messages(text: str) -> list[str]:
    # Each sentence with its trailing space: a sentence end followed by whitespace is complete at once.
    return [m.group(0) for m in re.finditer(r"[^.!?]+[.!?]+\s*", text)]


def completing_message(messages: list[str]) -> int:
    """Index of the message after which the server's segmenter has its first segment."""
    settings = Settings()
    segmenter = Segmenter(settings.first_segment_max_chars, settings.segment_max_chars)
    for index, message in enumerate(messages):
        if segmenter.push(message):
            return index
    return len(messages)  # only the flush completes it


async def one_utterance(ws: websockets.ClientConnection, messages: list[str], interval_s: float,
                        rate: int) -> Run:
    completing = completing_message(messages)
    sent_at: list[float] = []

    async def send() -> None:
        for index, message in enumerate(messages):
            if index and interval_s:
                await asyncio.sleep(interval_s)
            await ws.send(json.dumps({"type": "text", "text": message}))
            sent_at.append(time.perf_counter())
        await ws.send(json.dumps({"type": "flush"}))
        sent_at.append(time.perf_counter())

    sender = asyncio.create_task(send())
    first_audio = None
    server_ttfa = None
    samples = 0
    while True:
        message = await ws.recv()
        if isinstance(message, bytes):
            if first_audio is None:
                first_audio = time.perf_counter()
            samples += len(message) // 2
            continue
        event = json.loads(message)
        if event["type"] == "audio_start":
            server_ttfa = event["ttfa_ms"] / 1000
        elif event["type"] == "done":
            break
        elif event["type"] == "error":
            raise RuntimeError(event)
    await sender
    end = time.perf_counter()
    assert first_audio is not None and server_ttfa is not None
    return Run(
        ttfa_s=first_audio - sent_at[completing],
        server_ttfa_s=server_ttfa,
        first_message_to_audio_s=first_audio - sent_at[0],
        audio_s=samples / rate,
        total_s=end - sent_at[0],
    )


async def measure(url: str, messages: list[str], interval_s: float, runs: int) -> Results:
    results = Results()
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "start"}))
        started = json.loads(await ws.recv())
        for index in range(runs + 2):
            run = await one_utterance(ws, messages, interval_s, started["sample_rate"])
            if index >= 2:  # the first two warm the connection and caches
                results.runs.append(run)
        await ws.send(json.dumps({"type": "end"}))
        async for _ in ws:
            pass
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--chars", type=int, default=4, help="characters per token message")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="time between token messages")
    args = parser.parse_args()

    server = start_rtvoice()
    url = server.url.replace("http://", "ws://") + "/v1/tts/stream"
    try:
        header = (f"{'text':24} {'sent as':26} {'audio s':>8} {'TTFA p50':>9} {'TTFA p95':>9} {'server p50':>10} "
                  f"{'server p95':>10} {'1st msg->audio p50':>18}")
        print(header)
        print("-" * len(header))
        for label, text in TEXTS.items():
            modes = {
                f"tokens ({args.chars} ch / {args.interval_ms:g} ms)": (token_messages(text, args.chars),
                                                                     args.interval_ms / 1000),
                "whole sentences": (sentence_messages(text), 0.0),
            }
            for mode, (messages, interval_s) in modes.items():
                results = asyncio.run(measure(url, messages, interval_s, args.runs))
                ttfa = results.row("ttfa_s")
                server_ttfa = results.row("server_ttfa_s")
                first = results.row("first_message_to_audio_s")
                audio_s = results.runs[-1].audio_s
                print(f"{label:24} {mode:26} {audio_s:8.2f} {ttfa[0] * 1e3:7.1f}ms {ttfa[1] * 1e3:7.1f}ms "
                      f"{server_ttfa[0] * 1e3:8.1f}ms {server_ttfa[1] * 1e3:8.1f}ms {first[0] * 1e3:16.1f}ms")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
