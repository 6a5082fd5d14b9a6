"""Which token of a segment's text each of its phoneme ids speaks, so the encoder's durations time the words.

The phonemiser reads a segment as a whole: numbers and symbols become several phoneme words (``100`` ->
``wˈʌnhˈʌndɹɪd``), short words merge (``in the`` -> ``ɪnðə``), and a word sounds a little different in context.
So each token of the segment (``engine.text.spoken_tokens``) is phonemised on its own, and the concatenation is
aligned to the segment's phonemes by edit distance (rapidfuzz): each phoneme of the segment takes the token of the
phoneme it is aligned with, or of its neighbour in the same phoneme word where it has none. Only sounds are
aligned; stress marks, blanks and punctuation (which the voice speaks as pauses) belong to no token.

The ids follow piper-tts's ``phonemes_to_ids``: per sentence, BOS and a pad, then each phoneme's ids and a pad,
then EOS. A phoneme's pad is spoken as part of it; BOS, EOS and their pads belong to no token.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from rapidfuzz.distance import Levenshtein

from rtvoice.engine.models.base import SpokenTiming

BOS, EOS, PAD = "^", "$", "_"
"""piper-tts's marks (``piper.const``)."""
STRESS = {"\u02c8", "\u02cc"}


@dataclass(frozen=True)
class PhonemeIds:
    ids: list[int]
    owner: list[int]
    """For each id, the index of the phoneme (in the segment's phonemes, sentences joined) it speaks; -1 for
    BOS, EOS and their pads."""
    phonemes: list[str]


def phoneme_ids(sentences: Sequence[Sequence[str]], id_map: Mapping[str, Sequence[int]]) -> PhonemeIds:
    """The ids of a segment's sentences, as ``phonemes_to_ids`` makes them, with the phoneme each id speaks."""
    ids: list[int] = []
    owner: list[int] = []
    phonemes: list[str] = []

    def put(values: Sequence[int], phoneme: int) -> None:
        ids.extend(values)
        owner.extend([phoneme] * len(values))

    for sentence in sentences:
        if not sentence:
            continue
        put(id_map[BOS], -1)
        put(id_map[PAD], -1)
        for phoneme in sentence:
            index = len(phonemes)
            phonemes.append(phoneme)
            if phoneme in id_map:  # piper-tts skips (and logs) phonemes its map lacks
                put(id_map[phoneme], index)
                put(id_map[PAD], index)
        put(id_map[EOS], -1)
    return PhonemeIds(ids, owner, phonemes)


def is_sound(phoneme: str) -> bool:
    """A phoneme that takes time as speech: not a blank, a punctuation mark or a stress mark."""
    return (
        bool(phoneme)
        and phoneme not in STRESS
        and not all(unicodedata.category(char)[0] in "PZ" or char.isspace() for char in phoneme)
    )


def token_of_phonemes(phonemes: Sequence[str], tokens: Sequence[Sequence[str]]) -> list[int]:
    """For each phoneme of a segment, the index of the token that speaks it (-1 for none).

    ``tokens`` holds each token's phonemes, phonemised alone."""
    token_sounds: list[str] = []
    token_index: list[int] = []
    for k, token in enumerate(tokens):
        for phoneme in token:
            if is_sound(phoneme):
                token_sounds.append(phoneme)
                token_index.append(k)
    positions = [i for i, phoneme in enumerate(phonemes) if is_sound(phoneme)]
    # The phoneme word (blank-separated) of each sound: a sound with no partner takes a neighbour's token from it.
    word_of: list[int] = []
    word = 0
    for phoneme in phonemes:
        if phoneme.isspace():
            word += 1
        word_of.append(word)
    labels: list[int] = [-1] * len(positions)
    if token_sounds and positions:
        sounds = [phonemes[i] for i in positions]
        for op in Levenshtein.opcodes(token_sounds, sounds):
            if op.tag in ("equal", "replace"):
                for offset in range(min(op.src_end - op.src_start, op.dest_end - op.dest_start)):
                    labels[op.dest_start + offset] = token_index[op.src_start + offset]
    _fill(labels, [word_of[i] for i in positions])
    result = [-1] * len(phonemes)
    for label, i in zip(labels, positions, strict=True):
        result[i] = label
    return result


def _fill(labels: list[int], words: list[int]) -> None:
    """Give unaligned sounds the token of the nearest aligned sound in their phoneme word, else the previous one
    (the next one at the start); labels stay in order."""
    count = len(labels)
    before = [-1] * count
    after = [-1] * count
    for i in range(1, count):
        before[i] = i - 1 if labels[i - 1] >= 0 else before[i - 1]
    for i in range(count - 2, -1, -1):
        after[i] = i + 1 if labels[i + 1] >= 0 else after[i + 1]
    filled = list(labels)
    for i in range(count):
        if labels[i] >= 0:
            continue
        b, a = before[i], after[i]
        if a >= 0 and (b < 0 or words[b] != words[i]) and words[a] == words[i]:
            filled[i] = labels[a]
        elif b >= 0:
            filled[i] = labels[b]
        elif a >= 0:
            filled[i] = labels[a]
    for i in range(1, count):  # an alignment is monotonic; keep the labels so where filling is not
        filled[i] = max(filled[i], filled[i - 1])
    labels[:] = filled


def token_timings(
    text: str,
    token_spans: Sequence[tuple[int, int]],
    ids: PhonemeIds,
    durations: np.ndarray,
    frame_s: float,
    phonemize: Callable[[str], Sequence[str]],
) -> tuple[SpokenTiming, ...]:
    """Each token's time from the encoder's ``durations`` (frames per id): from its first id to its last (its
    pad included), and its onset (``_onset``). A token with no sound of its own (a dash) gets an empty time where
    the one before it ends."""
    tokens = [phonemize(text[start:end]) for start, end in token_spans]
    labels = token_of_phonemes(ids.phonemes, tokens)
    edges = np.concatenate([[0], np.cumsum(durations[: len(ids.ids)])])
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for position, phoneme in enumerate(ids.owner):
        if phoneme < 0 or labels[phoneme] < 0:
            continue
        first.setdefault(labels[phoneme], position)
        last[labels[phoneme]] = position
    timings: list[SpokenTiming] = []
    previous_end = 0.0
    for k, (start, end) in enumerate(token_spans):
        if k in first:
            onset = _onset(first[k], ids)
            start_s, end_s = float(edges[onset]) * frame_s, float(edges[last[k] + 1]) * frame_s
        else:
            start_s = end_s = previous_end
        timings.append(SpokenTiming(start, end, start_s, end_s))
        previous_end = end_s
    return tuple(timings)


def _onset(first: int, ids: PhonemeIds) -> int:
    """Where a word whose first id is ``first`` starts: at the blank that joins it to the sound before it, if any.

    The voice spends that blank on the transition into the word: an independent forced aligner puts the word
    boundary there (on the embedded voice starts at the first phoneme come about 65 ms after the aligner's, and
    about 25 ms with the blank; bench/word_timing.py). A blank after punctuation is a pause, not a transition, and
    stays between the words."""
    onset = first
    while onset > 0 and ids.owner[onset - 1] >= 0 and ids.phonemes[ids.owner[onset - 1]].isspace():
        onset -= 1
    before = ids.owner[onset - 1] if onset > 0 else -1
    return onset if onset < first and before >= 0 and is_sound(ids.phonemes[before]) else first
