"""Sizes the fixture's model makes, derived from the model (never copied from the code): samples per speech
token, the LM's token limit for a text, the token-to-wave hop schedule. Each takes a loaded
``CosyVoice2Service``."""

from __future__ import annotations

from typing import Any

from rtvoice.engine.models.cosyvoice2.steps import MAX_TOKEN_TEXT_RATIO
from rtvoice.engine.models.cosyvoice2.token2wav import MAX_HOP_FACTOR, MEL_CACHE_FRAMES


def samples_per_token(service: Any) -> int:
    """Audio samples one speech token becomes: the flow's mel frames per token times HiFT's samples per frame."""
    return service.model.token2wav.token_mel_ratio * service.model.hift.cfg.samples_per_frame


def most_tokens(service: Any, text: str) -> int:
    """The LM's token limit for ``text`` (MAX_TOKEN_TEXT_RATIO per text id), which the fixture's random LM, never
    choosing end-of-speech, always reaches."""
    return int(MAX_TOKEN_TEXT_RATIO * len(service.runner.frontend.text_ids(text)))


def expected_chunk_samples(service: Any, n_tokens: int, n_prompt: int) -> list[int]:
    """The hop schedule: first hop padded so prompt + hop fill whole chunks, hops doubling up to MAX_HOP_FACTOR
    chunks, each streamed chunk holding back the HiFT overlap, the final chunk the rest."""
    token2wav = service.model.token2wav
    chunk_size, lookahead, per_token = token2wav.chunk_size, token2wav.pre_lookahead, samples_per_token(service)
    pad = -(-n_prompt // chunk_size) * chunk_size - n_prompt
    hold = MEL_CACHE_FRAMES * service.model.hift.cfg.samples_per_frame
    sizes, offset, hop = [], 0, chunk_size
    while True:
        this_hop = hop + pad if offset == 0 else hop
        if n_tokens - offset < this_hop + lookahead:
            break
        sizes.append(this_hop * per_token - (hold if not sizes else 0))
        offset += this_hop
        hop = min(chunk_size * MAX_HOP_FACTOR, hop * 2)
    sizes.append((n_tokens - offset) * per_token + (hold if sizes else 0))
    return sizes
