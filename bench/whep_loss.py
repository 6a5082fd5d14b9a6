"""What Opus in-band FEC and RED buy a WHEP player under loss, and what they cost a session's CPU.

    python -m bench.whep_loss [--wav speech48k.wav] [--seeds 5]

Speech (a WAV at 48 kHz mono; by default the passage below, spoken by ``rtvoice say``
with the embedded voice) goes through what a WHEP session's track does per 20 ms
frame: ``OpusPacketEncoder`` at each adaptation profile's bit rate and loss hint,
FEC on or off, then RED packing (``app/whep/red.py``) or not. Reported:

- CPU per second of speech for each way of sending, and its ratio to today's
  plain stream (40 kbit/s, no FEC, no RED): each frame's encode (and RED packing)
  timed in ``REPEATS`` passes taken in turn, its fastest pass counted, so that a
  busy spell on a shared machine drops out; only the ratios compare across machines. Silence costs nothing in any
  of them: settled silence is one cached packet.
- For seeded random loss (5, 10, 20%) and Gilbert–Elliott bursts (10%, mean burst
  2.5 packets), averaged over ``--seeds`` patterns: the share of speech frames a
  player conceals (``testkit/loss.py``: RED's copy of a lost packet first, then the
  next packet's FEC, else concealment) and the SNR of the playout against the
  lossless decode of the same packets.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rtvoice.app.whep.adaptation import PROFILES, LinkProfile
from rtvoice.app.whep.red import red_payload
from rtvoice.engine.audio.encoding import OpusPacketEncoder, OpusTuning
from testkit.loss import FRAME_SAMPLES, StreamPacket, gilbert_elliott, is_speech, lossless, playout, random_losses

PASSAGE = (
    "When the committee finally gathered in the old library on a rainy Thursday afternoon, everyone expected a "
    "short meeting, but the discussion about the new budget went on for hours. Then the chair stood up, thanked "
    "everyone for coming, and promised that the next meeting would be shorter."
)
OPUS_PT, RED_PT = 111, 63
REPEATS = 5
"""Encoding passes per way of sending for the CPU figure, taken in turn (the fastest counts)."""


@dataclass(frozen=True)
class Way:
    name: str
    tuning: OpusTuning
    red: bool


def ways() -> list[Way]:
    found = [Way("today: 40 kbit/s, no FEC", OpusTuning(40_000), red=False)]
    for profile in PROFILES:
        found.append(Way(f"{profile.name}: FEC off", tuning_for(profile, fec=False), red=False))
        found.append(Way(f"{profile.name}: FEC", tuning_for(profile, fec=True), red=False))
        found.append(Way(f"{profile.name}: FEC + RED", tuning_for(profile, fec=True), red=True))
    found.append(Way(f"{PROFILES[-1].name}: RED, FEC off", tuning_for(PROFILES[-1], fec=False), red=True))
    return found


def tuning_for(profile: LinkProfile, fec: bool) -> OpusTuning:
    return OpusTuning(profile.bit_rate, profile.packet_loss_percent, fec)


def speech(path: Path | None) -> np.ndarray:
    if path is None:
        path = Path(tempfile.mkdtemp()) / "passage.wav"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "rtvoice.app.cli",
                "say",
                "--sample-rate",
                "48000",
                "--seed",
                "1",
                "-o",
                path,
                PASSAGE,
            ],
            check=True,
        )
    with wave.open(str(path)) as wav:
        if wav.getframerate() != 48_000 or wav.getnchannels() != 1:
            raise SystemExit(f"{path}: 48 kHz mono WAV wanted")
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
    return pcm[: len(pcm) // FRAME_SAMPLES * FRAME_SAMPLES]


def send(pcm: np.ndarray, way: Way) -> tuple[list[StreamPacket], np.ndarray]:
    """The packets a session sends for ``pcm`` and the seconds each frame took (encoder opened outside)."""
    encoder = OpusPacketEncoder(48_000, FRAME_SAMPLES, way.tuning)
    packets: list[StreamPacket] = []
    previous: bytes | None = None
    took = np.zeros(len(pcm) // FRAME_SAMPLES)
    for i in range(len(took)):
        started = time.perf_counter()
        opus = encoder.encode(pcm[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES])
        if way.red:
            payload = red_payload(OPUS_PT, opus, previous, FRAME_SAMPLES)
            packets.append(StreamPacket(i * FRAME_SAMPLES, RED_PT, payload))
        else:
            packets.append(StreamPacket(i * FRAME_SAMPLES, OPUS_PT, opus))
        took[i] = time.perf_counter() - started
        previous = opus
    return packets, took


def snr_db(reference: np.ndarray, got: np.ndarray) -> float:
    ref = reference.astype(np.float64)
    noise = np.sum((got.astype(np.float64) - ref) ** 2)
    return float(10 * np.log10(np.sum(ref**2) / max(noise, 1.0)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wav", type=Path, help="48 kHz mono speech (default: the passage, spoken now)")
    parser.add_argument("--seeds", type=int, default=5, help="loss patterns per loss condition")
    args = parser.parse_args()
    pcm = speech(args.wav)
    seconds = len(pcm) / 48_000
    frames = len(pcm) // FRAME_SAMPLES
    conditions = {
        "random 5%": lambda seed: random_losses(frames, 0.05, seed),
        "random 10%": lambda seed: random_losses(frames, 0.10, seed),
        "random 20%": lambda seed: random_losses(frames, 0.20, seed),
        "bursts 10%": lambda seed: gilbert_elliott(frames, 0.10, 2.5, seed),
    }
    print(f"{seconds:.1f} s of speech, {frames} frames; CPU: each frame's fastest of {REPEATS} passes\n")
    header = f"{'way':28} {'kbit/s':>7} {'CPU ms/s':>9} {'x today':>8}"
    print(header + "".join(f" | {name:>20}" for name in conditions))
    print(" " * len(header) + "".join(f" | {'concealed  SNR dB':>20}" for _ in conditions))
    all_ways = ways()
    cpu = {way.name: np.full(frames, np.inf) for way in all_ways}
    sent: dict[str, list[StreamPacket]] = {}
    for _ in range(REPEATS):  # in turn, and each frame's fastest pass: a busy spell on a shared machine drops out
        for way in all_ways:
            sent[way.name], took = send(pcm, way)
            cpu[way.name] = np.minimum(cpu[way.name], took)
    baseline = cpu[all_ways[0].name].sum() / seconds * 1000
    for way in all_ways:
        packets = sent[way.name]
        cpu_ms = cpu[way.name].sum() / seconds * 1000
        kbps = sum(len(p.payload) for p in packets) * 8 / seconds / 1000
        red_type = RED_PT if way.red else None
        reference = lossless(packets, red_type)
        speech_frames = sum(
            is_speech(reference[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES])
            for i in range(len(reference) // FRAME_SAMPLES)
        )
        cells = []
        for lost_of in conditions.values():
            concealed, snrs = [], []
            for seed in range(args.seeds):
                result = playout(packets, lost_of(seed), fec=True, red_type=red_type, reference=reference)
                concealed.append(result.concealed_speech_samples / FRAME_SAMPLES / speech_frames)
                snrs.append(snr_db(reference, result.pcm))
            cells.append(f"{np.mean(concealed) * 100:9.1f}% {np.mean(snrs):9.1f}")
        print(
            f"{way.name:28} {kbps:7.1f} {cpu_ms:9.2f} {cpu_ms / baseline:8.2f}" + "".join(f" | {c:>20}" for c in cells)
        )


if __name__ == "__main__":
    main()
