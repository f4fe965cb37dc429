"""One PNG per scenario: load (arrivals, running batch), the k each policy ran, and goodput over time.

matplotlib is an optional dependency (`pip install -e '.[plot]'`); it is imported only when drawing.
"""

from __future__ import annotations

from pathlib import Path

from service.bench.suite import POLICIES, ScenarioResult

SMOOTH_TICKS = 12  # goodput is drawn as a moving average over this many ticks (a minute at the 5 s default)


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def _moving_average(values: list[float], width: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= width:
            total -= values[i - width]
        out.append(total / min(i + 1, width))
    return out


def plot_scenario(result: ScenarioResult, path: Path) -> None:
    """Draw one scenario's runs into `path` (PNG). Raises PlotUnavailableError without matplotlib, OSError when
    the file cannot be written."""
    try:
        import matplotlib  # noqa: PLC0415  (optional dependency, imported only to draw)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise PlotUnavailableError("plots need matplotlib: pip install -e '.[plot]' (or pass --no-plots)") from exc
    fig, (load_ax, k_ax, gp_ax) = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    try:
        first = result.outcomes[POLICIES[0]].run.ticks
        minutes = [t.t_s / 60 for t in first]
        load_ax.plot(minutes, [t.arrival_rate_per_s for t in first], label="arrivals (req/s)", color="black")
        load_twin = load_ax.twinx()
        load_twin.plot(minutes, [t.running for t in first], label=f"running batch ({POLICIES[0]})", color="tab:gray",
                       alpha=0.6)
        load_ax.set_ylabel("requests/s")
        load_twin.set_ylabel("running requests")
        load_ax.set_title(f"{result.name}: load")
        load_ax.legend(loc="upper left")
        load_twin.legend(loc="upper right")
        for offset, policy in enumerate(POLICIES):
            outcome = result.outcomes[policy]
            ticks = outcome.run.ticks
            xs = [t.t_s / 60 for t in ticks]
            label = f"{policy} {outcome.setting}".strip()
            # A small vertical offset per policy keeps overlapping constant lines apart.
            k_ax.step(xs, [t.k + 0.04 * offset for t in ticks], where="post", label=label)
            interval = ticks[1].t_s - ticks[0].t_s if len(ticks) > 1 else 1.0
            rate = [t.completed_tokens / interval for t in ticks]
            gp_ax.plot(xs, _moving_average(rate, SMOOTH_TICKS), label=label)
        k_ax.set_ylabel("gamma (0 = off)")
        k_ax.set_title("gamma each policy ran")
        k_ax.legend(loc="upper right", fontsize="small")
        gp_ax.set_ylabel("completed tokens/s")
        gp_ax.set_xlabel("simulated minutes")
        gp_ax.set_title(f"goodput (moving average over {SMOOTH_TICKS} ticks)")
        gp_ax.legend(loc="upper right", fontsize="small")
        fig.tight_layout()
        fig.savefig(path, dpi=90)
    finally:
        plt.close(fig)
