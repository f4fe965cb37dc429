"""Read a llama.cpp `llama-server` `/metrics` page (`--metrics`) into one `EngineSnapshot`.

Names and meaning are llama.cpp's (b10434..b11434: `server_task_result_metrics::to_metrics()` in
tools/server/server-task.cpp; the speculative counters arrived with llama.cpp PR #26389). The page is written by
hand, one HELP, TYPE and value line per family, with no labels but `position`, so it names no model: the snapshot's
key is `UNNAMED_MODEL` and the target's `model` setting names it (service/loop.py).

    running, waiting   llamacpp:requests_processing (busy slots), llamacpp:requests_deferred (queued tasks)
    generated, prompt  llamacpp:tokens_predicted_total, llamacpp:prompt_tokens_total
    drafts             llamacpp:spec_decode_num_drafts_total (verification steps that carried a draft)
    draft tokens       llamacpp:spec_decode_num_draft_tokens_total
    accepted           llamacpp:spec_decode_num_accepted_tokens_total
    per position       llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="i"}: verifications that
                       accepted at least i+1 drafts, one series per position up to `--spec-draft-n-max` (k)

Example (tests/fixtures/llamacpp/llamacpp-b10434-ngram-simple-k4.txt, a real capture): 40 drafts, 154 draft
tokens, 94 accepted, positions (28, 24, 22, 20) at k 4 -> E[L] = 1 + 94 / 40 = 3.35, r_1 = 28 / 40 = 0.70.

Caveats the adapter lives with:
- Values are C++ doubles printed with 6 significant digits ("%g"): a counter past 1e6 loses precision
  (1.23457e+06). The consistency checks allow a relative 1e-5; windowed rates stay good to ~1e-5 of the counter.
- The speculative and token counters move only when a request finishes (a slot is released); windows must be
  longer than a request.
- The speculative counters are written whether or not a drafter is configured; the per-position family appears
  with the first finished speculative request. Until then the page cannot tell speculation on from off, and with
  nothing drafted it reads as off.
- No KV-cache usage, no step-time histogram, no `_created` epochs (a restart shows as counters going down).

Failure policy, beyond the shared reading's (service/sources/exposition.py): MISSING_FAMILY without
requests_processing / requests_deferred, or with drafts counted but no per-position series (a build between the
totals and the positions); INVALID_VALUE for counts llama.cpp's accounting cannot produce
(`exposition.nested_counts_problem`) or more busy slots than `MAX_SLOTS`.
"""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.samples import Sample

from policies.types import EngineSnapshot, SpecDecodeCounters
from service.sources import exposition
from service.sources.errors import ScrapeError, ScrapeErrorReason

RUNNING = "llamacpp:requests_processing"
WAITING = "llamacpp:requests_deferred"
GENERATED = "llamacpp:tokens_predicted_total"
PROMPT = "llamacpp:prompt_tokens_total"
DRAFTS = "llamacpp:spec_decode_num_drafts_total"
DRAFT_TOKENS = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
PER_POSITION = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
WANTED: frozenset[str] = frozenset({RUNNING, WAITING, GENERATED, PROMPT, DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POSITION})

UNNAMED_MODEL = ""
"""The key of the one snapshot: llama-server's page names no model."""
NAMING = "llamacpp"
MAX_SLOTS = 1e6
"""The most busy slots or deferred tasks accepted (`-np` is tens to hundreds)."""
MAX_POSITIONS = 64
"""The most draft positions accepted (`--spec-draft-n-max` is a handful; as vLLM's MAX_POSITIONS)."""
PRINTED_PRECISION = 1e-5
"""Relative error of a value printed with 6 significant digits (half a unit in the 6th digit, rounded up)."""


def parse_llamacpp_metrics(text: str, *, taken_at_s: float) -> dict[str, EngineSnapshot]:
    """The page's one snapshot, keyed by `UNNAMED_MODEL` (module docstring). Raises `ScrapeError` only."""
    if text and not text.endswith("\n"):
        raise ScrapeError(ScrapeErrorReason.PARSE, "body does not end with a newline (truncated page)")
    samples = exposition.parse_lines(exposition.select_lines(text, WANTED, engine="llama.cpp"))
    index: dict[str, list[Sample]] = defaultdict(list, exposition.index_samples(samples))
    if not index[RUNNING] or not index[WAITING]:
        raise ScrapeError(ScrapeErrorReason.MISSING_FAMILY, f"llama.cpp page lacks {RUNNING} or {WAITING}")

    def total(name: str, limit: float = exposition.MAX_COUNT) -> float | None:
        return sum(exposition.checked(s, limit) for s in index[name]) if index[name] else None

    running, waiting = total(RUNNING, MAX_SLOTS), total(WAITING, MAX_SLOTS)
    assert running is not None and waiting is not None
    snapshot = EngineSnapshot(
        taken_at_s=taken_at_s,
        model_name=UNNAMED_MODEL,
        engines=1,
        spec=_spec(index, total(DRAFTS), total(DRAFT_TOKENS), total(ACCEPTED)),
        num_requests_running=running,
        num_requests_waiting=waiting,
        generation_tokens=total(GENERATED),
        prompt_tokens=total(PROMPT),
        naming=NAMING,
    )
    return {UNNAMED_MODEL: snapshot}


def _spec(
    index: dict[str, list[Sample]], drafts: float | None, draft_tokens: float | None, accepted: float | None
) -> SpecDecodeCounters | None:
    per_position = exposition.by_position(index[PER_POSITION], label="position", max_positions=MAX_POSITIONS,
                                          what="llama.cpp spec_decode")
    if not per_position:
        if drafts:
            raise ScrapeError(
                ScrapeErrorReason.MISSING_FAMILY,
                f"{drafts:g} drafts counted but no {PER_POSITION} series: acceptance per position cannot be read",
            )
        return None  # nothing drafted yet: the page cannot tell on from off (module docstring)
    if drafts is None or draft_tokens is None or accepted is None:
        raise ScrapeError(ScrapeErrorReason.MISSING_FAMILY,
                          f"{PER_POSITION} without the drafts, draft tokens and accepted totals")
    problem = exposition.nested_counts_problem(drafts, draft_tokens, accepted, per_position,
                                               rel_tol=PRINTED_PRECISION)
    if problem:
        raise ScrapeError(ScrapeErrorReason.INVALID_VALUE, f"llama.cpp spec_decode: {problem}")
    return SpecDecodeCounters(
        drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted, accepted_per_position=per_position
    )
