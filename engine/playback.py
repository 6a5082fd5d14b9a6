"""A stream's playback clock: when a listener who plays from the first byte runs out of audio."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Played:
    """What one piece of audio did to the clock."""

    late_s: float
    """How long the listener had been waiting for it (0 when it came in time)."""
    ttfa_s: float | None
    """For the stream's first audio: the time from its text to it."""


class PlaybackClock:
    def __init__(self, now: float) -> None:
        self.owed_since = now
        """When the listener began to wait for first audio (arrival, or text after silence)."""
        self.runs_out_at: float | None = None
        """None until the first audio, then when the listener runs out: the stream's deadline."""
        self.first_audio_at: float | None = None
        self.audio_s = 0.0
        self.buffered_s = 0.0
        """Audio the listener had in hand right after the last piece arrived (its buffer's high point)."""
        self.late_chunks = 0
        self.stall_s = 0.0

    @property
    def owes_first_audio(self) -> bool:
        return self.runs_out_at is None

    def due_in(self, now: float) -> float | None:
        """Seconds of audio the listener still has; None before the first audio."""
        return None if self.runs_out_at is None else self.runs_out_at - now

    def restart_if_silent(self, now: float) -> None:
        """New text: if the listener has nothing left to play, its next audio is a first audio again."""
        if self.runs_out_at is None or self.runs_out_at <= now:
            self.runs_out_at = None
            self.owed_since = now

    def play(self, duration_s: float, now: float) -> Played:
        """Account ``duration_s`` of audio ready at ``now``."""
        late = 0.0
        ttfa = None
        if self.runs_out_at is None:
            if self.first_audio_at is None:
                self.first_audio_at = now
                ttfa = now - self.owed_since
            self.runs_out_at = now
        elif now > self.runs_out_at:
            late = now - self.runs_out_at
            self.late_chunks += 1
            self.stall_s += late
            self.runs_out_at = now
        self.runs_out_at += duration_s
        self.audio_s += duration_s
        self.buffered_s = self.runs_out_at - now
        return Played(late, ttfa)
