"""The results table: scenario x policy, then the headline ratios (advisor / oracle, advisor / best static)."""

from __future__ import annotations

from collections.abc import Sequence

from service.bench.suite import ADVISOR, ORACLE, POLICIES, STATIC_POLICIES, ScenarioResult


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
    return "\n".join(lines)
