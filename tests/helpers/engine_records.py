"""``bench engine`` records on CPU: engine child results shaped as the child prints them (``result``,
``looped``), a case of them judged by the current rules (``judged``), and figures built by hand."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from freetoken_graphfix_bench import record_files, records
from freetoken_graphfix_bench.engine import headline
from freetoken_graphfix_bench.engine.figures import EngineFigures, figures_of
from freetoken_graphfix_bench.engine.loop import LoopFigure
from freetoken_graphfix_bench.engine.report import markdown_case, render
from tests.helpers.engine_child import copies as child


def result(**over) -> dict:
    """An engine child's result line, as the engine child prints it."""
    r = {"freetoken": "0.2.1", "table": "DiskRowTable", "wait_sync": True, "fill_worker": False, "graph_bs": [1, 2],
         "captured_waits": 2, "steps": {"prefill": 2, "decode": 0, "graph": 90}, "fires": [],
         "first_launch_ms": {"2": 0.4, "1": 0.3}, "capture_ms": [900.0], "upload_ms": [1.0, 0.9],
         "step_gpu_ms": {"2": [3.3, 3.31, 3.29], "1": [3.0, 3.0]}, "replay_gpu_ms": {"2": [1.5, 1.5], "1": [1.2]},
         "token_hash": "aaaa", "distinct_tokens": 40, "shim": None, "free_mib_after_capture": 9000.0,
         "first_launch_free_mib": {"2": [9000.0, 8990.0], "1": [8990.0, 8990.0]}}
    r.update(over)
    return r


def shim(mode: str, action: str, graphs: int = 2) -> dict:
    """The shim's status in an engine process, as ``status()`` gives it: one capture pass of ``graphs``
    graphs, each given ``action``."""
    from dataclasses import asdict

    from freetoken_graphfix.status_record import CapturePass, GraphRecord, Status

    decided = [GraphRecord(i, f"bs={graphs - i}", [], action, "test", 0.1) for i in range(graphs)]
    return asdict(Status(True, mode, True, "ok", passes=[CapturePass(0, "GraphRunner._capture_graphs", decided, True)],
                         pid=100))


NOOP = shim("auto", "no-op")


def looped(seed=0, *, step=1.02, host=0.22, upload=1.0, own=1.0, copies=4, steps=199, drift=0.0, switch=None,
           noise=0.002, placement=0.0, idle=1.0, idle_own=1.0, tokens=None, spin_ms=None, spin_read=1.0, **over):
    """One timed process at bs 2 and 1: ``steps`` graph steps after each first launch, launching the
    executables in the child's schedule. Uploaded copies take ``upload`` times as long, the engine's
    own graph ``own`` times; the process drifts by ``drift`` a step and its steps jump by 20% from
    step ``switch`` on (a switch of host level); each executable sits ``placement`` (relative SD) off.
    From idle, every executable replays at ``idle`` x the step and the own graph ``idle_own`` x that.
    With ``spin_ms``, the positive control's launches take that much longer (times ``spin_read``: a run
    that misreads it), and the record notes the spin's own length."""
    rng = random.Random(seed)
    labels = child.copy_labels(copies, control=spin_ms is not None)
    out = {k: {} for k in ("step_exec", "step_gpu_ms", "launch_gpu_ms", "graph_gpu_ms", "step_host_ms")}
    for bs in ("2", "1"):
        offset = {label: math.exp(rng.gauss(0, placement)) for label in labels}
        execs = [child.loop_schedule(labels, k) for k in range(steps)]
        times = []
        for k, label in enumerate(execs):
            factor = upload if label.startswith("uploaded") else own if label == "own" else 1.0
            jump = 1.2 if switch is not None and k >= switch else 1.0
            spin = spin_ms * spin_read if label.startswith("control") else 0.0
            times.append((step * (1 + drift * k) * jump * factor + spin) * offset[label] * (1 + rng.gauss(0, noise)))
        out["step_exec"][bs] = execs
        out["step_gpu_ms"][bs] = times
        out["launch_gpu_ms"][bs] = [0.98 * t for t in times]
        out["graph_gpu_ms"][bs] = [0.99 * t for t in times]
        out["step_host_ms"][bs] = [host * (1 + rng.gauss(0, 0.03)) for _ in times]
    base = 0.95 * step * idle
    out["replay_gpu_ms"] = {bs: [base * idle_own] * 10 for bs in ("2", "1")}
    out["copies_gpu_ms"] = {bs: {"uploaded": [[base * upload] * 10] * copies, "never": [[base] * 10] * copies}
                            for bs in ("2", "1")}
    if tokens is not None:
        out["token_ids"] = tokens
    if spin_ms is not None:
        out["control_spin"] = {"spin_cycles": 1, "spin_us": 1e3 * spin_ms, "bs": 2}
    return result(**{"wait_sync": False, "captured_waits": 0, "table": "ZeroTable", **out, **over})


@dataclass
class Judged:
    """One case and its figures, as ``bench engine`` (or ``bench report``) judges it."""

    case: records.EngineCase
    figures: EngineFigures

    def text(self) -> str:
        return render(self.case, self.figures)

    def markdown(self, verbose: bool = False) -> str:
        return "\n".join(markdown_case(self.case, self.figures, verbose))

    def failures(self) -> list[str]:
        return headline.failures(self.figures)


def case_data(expects_wait=False, traced=None, label="llama", **arms) -> dict:
    """A case as the record holds it, from child results (one per arm, or a list: its rounds)."""
    runs = {arm: [{"arm": arm, **x} for x in (r if isinstance(r, list) else [r])] for arm, r in arms.items()}
    return {"model": "a model", "label": label, "layers": None, "ft_args": [], "context": 4096, "decode_steps": 200,
            "rounds": len(next(iter(runs.values()))) if runs else 0, "expects_wait": expects_wait, "runs": runs,
            "traced": traced or {}, "env": {"gpu": "GPU", "driver": "1", "torch": "2", "date": "today"},
            "command": "freetoken-graphfix bench engine ..."}


def judged(expects_wait=False, traced=None, label="llama", **arms) -> Judged:
    case = record_files.build(records.EngineCase, case_data(expects_wait, traced, label, **arms), "case")
    return Judged(case, figures_of(case))


def process(**over) -> records.EngineProcess:
    """One child result as the record reads it."""
    return record_files.build(records.EngineProcess, {"arm": "upstream", **result(**over)}, "process")


def figure(ratio: float, half: float, *, added: float = math.nan, processes: int = 3) -> LoopFigure:
    """An in-loop figure built by hand: its ratio, its half-width, and for a control what it added."""
    return LoopFigure(ratio, half / 4.3, 8, math.nan, half, processes, [ratio] * processes, 4, 100, added)
