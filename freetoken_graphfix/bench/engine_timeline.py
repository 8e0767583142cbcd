"""``bench --engine``'s kernel timeline lines, from the traced processes (Kineto/CUPTI): kernels and
GPU busy time per decode step, streams, and the median gap between kernels per stream."""

from __future__ import annotations

from typing import Any


def rng(triple: list[float] | None, fmt: str) -> str:
    if not triple:
        return "-"
    med, lo, hi = triple
    return format(med, fmt) + ("" if lo == hi else f" [{format(lo, fmt)}-{format(hi, fmt)}]")


def timeline_lines(summary: dict[str, Any]) -> list[str]:
    """Per arm and bs, from its traced processes (median [range] over them): kernels per decode step
    (the graph's), GPU busy µs per step, streams, and the median gap per stream of the graph."""
    lines = ["kernel timeline (traced runs, Kineto/CUPTI; median [range] over an arm's traced processes): per "
             "decode step, kernels (the graph's) and GPU busy µs (union of kernel intervals); median gap µs between "
             "consecutive kernels on each stream of the graph (s1: most kernels)"]
    for arm, s in summary["arms"].items():
        t = s["timeline"]
        sizes = [bs for bs in t if bs.isdigit()]
        if not sizes:
            lines.append(f"{arm:14} {t.get('note') or 'not traced'}")
        for bs in sizes:
            f = t[bs]
            gaps = " ".join(f"{name} {rng(g, '.3f')}" for name, g in f["gap_us"].items())
            lines.append(f"{arm:14} bs {bs}: {t['processes']} process(es), kernels {rng(f['step_kernels'], '.0f')} "
                         f"({rng(f['graph_kernels'], '.0f')}), busy {rng(f['busy_us'], '.1f')} µs, "
                         f"{rng(f['streams'], '.0f')} streams, gap {gaps}")
    return lines
