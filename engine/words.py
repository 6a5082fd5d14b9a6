"""Word timings: the one representation every transport sends, and how a stream makes them.

A word is what the client wrote (``$100``, its character span in all the text it sent on the stream) and when it
is heard, in seconds of the stream's output audio: the time base of the samples the client receives, after speed
(a voice's durations include it), resampling (which keeps time) and cross-fades (which do not move the timeline);
segments follow each other in the audio, so each segment's words are offset by the audio made before it.

Where the voice knows its timing (a Piper voice: the encoder's durations, ``SpokenTiming`` per token) the words
are exact. Where it does not (CosyVoice2) they are an estimate, marked ``approximate``: each word's place in its
segment's text, weighted by characters (CJK ones count as three, as they take about a syllable each), spread over
the segment's length: exactly when the voice knows it before its audio is all made (``segment_length_s``; a
CosyVoice2 segment's once its LM has stopped), else the larger of the audio made so far and the text's length at
the speaking rate of this stream's earlier segments (at first a typical reading rate). An estimated word is handed
out, final, with the audio that holds its estimated start, so it never comes after that audio; so where a segment
turns out shorter than estimated, an estimated end can pass its audio.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field

from rtvoice.engine.models.base import SegmentTimings, SpokenTiming
from rtvoice.engine.text import Segment, SegmentMark, Word

TYPICAL_SECONDS_PER_UNIT = 1 / 15
"""A reading rate of about 15 Latin characters a second: the first estimate of a segment's length, before the
stream has finished a segment of its own."""
WIDE_CHARACTER_UNITS = 3.0
"""A CJK character is about a syllable: three Latin characters' worth."""


@dataclass(frozen=True)
class WordTiming:
    text: str
    """As the client wrote it."""
    start: int
    """Character offsets in all the text the client sent on the stream."""
    end: int
    start_s: float
    """Seconds in the stream's output audio: where the word starts and ends."""
    end_s: float
    approximate: bool
    """True for an estimate (a voice that does not know its timing)."""


@dataclass(frozen=True)
class MarkTiming:
    """A ``<mark>`` reached: where it stands in the text and when, in the same time base as words."""

    name: str
    position: int
    """Character offset of the mark in all the text the client sent on the stream."""
    start_s: float
    """Where the first word after it starts in the stream's output audio (the end of the audio before it when no
    word follows)."""

    @property
    def end_s(self) -> float:
        return self.start_s


Timed = WordTiming | MarkTiming


def _units(char: str) -> float:
    if unicodedata.east_asian_width(char) in ("W", "F"):
        return WIDE_CHARACTER_UNITS
    return 1.0


@dataclass
class _SegmentWords:
    segment: Segment
    start_sample: int | None = None
    """Where the segment starts in the stream's audio (voice-rate samples); None until the one before ends."""
    samples: int = 0
    """Audio made for it so far."""
    tokens: tuple[SpokenTiming, ...] | None = None
    """The voice's exact timings, when it has them."""
    estimated: bool = False
    """Its audio began before the voice gave timings: its words are estimates."""
    handed_out: int = 0
    """Words handed out so far."""
    fractions: list[tuple[float, float]] = field(default_factory=list)
    """For estimates: each word's start and end as a share of the segment's length."""
    last_start_s: float = 0.0
    marks_out: int = 0
    """Marks handed out so far (in order: each before the word it stands before)."""


class WordClock:
    """One stream's words, segment by segment, handed out in the order of their audio."""

    def __init__(self, voice_rate: int) -> None:
        self.voice_rate = voice_rate
        self._segments: list[_SegmentWords] = []
        self._current = 0
        """The segment whose audio is being made."""
        self._samples = 0
        self._estimated_s = 0.0
        self._estimated_units = 0.0
        """Seconds and text units of this stream's finished estimated segments: its own speaking rate."""

    def add_segment(self, segment: Segment) -> None:
        entry = _SegmentWords(segment)
        if len(self._segments) == self._current:  # every earlier segment is done: it starts where the audio is
            entry.start_sample = self._samples
        self._segments.append(entry)

    def timings(self, timings: Sequence[SegmentTimings]) -> list[Timed]:
        """The voice's exact timings; returns the words that can be placed now."""
        for timing in timings:
            if timing.segment < len(self._segments) and not self._segments[timing.segment].estimated:
                self._segments[timing.segment].tokens = timing.tokens
        return self._exact_ready()

    def audio(self, samples: int, length_s: float | None) -> list[Timed]:
        """The current segment made ``samples`` more (voice rate); ``length_s`` is its whole length when the voice
        knows it. Returns the words to hand out before that audio."""
        words = self._exact_ready()
        if self._current < len(self._segments):
            entry = self._segments[self._current]
            if entry.tokens is None and entry.samples == 0:
                entry.estimated = True
            entry.samples += samples
            if entry.estimated:
                made_s = entry.samples / self.voice_rate
                words += self._estimates(entry, max(made_s, length_s or self._length_guess(entry.segment)), made_s)
        self._samples += samples
        return words

    def segment_done(self) -> list[Timed]:
        """The current segment's audio is complete: the rest of its words and marks, and the next segment's
        start."""
        words: list[Timed] = []
        if self._current < len(self._segments):
            entry = self._segments[self._current]
            if entry.tokens is None:  # no timings (and maybe no audio): estimate over what was made
                entry.estimated = True
                length_s = entry.samples / self.voice_rate
                words += self._estimates(entry, length_s, float("inf"))
                self._estimated_s += length_s
                self._estimated_units += sum(_units(c) for c in entry.segment.text)
            if entry.start_sample is not None:
                end_s = (entry.start_sample + entry.samples) / self.voice_rate
                words += self._marks(entry, len(entry.segment.words), end_s)
            self._current += 1
            if self._current < len(self._segments):
                self._segments[self._current].start_sample = self._samples
        return words + self._exact_ready()

    def pause(self, samples: int, marks: Sequence[SegmentMark]) -> list[Timed]:
        """A pause of ``samples`` (voice rate) between segments; returns its marks, reached where it starts."""
        at_s = self._samples / self.voice_rate
        self._samples += samples
        if self._current < len(self._segments):
            entry = self._segments[self._current]
            if entry.start_sample is not None and entry.samples == 0:
                entry.start_sample = self._samples
        return [MarkTiming(mark.name, mark.position, at_s) for mark in marks]

    def _marks(self, entry: _SegmentWords, before_word: int, at_s: float) -> list[Timed]:
        """The segment's marks that stand before word ``before_word`` (all left, for the segment's end), at
        ``at_s``."""
        marks = entry.segment.marks
        out: list[Timed] = []
        while entry.marks_out < len(marks) and marks[entry.marks_out].word <= before_word:
            mark = marks[entry.marks_out]
            out.append(MarkTiming(mark.name, mark.position, at_s))
            entry.marks_out += 1
        return out

    # -- exact ----------------------------------------------------------------------------------------

    def _exact_ready(self) -> list[Timed]:
        words: list[Timed] = []
        for entry in self._segments[self._current :]:
            if entry.start_sample is None:
                break
            if entry.tokens is None or entry.handed_out:
                continue
            offset = entry.start_sample / self.voice_rate
            for index, word in enumerate(entry.segment.words):
                placed = self._place(word, entry, offset)
                words += self._marks(entry, index, placed.start_s)
                words.append(placed)
            entry.handed_out = len(entry.segment.words)
        return words

    def _place(self, word: Word, entry: _SegmentWords, offset: float) -> WordTiming:
        tokens = [t for t in entry.tokens or () if t.start < word.spoken_end and t.end > word.spoken_start]
        if tokens:
            start_s, end_s = tokens[0].start_s, max(t.end_s for t in tokens)
        else:  # cannot happen for words made from the same tokens; placed where the segment is so far
            start_s = end_s = entry.last_start_s
        entry.last_start_s = start_s = max(start_s, entry.last_start_s)
        return WordTiming(word.text, word.start, word.end, offset + start_s, offset + max(end_s, start_s), False)

    # -- estimated ------------------------------------------------------------------------------------

    def _length_guess(self, segment: Segment) -> float:
        units = sum(_units(c) for c in segment.text)
        rate = self._estimated_s / self._estimated_units if self._estimated_units else TYPICAL_SECONDS_PER_UNIT
        return units * rate

    def _estimates(self, entry: _SegmentWords, length_s: float, made_s: float) -> list[Timed]:
        """Hand out, final, the estimated words that start before ``made_s`` of the segment's audio."""
        if entry.start_sample is None:
            return []
        if not entry.fractions:
            entry.fractions = _fractions(entry.segment)
        offset = entry.start_sample / self.voice_rate
        words: list[Timed] = []
        while entry.handed_out < len(entry.segment.words):
            share_start, share_end = entry.fractions[entry.handed_out]
            start_s = max(share_start * length_s, entry.last_start_s)
            if start_s >= made_s:
                break
            end_s = max(share_end * length_s, start_s)
            word = entry.segment.words[entry.handed_out]
            words += self._marks(entry, entry.handed_out, offset + start_s)
            words.append(WordTiming(word.text, word.start, word.end, offset + start_s, offset + end_s, True))
            entry.last_start_s = start_s
            entry.handed_out += 1
        return words


def _fractions(segment: Segment) -> list[tuple[float, float]]:
    """Each word's start and end as a share of its segment's text, by units."""
    cumulative = [0.0]
    for char in segment.text:
        cumulative.append(cumulative[-1] + _units(char))
    total = cumulative[-1] or 1.0
    return [(cumulative[w.spoken_start] / total, cumulative[w.spoken_end] / total) for w in segment.words]
