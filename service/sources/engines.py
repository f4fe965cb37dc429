"""Which engine served a `/metrics` page, and its adapter: every adapter turns a page into the same
`EngineSnapshot` per served model, so nothing downstream knows which engine it reads.

Each engine names its own metrics with a prefix no other engine uses:

    vLLM          vllm:<name>        service/sources/vllm.py
    SGLang        sglang:<name>      service/sources/sglang.py
    TensorRT-LLM  trtllm_<name>      service/sources/trtllm.py
    llama.cpp     llamacpp:<name>    service/sources/llamacpp.py

A page is told by the prefixes its sample lines start with (comment lines do not count). Exactly one engine's:
that adapter reads it. Several: MIXED_ENGINES, naming them (one scrape target is one server; a page that mixes
engines is a proxy or federation endpoint whose sums would mean nothing). None: the adapter of `engine` if set,
else UNKNOWN_ENGINE naming the metric-name prefixes the page does carry, so the operator sees what answered.
A target's `engine` setting skips the guess but not the check: a page of another engine is MIXED_ENGINES too.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from enum import StrEnum
from types import MappingProxyType

from policies.types import EngineSnapshot
from service.sources import exposition, llamacpp, sglang, trtllm, vllm
from service.sources.errors import ScrapeError, ScrapeErrorReason


class EngineKind(StrEnum):
    """The engines read, and `auto` (tell from the page). Values are the settings' and the API's spelling."""

    AUTO = "auto"
    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"
    LLAMACPP = "llamacpp"


PREFIXES: Mapping[EngineKind, str] = MappingProxyType(
    {
        EngineKind.VLLM: "vllm:",
        EngineKind.SGLANG: "sglang:",
        EngineKind.TRTLLM: "trtllm_",
        EngineKind.LLAMACPP: "llamacpp:",
    }
)

_PARSERS: Mapping[EngineKind, Callable[..., dict[str, EngineSnapshot]]] = MappingProxyType(
    {
        EngineKind.VLLM: vllm.parse_vllm_metrics,
        EngineKind.SGLANG: sglang.parse_sglang_metrics,
        EngineKind.TRTLLM: trtllm.parse_trtllm_metrics,
        EngineKind.LLAMACPP: llamacpp.parse_llamacpp_metrics,
    }
)

# A metric name's leading word, for naming what an unknown page carries: "tgi_request_count" -> "tgi_".
_LEADING_WORD = re.compile(r"^([A-Za-z][A-Za-z0-9]*[:_])")
_PREFIXES_SHOWN = 5


def engines_on(text: str) -> list[EngineKind]:
    """The engines whose metric prefix starts some line of `text`, in `EngineKind` order.
    Example: a vLLM 0.32 page -> [VLLM]; "sglang:num_running_reqs 1\\nvllm:num_requests_running 2\\n" -> both."""
    return [kind for kind, prefix in PREFIXES.items() if text.startswith(prefix) or f"\n{prefix}" in text]


def parse_engine_page(
    text: str, *, taken_at_s: float, engine: EngineKind = EngineKind.AUTO
) -> dict[str, EngineSnapshot]:
    """Snapshots keyed by served model from one page, read by its engine's adapter (module docstring).
    Raises `ScrapeError` only: the adapter's reasons, MIXED_ENGINES or UNKNOWN_ENGINE."""
    kind = page_engine(text, engine)
    return _PARSERS[kind](text, taken_at_s=taken_at_s)


class PageReader:
    """Reads one server's pages in turn (`parse_engine_page`), keeping what an engine's pages must be read with
    across pages: SGLang's adaptive tiers (sglang.py `TierMemory`). One per scrape target."""

    def __init__(self, engine: EngineKind = EngineKind.AUTO) -> None:
        self._engine = engine
        self._sglang = sglang.TierMemory()

    def read(self, text: str, *, taken_at_s: float) -> dict[str, EngineSnapshot]:
        """This page's snapshots (`parse_engine_page`'s contract, and MISSING_FAMILY from `TierMemory`)."""
        kind = page_engine(text, self._engine)
        snapshots = _PARSERS[kind](text, taken_at_s=taken_at_s)
        return self._sglang.resolve(snapshots) if kind is EngineKind.SGLANG else snapshots


def page_engine(text: str, engine: EngineKind = EngineKind.AUTO) -> EngineKind:
    """The engine whose adapter reads `text` (module docstring); MIXED_ENGINES, UNKNOWN_ENGINE or PARSE."""
    found = engines_on(text)
    if len(found) > 1 or (found and engine is not EngineKind.AUTO and found != [engine]):
        shown = ", ".join(kind.value for kind in found)
        expected = f" (the target says {engine.value})" if engine is not EngineKind.AUTO else ""
        raise ScrapeError(ScrapeErrorReason.MIXED_ENGINES, f"series of {shown} on one page{expected}")
    kind = found[0] if found else engine
    if kind is EngineKind.AUTO:
        _raise_unknown(text)
    return kind


def _raise_unknown(text: str) -> None:
    if text and not text.endswith("\n"):
        raise ScrapeError(ScrapeErrorReason.PARSE, "body does not end with a newline (truncated page)")
    exposition.raise_unless_prometheus_text(text)
    words: Counter[str] = Counter()
    for line in text.split("\n"):
        match = _LEADING_WORD.match(line)
        if match:
            words[match.group(1)] += 1
    seen = ", ".join(word for word, _ in words.most_common(_PREFIXES_SHOWN)) or "none"
    known = ", ".join(PREFIXES.values())
    raise ScrapeError(
        ScrapeErrorReason.UNKNOWN_ENGINE,
        f"no series of a known engine ({known}) on the page; its metric prefixes: {seen}",
    )
