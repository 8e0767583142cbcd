"""``bench engine --plot``: the figure #775 argues from, the inter-kernel gap distribution per stream
of each arm's decode graph (from the traced processes), and each timed process's decode steps over
the run, GPU and host ms, where host modes show as levels a process keeps (or switches between)."""

from __future__ import annotations

from typing import Any

from ..records import EngineCase, largest_first
from .figures import EngineFigures, Timeline


def plot(case: EngineCase, figures: EngineFigures, path: str) -> str:
    """One PNG for one case (one figure, one model); a line saying what was written."""
    import matplotlib  # present: bench refuses --plot up front without it (cli.plot_missing)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {arm: f"C{i}" for i, arm in enumerate(figures.arms)}
    gaps = {arm: largest_bs_quantiles(s.timeline) for arm, s in figures.arms.items()}
    streams = sorted({st for q in gaps.values() for st in q}, key=lambda st: int(st[1:]))[:4] or ["s1"]
    fig = plt.figure(figsize=(12, 9))
    grid = fig.add_gridspec(3, len(streams))
    for col, stream in enumerate(streams):
        gap_panel(fig.add_subplot(grid[0, col]), stream, gaps, colours, legend=col == 0)
    for row, key, label in ((1, "step_gpu_ms", "GPU ms per decode step"), (2, "step_host_ms", "host ms per step")):
        steps_panel(fig.add_subplot(grid[row, :]), case, key, label, colours, legend=row == 1)
    env = case.env
    fig.suptitle(f"{case.label}: {env.gpu if env else '?'}, driver {env.driver if env else '?'}, "
                 f"torch {env.torch if env else '?'}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


def gap_panel(ax: Any, stream: str, gaps: dict[str, dict[str, list[float]]], colours: dict[str, str],
              legend: bool) -> None:
    """One stream's gap distribution, an arm a line (or a note that the record has none)."""
    drawn = False
    for arm, per in gaps.items():
        if stream in per:
            q = per[stream]
            ax.plot(q, [i / (len(q) - 1) for i in range(len(q))], color=colours[arm], label=arm)
            drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "no gap distribution\nin this record", ha="center", va="center", transform=ax.transAxes)
    ax.set_xscale("log")
    ax.set_xlabel(f"gap between kernels, µs ({stream})")
    ax.set_ylabel("fraction of gaps")
    if drawn and legend:
        ax.legend(fontsize="small")


def steps_panel(ax: Any, case: EngineCase, key: str, label: str, colours: dict[str, str], legend: bool) -> None:
    """Every timed process's decode steps over its run (``key``: GPU or host ms), an arm a colour."""
    for arm, rs in case.runs.items():
        good = [r for r in rs if r.ok]
        for r in good:
            series = getattr(r, key)
            values = [v for bs in largest_first(series) for v in series[bs]]
            ax.plot(values, color=colours[arm], linewidth=0.6, alpha=0.7, label=arm if r is good[0] else None)
    ax.set_ylabel(label)
    ax.set_xlabel("decode step of the process (bs 2, then bs 1)")
    if legend:
        ax.legend(fontsize="small", ncol=len(case.runs))


def largest_bs_quantiles(timeline: Timeline) -> dict[str, list[float]]:
    """The gap percentiles per stream at the arm's largest traced bs (floored at 1 ns for a log axis)."""
    sizes = sorted(timeline.by_bs, key=int)
    if not sizes:
        return {}
    return {s: [max(v, 1e-3) for v in q] for s, q in timeline.by_bs[sizes[-1]].gap_quantiles.items()}
