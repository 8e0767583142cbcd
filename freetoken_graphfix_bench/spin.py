"""The positive controls' known extra GPU time: a spin kernel (``torch.cuda._sleep``, which counts GPU
clocks) calibrated to a target length on this GPU now, and its own measured length.

Imports torch alone: the engine child (``engine/child/``), which must import nothing of this package,
loads this file by path.
"""

from __future__ import annotations

from typing import Any

PROBE_CYCLES = 100_000


def spin_us(cycles: int, stream: Any, spins: int = 50) -> float:
    """GPU µs of one spin of ``cycles`` clocks: ``spins`` of them back to back behind a long one, so the
    GPU never waits on the host between them."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(20 * cycles)  # a queue ahead: the timed spins start back to back
        start.record(stream)
        for _ in range(spins):
            torch.cuda._sleep(cycles)
        end.record(stream)
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / spins


def calibrate(target_us: float, stream: Any) -> dict[str, Any]:
    """The spin that takes about ``target_us`` here: its clocks, its measured µs (the median of five
    measurements) and their range."""
    cycles = max(1, round(target_us * PROBE_CYCLES / spin_us(PROBE_CYCLES, stream)))
    measured = sorted(spin_us(cycles, stream) for _ in range(5))
    return {"spin_cycles": cycles, "spin_us": measured[2], "spin_us_range": [measured[0], measured[-1]],
            "target_us": target_us}
