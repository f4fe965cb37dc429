"""The decision in one sentence for an operator: what to run and the one cause that matters, from `Decision.why`.

The sentence is at most `MAX_SUMMARY_CHARS` characters, in the words an SRE uses ("speculation on, k=3", "expected
1.42x", "a restart would not pay back"); the numbers behind it are in `Decision.why` and the arithmetic in
`Decision.reason`. One cause is chosen, in this order: the data cannot be trusted (the state), a change published
now, a probe, a change waiting its turn, what keeps the current setting. Gains are shares of the service over what
runs; speedups are over plain decoding, in the decision's objective.

A decision that is not ok says what it keeps and why ("Keeping the last advice, speculation on, k=3, from 12 s ago:
no fresh scrape ..."), or that there is no advice yet, without naming a deployment it may never have read.

Example: on at k=3 with S(3) = 1.42 [1.31..1.55] at batch 6, no alternative clearing the margin -> "Keep
speculation on, k=3: expected 1.42x (1.31-1.55x) at batch 6; no other setting does clearly better." 40 s into a
120 s wait to go to k=2 for +4% -> "Running speculation on, k=3; speculation on, k=2 is expected to gain +4%, due in
80 s if that holds."
"""

from __future__ import annotations

import math

from policies.types import DataState, Decision, Why, WhyCode

MAX_SUMMARY_CHARS = 120

_STATE_WHY = {
    DataState.INSUFFICIENT_DATA: "too few drafts measured in the window yet",
    DataState.STALE: "no fresh scrape (the last one failed, or the data is old)",
    DataState.ERROR: "the server cannot be read or priced",
}


def summarize(decision: Decision) -> str:
    """The sentence (module docstring) for `decision`, cut to MAX_SUMMARY_CHARS."""
    text = _sentence(decision)
    return text if len(text) <= MAX_SUMMARY_CHARS else text[: MAX_SUMMARY_CHARS - 3].rstrip(" ,;:") + "..."


def _sentence(decision: Decision) -> str:
    setting = _setting(decision.num_speculative_tokens if decision.enabled else 0)
    if decision.state is not DataState.OK:
        cause = _STATE_WHY.get(decision.state, decision.state.value)
        if decision.changed_at_s is None:
            return f"No advice yet: {cause}."
        age = _number(decision.named(WhyCode(decision.state.value)), "age_s")
        return f"Keeping the last advice, {setting}, from {_seconds(age)} ago: {cause}."
    return _changed(decision, setting) or _pending(decision, setting) or _staying(decision, setting)


def _changed(decision: Decision, setting: str) -> str:
    changed = decision.named(WhyCode.CHANGED)
    if changed is None:
        return ""
    if decision.named(WhyCode.PROBE) is not None:
        return f"Turn {setting} to measure the acceptance again: nothing is measured while it is off."
    gain = decision.named(WhyCode.GAIN)
    before = _setting(int(changed.number("from_gamma", 0.0)))
    if decision.named(WhyCode.KEPT_MEASURING) is not None:
        return f"Change to {setting} (from {before}) rather than off: as fast, and the acceptance stays measured."
    if decision.named(WhyCode.TRIAL) is not None:
        return f"Change to {setting} (from {before}): worth most to try; {_expected(decision)}."
    if gain is None or not math.isfinite(gain.number("gain")):
        return f"Change to {setting} (from {before}): {_expected(decision)}."
    return f"Change to {setting} (from {before}): gains {gain.number('gain'):+.0%}; {_expected(decision)}."


def _pending(decision: Decision, setting: str) -> str:
    held = decision.named(WhyCode.PROBE_HELD)
    if held is not None:
        return f"Running {setting} to measure the acceptance again; waiting for the engine to apply it."
    waiting = decision.named(WhyCode.WAITING)
    if waiting is None:
        return ""
    target = _setting(int(waiting.number("to_gamma", 0.0)))
    left = waiting.number("left_s")
    gain = decision.named(WhyCode.GAIN)
    if decision.named(WhyCode.PROBE) is not None:
        return f"Running {setting}; {target} to measure the acceptance again in {_seconds(left)}."
    if decision.named(WhyCode.KEPT_MEASURING) is not None:
        kept = "as fast, and the acceptance stays measured"
        return f"Running {setting}; {target} instead of off in {_seconds(left)}: {kept}."
    if gain is None or not math.isfinite(gain.number("gain")):
        return f"Running {setting}; changing to {target} in {_seconds(left)} if that holds."
    due = f"due in {_seconds(left)} if that holds"
    trial = decision.named(WhyCode.TRIAL)
    claim = f"is expected to gain {gain.number('gain'):+.0%}"
    if trial is not None:
        claim = f"is worth most to try (expected {trial.number('expected'):+.0%})"
    return f"Running {setting}; {target} {claim}, {due}."


def _staying(decision: Decision, setting: str) -> str:
    text = f"Keep {setting}: {_expected(decision)}"
    cost, margin = decision.named(WhyCode.COST), decision.named(WhyCode.BELOW_MARGIN)
    if cost is not None:
        other = _setting(int(cost.number("to_gamma", 0.0)))
        return f"{text}; {other} would not pay back the restart."
    if margin is not None and decision.enabled:
        return f"{text}; no other setting does clearly better."
    best = decision.named(WhyCode.BEST)
    if not decision.enabled and best is not None:
        gamma, speedup, batch = best.number("gamma"), best.number("speedup"), best.number("batch")
        return f"Keep {setting}: the best, k={gamma:.0f}, is {speedup:.2f}x at batch {batch:.0f}."
    return text + "."


def _expected(decision: Decision) -> str:
    best = decision.named(WhyCode.BEST)
    batch = f" at batch {best.number('batch'):.0f}" if best is not None else ""
    if not decision.enabled:
        return f"plain decoding{batch}"
    low, high = decision.expected_speedup_low, decision.expected_speedup_high
    return f"expected {decision.expected_speedup:.2f}x ({low:.2f}-{high:.2f}x){batch}"


def _setting(gamma: int) -> str:
    return f"speculation on, k={gamma}" if gamma > 0 else "speculation off"


def _number(why: Why | None, name: str) -> float:
    return why.number(name, 0.0) if why is not None else 0.0


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if math.isfinite(value) else "?"
