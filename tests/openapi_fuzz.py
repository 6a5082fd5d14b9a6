"""Schemathesis over a running server's /openapi.json: every operation, valid and invalid input, no 5xx."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode


@schemathesis.serializer("application/sdp", "application/trickle-ice-sdpfrag")
def _text_body(ctx: Any, value: Any) -> bytes:
    """WHEP's SDP bodies are text; a generated non-string still goes out (as its JSON), to be refused."""
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else json.dumps(value).encode()


def fuzz_openapi(base_url: str, max_examples: int, skip: tuple[str, ...] = ()) -> Counter[int]:
    """Run every operation (but those whose label contains one of ``skip``) with ``max_examples`` cases of each
    generation mode; raise AssertionError at the first 5xx. Returns how often each status came back."""
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    statuses: Counter[int] = Counter()
    for result in schema.get_all_operations():
        operation = result.ok()
        if any(part in operation.label for part in skip):
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz_operation(base_url, operation, mode, max_examples, statuses)
    return statuses


def _fuzz_operation(
    base_url: str, operation: Any, mode: GenerationMode, max_examples: int, statuses: Counter[int]
) -> None:
    """``max_examples`` cases of ``operation`` in ``mode``, counted into ``statuses``; AssertionError at a 5xx."""

    @settings(max_examples=max_examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        response = case.call(base_url=base_url, timeout=120)
        statuses[response.status_code] += 1
        assert response.status_code < 500, (
            operation.label,
            mode.value,
            case.query,
            case.body,
            response.status_code,
            response.text[:300],
        )

    try:
        check()
    except Unsatisfiable:
        assert mode is GenerationMode.NEGATIVE  # an operation without inputs has no invalid ones
