"""The results table: scenario x policy, then the headline ratios (advisor / oracle, advisor / best static)."""

from __future__ import annotations

from collections.abc import Sequence

from service.bench.suite import ADVISOR, ORACLE, POLICIES, STATIC_POLICIES, TIE_RATIO, ScenarioResult

# The targets (docs/bench.md): advisor >= 0.97 x oracle, never below the best static policy in hindsight
# (within the tie margin: same-seed runs that close are noise), right within 2 decision windows after a crossing,
# no flapping, no change driven by noise in steady load.
TARGET_VS_ORACLE = 0.97
TARGET_LAG_WINDOWS = 2.0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def advisor_ratios(result: ScenarioResult) -> tuple[float | None, float | None]:
    """(advisor / oracle, advisor / best static policy) on the scenario's headline figure; None when undefined."""
    if result.error is not None:
        return None, None
    advisor = result.headline(ADVISOR)
    oracle = result.headline(ORACLE)
    best_static = max(result.headline(p) for p in STATIC_POLICIES)
    return (advisor / oracle if oracle > 0 else None), (advisor / best_static if best_static > 0 else None)


def target_failures(result: ScenarioResult) -> list[str]:
    """The targets the advisor misses on this scenario (empty = all met), each as a short tag."""
    if result.error is not None:
        return ["failed"]
    vs_oracle, vs_static = advisor_ratios(result)
    misses = []
    if vs_oracle is not None and vs_oracle < TARGET_VS_ORACLE:
        misses.append("oracle")
    if vs_static is not None and vs_static < 1.0 - TIE_RATIO:
        misses.append("static")
    q = result.quality
    if q is not None:
        lag = q.worst_lag_windows
        if lag is not None and lag > TARGET_LAG_WINDOWS:
            misses.append("lag")
        if q.flaps:
            misses.append("flap")
        if q.steady_changes:
            misses.append("noise")
    return misses


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_quality(results: Sequence[ScenarioResult]) -> str:
    """The advisor's per-scenario checks: ratios, crossover lag, flapping, steady-load changes, targets met."""
    header = (f"{'scenario':<22} {'/oracle':>7} {'/static':>7} {'cross':>5} {'lag win':>7} {'missed':>6} "
              f"{'flaps':>5} {'noise':>5} {'acted':>5} {'oracle':>6}  targets")
    lines = [header, "-" * len(header)]
    for r in results:
        if r.error is not None or r.quality is None:
            lines.append(f"{r.name:<22} {'-':>7} {'-':>7}  ({r.error or 'no checks'})")
            continue
        vs_oracle, vs_static = advisor_ratios(r)
        q = r.quality
        lag = q.worst_lag_windows
        lag_text = "-" if lag is None else "never" if lag == float("inf") else f"{lag:.1f}"
        missed = sum(1 for c in q.crossings if c.lag_s is None)
        misses = target_failures(r)
        lines.append(
            f"{r.name:<22} {_ratio(vs_oracle):>7} {_ratio(vs_static):>7} {len(q.crossings):>5} {lag_text:>7} "
            f"{missed:>6} {q.flaps:>5} {q.steady_changes:>5} {r.outcomes[ADVISOR].run.config_changes:>5} "
            f"{r.outcomes[ORACLE].run.config_changes:>6}  {'ok' if not misses else 'MISS ' + ','.join(misses)}"
        )
    lines.append("")
    lines.append("/oracle, /static: advisor headline over the oracle's / the best static policy's (target >= 0.97 / "
                 f">= {1 - TIE_RATIO:.3f}); cross: oracle choice")
    lines.append("changes; lag win: worst advisor lag to agree after a crossing, or longest spell at a worse choice "
                 "than the oracle's, in decision windows (estimator window; target <= 2); missed: crossings never")
    lines.append("matched; flaps: changes < dwell_s after the previous one; noise: changes in steady load that made "
                 "nothing truly better")
    lines.append("(not onto the oracle's gamma, no true utility or ITL gain); acted / oracle: config changes of the "
                 "advisor / the oracle (both start at the deployed k).")
    return "\n".join(lines)


def format_table(results: Sequence[ScenarioResult]) -> str:
    header = (f"{'scenario':<22} {'policy':<17} {'setting':<10} {'goodput':>9} {'SLO-gp':>9} {'ITL ms':>7} "
              f"{'p99 ms':>7} {'changes':>7} {'lost':>6} {'/oracle':>7}")
    lines = [header, "-" * len(header)]
    for r in results:
        if r.error is not None:
            lines.append(f"{r.name:<22} FAILED: {r.error}")
            continue
        oracle = r.headline(ORACLE)
        for policy in POLICIES:
            o = r.outcomes[policy]
            m = o.run.metrics
            slo = "-" if m.slo_goodput_tokens_per_s is None else f"{m.slo_goodput_tokens_per_s:.0f}"
            ratio = f"{r.headline(policy) / oracle:.3f}" if oracle > 0 else "-"
            lines.append(
                f"{r.name:<22} {policy:<17} {o.setting:<10} {m.goodput_tokens_per_s:>9.0f} {slo:>9} "
                f"{_ms(m.mean_itl_s):>7} {_ms(m.p99_itl_s):>7} {o.run.config_changes:>7} {o.run.lost_requests:>6} "
                f"{ratio:>7}"
            )
    lines.append("")
    lines.append("goodput: output tokens/s of completed requests; SLO-gp: of requests meeting the scenario's ITL SLO;")
    lines.append("/oracle: the headline figure (SLO-gp when the scenario sets an SLO, else goodput) over the oracle's.")
    lines.append("")
    worst: tuple[float, str] | None = None
    for r in results:
        vs_oracle, vs_static = advisor_ratios(r)
        if vs_oracle is None or vs_static is None:
            lines.append(f"{r.name}: no ratio ({r.error or 'oracle or static headline is 0'})")
            continue
        lines.append(f"{r.name}: advisor/oracle {vs_oracle:.3f}, advisor/best static {vs_static:.3f} "
                     f"(wall {r.wall_s:.1f} s, {r.duration_s:.0f} simulated s)")
        if worst is None or vs_oracle < worst[0]:
            worst = (vs_oracle, r.name)
    if worst is not None:
        lines.append(f"worst advisor/oracle: {worst[0]:.3f} ({worst[1]})")
    failed = [r.name for r in results if r.error is not None]
    if failed:
        lines.append(f"failed scenarios: {', '.join(failed)}")
    lines.append("")
    lines.append(format_quality(results))
    return "\n".join(lines)
