"""``bench launch``: what a tracer does to ``cuGraphLaunch`` on the host.

The host releases a wait-sync graph's PLE WAIT only after ``cuGraphLaunch`` returns, so every launch
of such a graph stalls on the GPU for as long as the launch takes on the host. A tracer that makes the
launch slower (Nsight Systems' node-level graph tracing, CUPTI's) lengthens that stall, and a step
timed from its trace with it. This measures the launch alone: plain in this process, and with a
Kineto (CUPTI) trace active, as ``bench engine``'s traced runs have it; run under ``nsys profile``,
the plain figure is Nsight Systems'.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .stats import Summary, summary


@dataclass(frozen=True)
class LaunchTimes:
    """Host µs per ``cuGraphLaunch`` of one graph of ``kernels`` kernels, without and with CUPTI."""

    kernels: int
    plain_us: Summary
    cupti_us: Summary


def measure(kernels: int, launches: int) -> LaunchTimes:
    """Time ``launches`` launches of a graph of ``kernels`` small kernels untraced, then, once CUPTI is
    on, of a second such graph under a Kineto trace; each graph launched once first (its implicit
    upload), the GPU idle before each timed launch. Untraced first: CUPTI, once on, stays in the
    process and slows every later launch."""
    import torch
    from torch.profiler import ProfilerActivity, _utils, profile

    def captured() -> torch.cuda.CUDAGraph:
        stream, scratch, graph = torch.cuda.Stream(), torch.zeros(64, device="cuda"), torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(kernels):
                scratch.add_(1)
        graph.replay()
        torch.cuda.synchronize()
        return graph

    def timed(graph: torch.cuda.CUDAGraph) -> list[float]:
        out = []
        for _ in range(launches):
            start = time.perf_counter()
            graph.replay()
            out.append(1e6 * (time.perf_counter() - start))
            torch.cuda.synchronize()
        return out

    plain = timed(captured())
    _utils._init_for_cuda_graphs()  # as bench engine's traced child: graphs captured before go untraced
    traced = captured()
    with profile(activities=[ProfilerActivity.CUDA]):
        cupti = timed(traced)
    return LaunchTimes(kernels, summary(plain), summary(cupti))


def render(times: LaunchTimes) -> str:
    """The two figures, and which tracer each one carries."""

    def fig(s: Summary) -> str:
        return f"{s.median:.1f} µs [p10 {s.low:.1f}, p90 {s.high:.1f}]"

    return "\n".join([
        f"host time of one cuGraphLaunch, a {times.kernels}-kernel graph, {times.plain_us.n} launches each:",
        f"  this process untraced: {fig(times.plain_us)} (under nsys profile: Nsight Systems' tracing)",
        f"  under CUPTI (torch.profiler, as bench engine's traced runs): {fig(times.cupti_us)}",
        "A wait-sync graph's PLE WAIT stalls on the GPU for as long as its launch takes here.",
    ])
