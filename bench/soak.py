"""Soak: mixed HTTP, WebSocket and WHEP traffic for minutes, with cancellations and dropped connections.

    python -m bench.soak                      # 10 minutes, 4 clients, a server of its own
    python -m bench.soak --minutes 1 --clients 2
    python -m bench.soak --url http://127.0.0.1:8000 --api-key KEY

Each client loops over a random mix: an OpenAI speech request read to its end; one dropped after its first bytes;
a WebSocket utterance to its ``done``; a WebSocket dropped mid-speech; a WHEP session that speaks one utterance
over its DataChannel and is deleted; a WHEP session whose player vanishes (closed without DELETE). Deliberate
drops are not errors; anything else that is not a whole answer is.

Every few seconds it reads ``/debug/process`` and ``/debug/whep``. It reports errors, resident memory growth
from the end of the warm-up to the end, and whether open file descriptors, event-loop tasks, WebSockets,
engine streams and peer connections came back to their baseline (before any traffic) once traffic stopped.
``--clients`` sets the load: pick about half of what the machine sustains in real time (``bench.load`` says).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import websockets

from testkit.servers import start_rtvoice
from testkit.whep_client import WhepPlayer

TEXTS = [
    "The soak test keeps the server busy for a long while.",
    "Short one.",
    "Streams start, stop, and sometimes vanish halfway through a sentence, and the server must not mind.",
    "Numbers like 42 and 1999 are read aloud too. Then another sentence follows it.",
]


@dataclass
class Tally:
    done: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def error(self, kind: str, what: object) -> None:
        self.errors[kind] += 1
        if len(self.examples) < 20:
            self.examples.append(f"{kind}: {what}")


class Soak:
    def __init__(self, url: str, api_key: str | None, tally: Tally) -> None:
        self.url = url
        self.ws_url = url.replace("http", "ws", 1) + "/v1/tts/stream"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.api_key = api_key
        self.tally = tally

    async def http_whole(self, client: httpx.AsyncClient) -> None:
        response = await client.post(
            f"{self.url}/v1/audio/speech",
            headers=self.headers,
            json={"model": "tts-1", "voice": "alloy", "input": random.choice(TEXTS), "response_format": "pcm"},
        )
        if response.status_code != 200 or len(response.content) < 4800:
            self.tally.error("http", f"{response.status_code} {len(response.content)} bytes")
        else:
            self.tally.done["http"] += 1

    async def http_dropped(self, client: httpx.AsyncClient) -> None:
        async with client.stream(
            "POST", f"{self.url}/inference_sft", headers=self.headers, data={"tts_text": " ".join(TEXTS)}
        ) as response:
            if response.status_code != 200:
                self.tally.error("http_dropped", response.status_code)
                return
            async for _ in response.aiter_bytes():
                break  # leave after the first bytes
        self.tally.done["http_dropped"] += 1

    def _ws_connect(self) -> Any:
        query = f"?api_key={self.api_key}" if self.api_key else ""
        return websockets.connect(self.ws_url + query)

    async def ws_whole(self) -> None:
        async with self._ws_connect() as ws:
            await ws.send(json.dumps({"type": "start", "sample_rate": 16000}))
            for fragment in random.choice(TEXTS).split(" "):
                await ws.send(json.dumps({"type": "text", "text": fragment + " "}))
            await ws.send(json.dumps({"type": "end"}))
            final = None
            async for message in ws:
                if isinstance(message, str):
                    event = json.loads(message)
                    if event["type"] == "error":
                        self.tally.error("websocket", event)
                    elif event["type"] == "done" and event.get("final"):
                        final = event
            if final is None or not final["session"]["audio_s"]:
                self.tally.error("websocket", f"no final done ({ws.close_code})")
            else:
                self.tally.done["websocket"] += 1

    async def ws_dropped(self) -> None:
        ws = await self._ws_connect()
        await ws.send(json.dumps({"type": "start"}))
        await ws.send(json.dumps({"type": "text", "text": " ".join(TEXTS)}))
        async for message in ws:
            if isinstance(message, bytes):
                break
        ws.transport.abort()  # vanish mid-speech: no close frame
        self.tally.done["websocket_dropped"] += 1

    async def whep(self, vanish: bool) -> None:
        player = WhepPlayer(self.url, token=self.api_key)
        try:
            await player.start()
            request_id = f"soak-{random.randrange(10**9)}"
            player.send({"type": "tts_request", "text": random.choice(TEXTS), "request_id": request_id})
            if vanish:
                await player.event("audio_start", request_id, timeout=30)
            else:
                done = await player.event("done", request_id, timeout=60)
                if not done.get("audio_s"):
                    self.tally.error("whep", done)
                    return
            self.tally.done["whep_vanished" if vanish else "whep"] += 1
        except Exception as error:  # a refused offer, a lost event: all errors here
            self.tally.error("whep", repr(error))
        finally:
            await player.close(delete=not vanish)

    async def client(self, stop_at: float, whep_share: float) -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            while time.monotonic() < stop_at:
                choice = random.random()
                try:
                    if choice < whep_share * 0.7:
                        await self.whep(vanish=False)
                    elif choice < whep_share:
                        await self.whep(vanish=True)
                    elif choice < 0.4:
                        await self.http_whole(client)
                    elif choice < 0.55:
                        await self.http_dropped(client)
                    elif choice < 0.85:
                        await self.ws_whole()
                    else:
                        await self.ws_dropped()
                except Exception as error:
                    self.tally.error("client", repr(error))


def snapshot(url: str, headers: dict[str, str]) -> dict[str, Any]:
    process = httpx.get(f"{url}/debug/process", headers=headers, timeout=30).json()
    whep = httpx.get(f"{url}/debug/whep", headers=headers, timeout=30).json()
    return {
        **process,
        "whep_sessions": whep["sessions"],
        "peer_connections": whep["peer_connections_alive"],
        "whep_tasks": whep["session_tasks"],
        "at": time.monotonic(),
    }


async def sample(
    url: str, headers: dict[str, str], samples: list[dict[str, Any]], stop: asyncio.Event, every_s: float
) -> None:
    while not stop.is_set():
        samples.append(await asyncio.to_thread(snapshot, url, headers))
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass


async def settle(url: str, headers: dict[str, str], baseline: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """The server's state once streams, sockets and sessions are gone (or when ``timeout_s`` runs out)."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = await asyncio.to_thread(snapshot, url, headers)
        quiet = (
            now["engine_active_streams"] == 0
            and now["websockets"] == 0
            and now["whep_sessions"] == 0
            and now["peer_connections"] == 0
            and now["loop_tasks"] <= baseline["loop_tasks"]
            and now["open_fds"] <= baseline["open_fds"]
        )
        if quiet or time.monotonic() > deadline:
            return now
        await asyncio.sleep(1)


async def soak(
    url: str, api_key: str | None, minutes: float, clients: int, warmup_s: float, whep_share: float, settle_s: float
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    baseline = snapshot(url, headers)
    tally = Tally()
    soaker = Soak(url, api_key, tally)
    samples: list[dict[str, Any]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample(url, headers, samples, stop, every_s=5))
    started = time.monotonic()
    stop_at = started + minutes * 60
    await asyncio.gather(*(soaker.client(stop_at, whep_share) for _ in range(clients)))
    stop.set()
    await sampler
    after = await settle(url, headers, baseline, settle_s)
    warm = [s for s in samples if s["at"] >= started + warmup_s] or samples
    rss_warm, rss_end = warm[0]["rss_bytes"], after["rss_bytes"]
    return {
        "minutes": minutes,
        "clients": clients,
        "completed": dict(tally.done),
        "errors": dict(tally.errors),
        "error_examples": tally.examples,
        "rss_mb": {
            "baseline": round(baseline["rss_bytes"] / 2**20, 1),
            "after_warmup": round(rss_warm / 2**20, 1),
            "end": round(rss_end / 2**20, 1),
            "max": round(max(s["rss_bytes"] for s in samples) / 2**20, 1),
            "growth_after_warmup_pct": round(100 * (rss_end - rss_warm) / rss_warm, 1),
        },
        "back_to_baseline": {
            name: {"baseline": baseline[name], "end": after[name]}
            for name in (
                "open_fds",
                "loop_tasks",
                "threads",
                "websockets",
                "engine_active_streams",
                "peer_connections",
                "whep_sessions",
                "whep_tasks",
            )
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (the load)")
    parser.add_argument("--warmup-s", type=float, default=60.0, help="RSS growth is measured from here on")
    parser.add_argument("--whep-share", type=float, default=0.2, help="share of iterations that are WHEP sessions")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=60.0,
        help="how long to wait after traffic for the server to return to its baseline",
    )
    parser.add_argument("--url", help="a running server (default: start one on loopback)")
    parser.add_argument("--api-key", help="the key for a server with RTVOICE_API_KEYS")
    args = parser.parse_args()
    server = None
    url = args.url
    if url is None:
        # A player that vanishes is noticed by ICE consent (about 30 s) or the idle sweep; keep the sweep short.
        server = start_rtvoice({"RTVOICE_WHEP_IDLE_TIMEOUT_S": "10"})
        url = server.url
    try:
        report = asyncio.run(
            soak(
                url,
                args.api_key,
                args.minutes,
                args.clients,
                min(args.warmup_s, args.minutes * 30),
                args.whep_share,
                args.settle_s,
            )
        )
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
