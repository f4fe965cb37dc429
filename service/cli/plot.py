"""`spec-advisor whatif --plot FILE`: speedup vs batch for each gamma, the crossover marked, saved as a PNG.

matplotlib is an optional extra (`pip install 'spec-advisor[plot]'`): it is imported only when a plot is asked
for, and its absence is a clear error, not a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from service.http.whatif import CrossoverOut, PointOut, WhatIfResponse

INSTALL_HINT = "pip install 'spec-advisor[plot]' (or: pip install matplotlib)"
_MAX_COLUMNS = 2


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed; the message says how to install it."""


def plot_whatif(response: WhatIfResponse, path: Path) -> None:
    """Draw one panel per context length: speedup vs batch (log x when the batches span > 16x) for every
    gamma >= 1, the no-speculation line at 1, and each gamma's crossover batch (where its speedup falls to 1)
    marked on that line; batches whose KV cannot fit are greyed. Writes a PNG to `path`. Raises
    PlotUnavailableError without matplotlib, OSError when the file cannot be written."""
    try:
        import matplotlib as mpl  # noqa: PLC0415  (optional extra: imported only when a plot is asked for)

        mpl.use("Agg")  # files only: never open a window, work without a display
        from matplotlib import pyplot as plt  # noqa: PLC0415
        from matplotlib.ticker import FuncFormatter  # noqa: PLC0415
    except ImportError:
        raise PlotUnavailableError(f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}") from None

    contexts = sorted({p.context_tokens for p in response.points})
    gammas = sorted({p.gamma for p in response.points if p.gamma > 0})
    columns = min(_MAX_COLUMNS, len(contexts))
    rows = math.ceil(len(contexts) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6.4 * columns, 4.2 * rows), squeeze=False)
    colours = plt.get_cmap("viridis")
    profiles = response.profiles
    figure.suptitle(
        f"Predicted speedup vs batch: {profiles.model} on {profiles.hardware} (TP {profiles.tensor_parallel}), "
        f"{profiles.drafter_method.value} drafter"
    )
    for index, context in enumerate(contexts):
        axis = axes[index // columns][index % columns]
        points = [p for p in response.points if p.context_tokens == context]
        crossovers = {c.gamma: c for c in response.crossovers if c.context_tokens == context}
        _panel(axis, points, gammas, crossovers, colours=colours, context=context)
        # Plain batch numbers (1, 4, 16, ...) read better than powers of two on the log axis.
        axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:g}"))
    for index in range(len(contexts), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    figure.tight_layout()
    figure.savefig(path, format="png", dpi=120)
    plt.close(figure)


def _panel(
    axis: Any,
    points: Sequence[PointOut],
    gammas: Sequence[int],
    crossovers: dict[int, CrossoverOut],
    *,
    colours: Any,
    context: float,
) -> None:
    batches = sorted({p.batch for p in points})
    lowest, highest = batches[0], batches[-1]
    axis.axhline(1.0, color="black", linewidth=1.0, linestyle="--", label="no speculation (1.0)")
    for rank, gamma in enumerate(gammas):
        series = sorted((p for p in points if p.gamma == gamma), key=lambda p: p.batch)
        colour = colours(rank / max(len(gammas) - 1, 1) * 0.9)
        extrapolated = any(p.extrapolated for p in series)
        label = f"γ={gamma}" + (" (extrapolated acceptance)" if extrapolated else "")
        crossing = crossovers.get(gamma)
        if crossing is not None:
            label += f", crossover {_crossing_text(crossing)}"
        axis.plot(
            [p.batch for p in series], [p.speedup for p in series], marker="o", markersize=3, color=colour,
            linestyle=":" if extrapolated else "-", label=label,
        )
        if crossing is not None and crossing.batch is not None and lowest <= crossing.batch <= highest:
            axis.plot([crossing.batch], [1.0], marker="X", markersize=10, color=colour, markeredgecolor="black")
            axis.annotate(
                f"B≈{crossing.batch:.0f}", (crossing.batch, 1.0), textcoords="offset points", xytext=(4, -14),
                fontsize=8, color=colour,
            )
    # Batches the memory cannot hold with the least drafting asked (off when gamma 0 was asked; weights + KV at
    # this context, policies/model/kv_capacity.py).
    least = min(p.gamma for p in points)
    room = [p.max_batch_in_memory for p in points if p.gamma == least and p.max_batch_in_memory is not None]
    if room and min(room) < highest:
        limit = max(min(room), lowest)
        label = f"KV does not fit beyond B≈{min(room):.0f}" + ("" if least == 0 else f" (γ={least})")
        axis.axvspan(limit, highest, color="grey", alpha=0.15, label=label)
    if highest / lowest > 16:
        axis.set_xscale("log", base=2)
    # Keep the no-speculation line inside the panel with some room, whichever side the curves are on.
    speedups = [1.0, *(p.speedup for p in points if p.gamma > 0)]
    axis.set_ylim(min(speedups) - 0.1, max(speedups) + 0.1)
    axis.set_xlabel("batch (running sequences)")
    axis.set_ylabel("speedup vs no speculation (tokens/s per sequence)")
    axis.set_title(f"context {context:g} tokens per sequence")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7, loc="best")


def _crossing_text(crossing: CrossoverOut) -> str:
    if not crossing.helps_between:
        return "none (never helps)"
    if not crossing.helps_at_batch_1:
        spans = ", ".join(f"B≈{lo:.0f}.." + ("" if hi is None else f"{hi:.0f}") for lo, hi in crossing.helps_between)
        return f"helps at {spans}"
    if crossing.batch is None:
        return f"beyond B={crossing.searched_up_to_batch:.0f}"
    return f"B≈{crossing.batch:.0f}"
