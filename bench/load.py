"""Real-time listeners against one server, next to Piper's own HTTP server measured in the same run.

    python -m bench.load                  # the issue-9 targets (about 6 minutes on 2 cores)
    python -m bench.load --levels 1 8 16  # a sweep of listener counts instead; --batching-off and Piper too
    python -m bench.load --levels 24 --join-seconds 0 --no-piper --timeline   # and each utterance's times and gaps
    python -m bench.load --closed-loop 24       # what the machine makes: clients back to back, against Piper

A simulated listener asks for an utterance, plays it in real time from its first byte (a stall is a gap over
20 ms with nothing to play) and asks for the next one when playback ends; listeners join one by one over
``--join-seconds``; this process collects no garbage while a row plays, so that its own pauses are not counted as
the server's gaps. Each row gives TTFA p50/p95 (first byte), listeners that stalled and their stall seconds,
audio seconds delivered per wall second (to the end of the last playback), the same to the row's last byte
("made s/s": what the server made, counted as Piper's figure is, without the listeners' real-time playback of
their last utterances), the most the first figure could be with these listeners and utterances ("playable": every
utterance's audio there the moment it is asked for, so that real-time playback is all that takes time; 24 listeners
cannot play more than 24 audio seconds per second whatever the server makes), answers other than audio (errors),
503s, the most streams the server held queued while the row ran, the p95 of their waits in its admission queue (the
bound of the ``rtvoice_queue_wait_seconds`` bucket that holds it: how much of TTFA was waiting for room rather than
synthesis), the chunks the server itself counted late while the row ran (``rtvoice_late_chunks_total``: any chunk
after its listener's playback clock ran out, with no 20 ms threshold), and its own capacity estimate
(``rtvoice_capacity_audio_seconds_per_second``) afterwards.

The reference is Piper's own HTTP server (``piper-tts[http]``, same voice; ``make bench`` installs it): 16
clients at once, each asking for whole WAVs back to back; its audio seconds per wall second is P, measured again
right before each target row (the machine's speed drifts within a run as much as between runs), and each row's
level and ratio come from that P. The targets, each run on a fresh rtvoice server:

- half:      P/2 listeners (rounded down) joining over 1 s      zero stalled listeners, TTFA p95 <= 250 ms
- 80%:       0.8 P listeners joining over 1 s                   zero stalled listeners, TTFA p95 <= 500 ms
- 24 at once                                                    audio s per s >= 0.85 P
- past capacity: 2 P listeners joining over 1 s                 newcomers queue (or get 503), no stalls
- issue case: 7 listeners over 1 s on /v1/audio/speech (pcm)    zero stalled listeners
- cost x2 (RTVOICE_MODEL_COST_SCALE=2, each model call holds its slot twice as long): its capacity C2 is the
  throughput of 24 at once; then C2/2 listeners joining over 1 s   zero stalled listeners

The real-time rows are capped by playback: 24 listeners cannot play more than about 24 audio seconds per second, so
where Piper makes about that much they cannot show a ratio much above 1. ``--closed-loop N`` measures what the machine
makes instead: N clients each asking for the next utterance as soon as the last one's final byte is read (no
playback), audio seconds received per wall second to the last byte, against Piper's HTTP server with as many clients;
the two are measured in alternating pairs (rtvoice first, then Piper first, ...), and the figure is the median of the
pairs' ratios.

The machine's speed drifts (other processes, CPU boost), so compare figures within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import httpx

from rtvoice.engine.metrics import QUEUE_WAIT_BUCKETS
from testkit.servers import Server, start_piper_http, start_rtvoice

UTTERANCES = [
    "Thanks for calling. I can help you change your booking, check the status of an order, or answer a question "
    "about your account.",
    "Your order left our warehouse this morning, and it should arrive on Thursday between nine and eleven.",
    "If that time does not suit you, I can move the delivery to Friday afternoon instead. Would you like that?",
    "One moment while I look that up for you. It seems the card on file expired last month.",
]
STALL_THRESHOLD_S = 0.02
WAV_HEADER = 44
PIPER_CLIENTS = 16
QUEUE_POLL_S = 0.5
"""How often a row reads the server's queue length: queues last seconds, and each read renders /metrics on the
server's event loop, so reading more often would load the server it measures."""


@dataclass
class Utterance:
    """One utterance's times, in seconds from the start of its row."""

    listener: int
    asked_s: float
    first_byte_s: float
    last_byte_s: float
    played_s: float
    """When its playback ended."""
    audio_s: float
    stalls: list[tuple[float, float]] = field(default_factory=list)
    """Its gaps over the threshold: (when, in seconds from the row's start, and how long)."""


@dataclass
class Listener:
    ttfa_s: list[float] = field(default_factory=list)
    """Time to first audio of each utterance; the first one is asked for while all listeners join."""
    stall_s: float = 0.0
    stalls: int = 0
    audio_s: float = 0.0
    errors: int = 0
    rejected: int = 0
    last_byte_at: float = 0.0
    """When the last byte of its last utterance arrived (``time.perf_counter``)."""
    utterances: list[Utterance] = field(default_factory=list)


@dataclass
class Target:
    name: str
    url: str
    route: str  # "sft" (CosyVoice's form API, pcm), "openai" (/v1/audio/speech, pcm) or "piper" (a whole WAV)

    def request(self, client: httpx.AsyncClient, text: str):  # type: ignore[no-untyped-def]
        if self.route == "sft":
            return client.stream("POST", f"{self.url}/inference_sft", data={"tts_text": text, "format": "pcm"})
        if self.route == "openai":
            return client.stream(
                "POST",
                f"{self.url}/v1/audio/speech",
                json={"model": "tts-1", "input": text, "voice": "alloy", "response_format": "pcm"},
            )
        return client.stream("POST", f"{self.url}/synthesize", json={"text": text})

    def sample_rate(self, response: httpx.Response) -> int:
        return int(response.headers.get("x-sample-rate", "22050"))


def clients(count: int, timeout_s: float = 300) -> list[httpx.AsyncClient]:
    """HTTP clients made before a row's clock starts: making one (its TLS context) holds this process's event loop
    for tens of milliseconds, which listeners already playing would count as a stall of the server's."""
    return [httpx.AsyncClient(timeout=timeout_s) for _ in range(count)]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection in this process while listeners play: a full collection holds its event loop,
    and listeners would count that pause of their own as a gap in the server's audio. What is already allocated is
    frozen out of later collections; the garbage of the row is collected after it."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()
        gc.collect()


def joins_at(index: int, level: int, join_s: float) -> float:
    """Seconds into its row at which listener ``index`` of ``level`` joins: one by one over ``join_s``."""
    return join_s * index / level


async def listen(
    target: Target,
    client: httpx.AsyncClient,
    index: int,
    level: int,
    utterances: int,
    listener: Listener,
    join_s: float,
    row_start: float,
) -> None:
    await asyncio.sleep(joins_at(index, level, join_s))
    async with client:
        for n in range(utterances):
            text = UTTERANCES[(index + n) % len(UTTERANCES)]
            start = time.perf_counter()
            runs_out_at: float | None = None
            first_byte_at, audio_before = 0.0, listener.audio_s
            gaps: list[tuple[float, float]] = []
            header = WAV_HEADER if target.route == "piper" else 0
            try:
                async with target.request(client, text) as response:
                    if response.status_code == 503:
                        listener.rejected += 1
                        await asyncio.sleep(float(response.headers.get("retry-after", "1")))
                        continue
                    if response.status_code != 200:
                        listener.errors += 1
                        continue
                    rate = target.sample_rate(response)
                    async for chunk in response.aiter_bytes():
                        if header:
                            skip = min(header, len(chunk))
                            chunk, header = chunk[skip:], header - skip
                        if not chunk:
                            continue
                        now = time.perf_counter()
                        seconds = len(chunk) / 2 / rate
                        if runs_out_at is None:
                            listener.ttfa_s.append(now - start)
                            runs_out_at = first_byte_at = now
                        elif now > runs_out_at:
                            if now - runs_out_at > STALL_THRESHOLD_S:
                                listener.stalls += 1
                                listener.stall_s += now - runs_out_at
                                gaps.append((runs_out_at - row_start, now - runs_out_at))
                            runs_out_at = now
                        runs_out_at += seconds
                        listener.audio_s += seconds
                        listener.last_byte_at = now
            except httpx.HTTPError:
                listener.errors += 1
                continue
            if runs_out_at is not None:
                listener.utterances.append(
                    Utterance(
                        index,
                        start - row_start,
                        first_byte_at - row_start,
                        listener.last_byte_at - row_start,
                        runs_out_at - row_start,
                        listener.audio_s - audio_before,
                        gaps,
                    )
                )
                await asyncio.sleep(max(0.0, runs_out_at - time.perf_counter()))  # play to the end


@dataclass
class Row:
    name: str
    listeners: int
    ttfa_p50: float
    ttfa_p95: float
    stalled: int
    stall_s: float
    audio_per_s: float
    """Audio delivered per wall second of the row, to the end of the last listener's playback."""
    made_per_s: float
    """Audio delivered per second to the row's last byte: what the server made, as Piper's figure counts it (to its
    last WAV), without the real-time playback of the last utterances."""
    playable_per_s: float
    """The most ``audio_per_s`` could be with these listeners and utterances: every utterance's audio there the moment
    it is asked for, so each listener plays from its join to the end of its last utterance without a pause."""
    errors: int
    rejected: int
    max_queued: int
    queue_wait_p95: float | None
    """Upper bound of the server's queue-wait bucket holding the row's 95th percentile, when it is rtvoice."""
    late_chunks: int | None
    """Chunks the server counted late while the row ran (no threshold), when it is rtvoice."""
    capacity: float | None
    """The server's own estimate afterwards (audio s per s), when it is rtvoice."""
    timeline: list[Utterance] = field(default_factory=list)
    piper_per_s: float | None = None
    """P measured right before the row, when the run measures it: the row's level and its ratio come from that."""


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


async def _watch_queue(server: Server | None, client: httpx.AsyncClient, stop: asyncio.Event) -> int:
    """The most streams the server held queued while a row ran (polled from /metrics)."""
    most = 0
    async with client:
        if server is None:
            return 0
        while not stop.is_set():
            try:
                text = (await client.get(f"{server.url}/metrics")).text
            except httpx.HTTPError:
                text = ""
            for line in text.splitlines():
                if line.startswith("rtvoice_queued_streams "):
                    most = max(most, int(float(line.split()[1])))
            try:
                await asyncio.wait_for(stop.wait(), QUEUE_POLL_S)
            except TimeoutError:
                pass
    return most


def _queue_waits(server: Server) -> dict[float, float]:
    """The server's ``rtvoice_queue_wait_seconds`` histogram: streams admitted within each bucket's bound."""
    return {float(labels["le"]): count for labels, count in server.samples("rtvoice_queue_wait_seconds_bucket")}


def bucket_percentile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The smallest bucket bound under which ``q`` of the observations made between two snapshots fall."""
    moved = {bound: count - before.get(bound, 0.0) for bound, count in after.items()}
    total = moved.get(math.inf, 0.0)
    if total <= 0:
        return None
    return min(bound for bound, count in moved.items() if count >= q * total)


async def run_row(name: str, target: Target, server: Server | None, level: int, utterances: int, join_s: float) -> Row:
    rtvoice = server is not None and target.route != "piper"
    waits_before = _queue_waits(server) if rtvoice else {}
    late_before = server.metric("rtvoice_late_chunks_total") if rtvoice else 0.0
    listeners = [Listener() for _ in range(level)]
    listener_clients = clients(level)
    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch_queue(server, clients(1, 5)[0], stop))
    with collector_paused():
        start = time.perf_counter()
        await asyncio.gather(
            *(
                listen(target, listener_clients[i], i, level, utterances, listeners[i], join_s, start)
                for i in range(level)
            )
        )
        wall = time.perf_counter() - start
    stop.set()
    ttfa = [t for listener in listeners for t in listener.ttfa_s]
    audio_s = sum(listener.audio_s for listener in listeners)
    last_byte_s = max(listener.last_byte_at for listener in listeners) - start
    playing_s = max(joins_at(i, level, join_s) + listener.audio_s for i, listener in enumerate(listeners))
    capacity = queue_wait_p95 = late_chunks = None
    if rtvoice:
        capacity = server.metric("rtvoice_capacity_audio_seconds_per_second") or None
        queue_wait_p95 = bucket_percentile(waits_before, _queue_waits(server), 0.95)
        late_chunks = round(server.metric("rtvoice_late_chunks_total") - late_before)
    return Row(
        name=name,
        listeners=level,
        ttfa_p50=statistics.median(ttfa) if ttfa else float("nan"),
        ttfa_p95=percentile(ttfa, 0.95),
        stalled=sum(1 for listener in listeners if listener.stalls),
        stall_s=sum(listener.stall_s for listener in listeners),
        audio_per_s=audio_s / wall,
        made_per_s=audio_s / last_byte_s if last_byte_s > 0 else 0.0,
        playable_per_s=audio_s / playing_s if playing_s > 0 else 0.0,
        errors=sum(listener.errors for listener in listeners),
        rejected=sum(listener.rejected for listener in listeners),
        max_queued=await watcher,
        queue_wait_p95=queue_wait_p95,
        late_chunks=late_chunks,
        capacity=capacity,
        timeline=sorted((u for listener in listeners for u in listener.utterances), key=lambda u: u.asked_s),
    )


def print_rows(title: str, rows: list[Row]) -> None:
    """The rows, each next to the P measured right before it when the run measures P."""
    print(f"\n{title}")
    per_row = any(r.piper_per_s for r in rows)
    ref = f" {'P':>6} {'x P':>5}" if per_row else ""
    print(
        f"{'row':24} {'listeners':>9} {'TTFA p50':>9} {'TTFA p95':>9} {'stalled':>8} {'stall s':>8} "
        f"{'audio s/s':>9}{ref} {'made s/s':>8} {'playable':>8} {'errors':>6} {'503s':>5} {'queued':>6} "
        f"{'wait p95':>8} {'late':>5} {'capacity':>8}"
    )
    for r in rows:
        ratio = f" {r.piper_per_s:6.2f} {r.audio_per_s / r.piper_per_s:5.2f}" if r.piper_per_s else ""
        capacity = f"{r.capacity:8.1f}" if r.capacity else f"{'-':>8}"
        late = f"{r.late_chunks:5d}" if r.late_chunks is not None else f"{'-':>5}"
        print(
            f"{r.name:24} {r.listeners:9d} {r.ttfa_p50 * 1e3:7.0f}ms {r.ttfa_p95 * 1e3:7.0f}ms {r.stalled:8d} "
            f"{r.stall_s:8.2f} {r.audio_per_s:9.2f}{ratio} {r.made_per_s:8.2f} {r.playable_per_s:8.2f} "
            f"{r.errors:6d} {r.rejected:5d} {r.max_queued:6d} {wait_bound(r.queue_wait_p95):>8} {late} {capacity}"
        )


def wait_bound(seconds: float | None) -> str:
    """A queue-wait bucket bound as printed: "<=500ms", "<=2s", ">60s" past the last bound, "-" when not measured."""
    if seconds is None:
        return "-"
    if not math.isfinite(seconds):
        return f">{QUEUE_WAIT_BUCKETS[-1]:g}s"
    return f"<={seconds:g}s" if seconds >= 1 else f"<={seconds * 1e3:.0f}ms"


def print_timeline(row: Row) -> None:
    """Each utterance of a row, in the order asked: when its first and last bytes came and its playback ended."""
    print(f"\n{row.name}: each utterance, seconds from the row's start")
    print(f"{'listener':>8} {'asked':>7} {'TTFA':>8} {'last byte':>9} {'played':>7} {'audio':>6}  stalls (at: s)")
    for u in row.timeline:
        stalls = " ".join(f"{at:.2f}: {gap:.2f}" for at, gap in u.stalls)
        print(
            f"{u.listener:8d} {u.asked_s:7.2f} {(u.first_byte_s - u.asked_s) * 1e3:6.0f}ms {u.last_byte_s:9.2f} "
            f"{u.played_s:7.2f} {u.audio_s:6.2f}  {stalls}"
        )


# -- Piper's whole-WAV throughput -------------------------------------------------------------------


async def piper_throughput(url: str, count: int = PIPER_CLIENTS, requests_each: int = 2) -> float:
    """Audio seconds per wall second of Piper's HTTP server with ``count`` clients asking for whole WAVs at once."""
    audio = 0.0

    async def client_loop(index: int, client: httpx.AsyncClient) -> None:
        nonlocal audio
        async with client:
            for n in range(requests_each):
                response = await client.post(
                    f"{url}/synthesize", json={"text": UTTERANCES[(index + n) % len(UTTERANCES)]}
                )
                response.raise_for_status()
                rate = int.from_bytes(response.content[24:28], "little")
                audio += (len(response.content) - WAV_HEADER) / 2 / rate

    async with httpx.AsyncClient(timeout=300) as client:  # warm its voice
        (await client.post(f"{url}/synthesize", json={"text": UTTERANCES[0]})).raise_for_status()
    each = clients(count)
    start = time.perf_counter()
    await asyncio.gather(*(client_loop(i, client) for i, client in enumerate(each)))
    return audio / (time.perf_counter() - start)


def measure_piper() -> float | None:
    try:
        import flask  # noqa: F401
    except ImportError:
        print("piper-tts[http] is not installed (make bench installs it): no reference")
        return None
    from rtvoice.engine.voices import embedded_voice_path

    piper = start_piper_http(embedded_voice_path())
    try:
        return asyncio.run(piper_throughput(piper.url))
    finally:
        piper.stop()


# -- the targets ------------------------------------------------------------------------------------


def fresh_row(
    name: str,
    level: int,
    join_s: float,
    env: dict[str, str],
    route: str = "sft",
    utterances: int = 2,
    piper_per_s: float | None = None,
) -> Row:
    """One row on a freshly started rtvoice server (no state carried over from the row before), next to
    ``piper_per_s`` when P was measured for it."""
    server = start_rtvoice(env)
    try:
        target = Target(name, server.url, route)
        asyncio.run(run_row("warm-up", target, server, 2, 1, 0.0))
        return replace(asyncio.run(run_row(name, target, server, level, utterances, join_s)), piper_per_s=piper_per_s)
    finally:
        server.stop()


def targets(env: dict[str, str], utterances: int) -> None:
    """The issue-9 rows, each on a fresh server with P measured right before it: within one run the machine's speed
    drifts (P ranged 14-19 between runs, and by as much within one), so each row's level and ratio come from the
    reference nearest it in time."""
    plan = [
        ("half of P", lambda piper: max(1, int(piper / 2)), 1.0, "sft"),
        ("80% of P", lambda piper: max(1, int(0.8 * piper)), 1.0, "sft"),
        ("24 at once", lambda piper: 24, 0.0, "sft"),
        ("past capacity (2 P)", lambda piper: math.ceil(2 * piper), 1.0, "sft"),
        ("issue: 7 on /v1/audio", lambda piper: 7, 1.0, "openai"),
    ]
    rows = []
    for name, level_for, join_s, route in plan:
        piper = measure_piper()
        if piper is None:
            return
        print(
            f"Piper's HTTP server, {PIPER_CLIENTS} clients asking for whole WAVs, before '{name}': "
            f"P = {piper:.2f} audio s per s",
            flush=True,
        )
        rows.append(
            fresh_row(name, level_for(piper), join_s, env, route=route, utterances=utterances, piper_per_s=piper)
        )
    print_rows("rtvoice, each row next to P measured right before it", rows)
    scaled = {**env, "RTVOICE_MODEL_COST_SCALE": "2"}
    saturated = fresh_row("x2: 24 at once", 24, 0.0, scaled, utterances=utterances)
    scaled_half = fresh_row(
        "x2: half of C2", max(1, int(saturated.audio_per_s / 2)), 1.0, scaled, utterances=utterances
    )
    print_rows(f"rtvoice, model calls x2 (C2 = {saturated.audio_per_s:.2f})", [saturated, scaled_half])

    h, m, a, p, i = rows
    print("\ntargets (same run, each against the P measured right before its row):")
    print(
        f"  half ({h.listeners}, P = {h.piper_per_s:.2f}): {h.stalled} stalled (0), TTFA p95 "
        f"{h.ttfa_p95 * 1e3:.0f} ms (<= 250)"
    )
    print(
        f"  80% ({m.listeners}, P = {m.piper_per_s:.2f}): {m.stalled} stalled (0), TTFA p95 "
        f"{m.ttfa_p95 * 1e3:.0f} ms (<= 500); queue wait p95 {wait_bound(m.queue_wait_p95)}"
    )
    piper = a.piper_per_s or math.nan  # (measured for every target row)
    print(
        f"  24 at once (P = {piper:.2f}): {a.audio_per_s / piper:.2f} x P (>= 0.85); made to the last byte: "
        f"{a.made_per_s / piper:.2f} x P; at most {a.playable_per_s / piper:.2f} x P can be played by these "
        f"listeners (every byte there when asked)"
    )
    print(
        f"  past capacity ({p.listeners}, P = {p.piper_per_s:.2f}): {p.stalled} stalled (0); newcomers queued up "
        f"to {p.max_queued}, {p.rejected} got 503"
    )
    print(f"  issue case: {i.stalled} stalled (0), TTFA p95 {i.ttfa_p95 * 1e3:.0f} ms")
    print(
        f"  model calls x2: C2 = {saturated.audio_per_s:.2f}; {scaled_half.listeners} listeners: "
        f"{scaled_half.stalled} stalled (0)"
    )


# -- closed loop: what the machine makes ------------------------------------------------------------


@dataclass(frozen=True)
class ClosedLoop:
    clients: int
    audio_per_s: float
    """Audio seconds received per wall second, from the first request to the last byte."""
    errors: int
    rejected: int


async def closed_loop(target: Target, count: int, requests_each: int) -> ClosedLoop:
    """``count`` clients each asking for ``requests_each`` utterances back to back, reading each answer as fast as
    it comes (no playback): the audio seconds received per wall second, from the first request to the last byte. A
    run from a standing start to every answer read, rather than a window of a running load: a server that answers
    whole WAVs answers its clients in step, so a window shorter than many rounds of them would catch some rounds'
    WAVs or none; the ramp at the start and the tail at the end are there for both servers alike."""
    each = clients(count)
    audio = 0.0
    errors = rejected = 0

    async def ask(index: int, client: httpx.AsyncClient) -> None:
        nonlocal audio, errors, rejected
        async with client:
            for n in range(requests_each):
                text = UTTERANCES[(index + n) % len(UTTERANCES)]
                header = WAV_HEADER if target.route == "piper" else 0
                try:
                    async with target.request(client, text) as response:
                        if response.status_code == 503:
                            rejected += 1
                            await asyncio.sleep(float(response.headers.get("retry-after", "1")))
                            continue
                        if response.status_code != 200:
                            errors += 1
                            continue
                        rate = target.sample_rate(response)
                        async for chunk in response.aiter_bytes():
                            skip = min(header, len(chunk))
                            header -= skip
                            audio += (len(chunk) - skip) / 2 / rate
                except httpx.HTTPError:
                    errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(ask(i, client) for i, client in enumerate(each)))
    return ClosedLoop(count, audio / (time.perf_counter() - start), errors, rejected)


def closed_loop_pairs(levels: list[int], env: dict[str, str], pairs: int, requests_each: int) -> None:
    """Each level in ``pairs`` pairs of runs, rtvoice's and Piper's HTTP server's back to back, which goes first
    alternating by pair; each pair's ratio is rtvoice's over Piper's, and a level's figure their median (the
    machine's drift within a run cancels out of a pair)."""
    try:
        import flask  # noqa: F401
    except ImportError:
        print("piper-tts[http] is not installed (make bench installs it): no reference")
        return
    from rtvoice.engine.voices import embedded_voice_path

    server = start_rtvoice(env)
    piper = start_piper_http(embedded_voice_path())
    try:
        ours = Target("rtvoice", server.url, "sft")
        reference = Target("Piper HTTP server", piper.url, "piper")
        asyncio.run(run_row("warm-up", ours, server, 2, 1, 0.0))
        asyncio.run(closed_loop(reference, 2, 1))
        print(
            f"\nclosed loop: N clients asking for {requests_each} utterances each back to back, audio s received per "
            "wall s to the last byte; rtvoice on /inference_sft (pcm), Piper's HTTP server whole WAVs"
        )
        columns = ("clients", 7), ("pair", 4), ("first", 7), ("rtvoice", 8), ("Piper", 8), ("ratio", 6), ("503s", 5)
        print(" ".join(f"{name:>{width}}" for name, width in columns), f"{'errors':>6}")
        for level in levels:
            ratios = []
            for pair in range(pairs):
                order = [ours, reference] if pair % 2 == 0 else [reference, ours]
                got = {target.route: asyncio.run(closed_loop(target, level, requests_each)) for target in order}
                mine, theirs = got["sft"], got["piper"]
                ratio = mine.audio_per_s / theirs.audio_per_s if theirs.audio_per_s else math.nan
                ratios.append(ratio)
                print(
                    f"{level:7d} {pair + 1:4d} {'rtvoice' if order[0] is ours else 'Piper':>7} "
                    f"{mine.audio_per_s:8.2f} {theirs.audio_per_s:8.2f} {ratio:6.2f} {mine.rejected:5d} "
                    f"{mine.errors + theirs.errors:6d}",
                    flush=True,
                )
            print(f"{level:7d} clients: rtvoice / Piper, median of {pairs} pairs = {statistics.median(ratios):.2f}x")
    finally:
        server.stop()
        piper.stop()


# -- the sweep --------------------------------------------------------------------------------------


def sweep(
    levels: list[int],
    env: dict[str, str],
    utterances: int,
    join_s: float,
    batching_off: bool,
    with_piper: bool,
    route: str,
    timeline: bool = False,
) -> None:
    runs = [("rtvoice", env)]
    if batching_off:
        runs.append(("rtvoice, batching off", {**env, "RTVOICE_MAX_BATCH_SIZE": "1"}))
    for name, run_env in runs:
        server = start_rtvoice(run_env)
        try:
            target = Target(name, server.url, route)
            asyncio.run(run_row("warm-up", target, server, 2, 1, 0.0))
            rows = [
                asyncio.run(run_row(f"{level} listeners", target, server, level, utterances, join_s))
                for level in levels
            ]
        finally:
            server.stop()
        print_rows(name, rows)
        if timeline:
            for row in rows:
                print_timeline(row)
    if with_piper:
        try:
            import flask  # noqa: F401
        except ImportError:
            print("\npiper-tts[http] is not installed: Piper's HTTP server is left out")
            return
        from rtvoice.engine.voices import embedded_voice_path

        piper = start_piper_http(embedded_voice_path())
        try:
            target = Target("Piper HTTP server", piper.url, "piper")
            rows = [
                asyncio.run(run_row(f"{level} listeners", target, None, level, utterances, join_s)) for level in levels
            ]
        finally:
            piper.stop()
        print_rows("Piper's HTTP server (whole WAVs; TTFA is the whole synthesis)", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=int, nargs="+", help="run a sweep of these listener counts instead")
    parser.add_argument("--utterances", type=int, default=2, help="utterances each listener plays")
    parser.add_argument("--join-seconds", type=float, default=1.0, help="sweep: listeners join over this time")
    parser.add_argument("--route", choices=["sft", "openai"], default="sft", help="sweep: the route listeners use")
    parser.add_argument("--env", nargs="*", default=[], help="extra RTVOICE_X=Y settings for every rtvoice server")
    parser.add_argument(
        "--batching-off",
        action="store_true",
        help="sweep: also with RTVOICE_MAX_BATCH_SIZE=1 (the same for the embedded Piper voice, whose "
        "steps run alone on a CPU; it tells for a voice that batches, e.g. a CosyVoice2 model made "
        "the default voice with --env)",
    )
    parser.add_argument("--no-piper", action="store_true", help="sweep: leave Piper's HTTP server out")
    parser.add_argument(
        "--closed-loop",
        type=int,
        nargs="+",
        metavar="N",
        help="instead: N clients asking back to back (no playback), audio s received per wall s, against Piper's "
        "HTTP server in alternating pairs",
    )
    parser.add_argument("--pairs", type=int, default=4, help="closed loop: pairs of runs per client count")
    parser.add_argument("--requests", type=int, default=2, help="closed loop: utterances each client asks for")
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="sweep: also each utterance's times (asked, first and last byte, end of playback) and its gaps",
    )
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    if args.closed_loop:
        closed_loop_pairs(args.closed_loop, env, args.pairs, args.requests)
    elif args.levels:
        sweep(
            args.levels,
            env,
            args.utterances,
            args.join_seconds,
            args.batching_off,
            not args.no_piper,
            args.route,
            args.timeline,
        )
    else:
        targets(env, args.utterances)


if __name__ == "__main__":
    main()
