"""The decode loop of ``bench engine``'s engine process, timed: ``GraphRunner.replay`` and
``Engine.forward_batch`` replaced on the engine's own instances (the scheduler calls
``self.engine.forward_batch``; the runner's class attribute ``replay`` is looked up per call, so the
shim's deferred hooks still see it).

Each graph size's first launch is the arm's own, untouched, with the free GPU memory around it. After
it, each graph step launches the executable the cycle names (``LoopSchedule``): the engine's own
graph or one of its copies, in the engine's own slot (``StandIn``), the control's followed by its
spin. CUDA events time the step, the graph step and the launch; the ``LaunchWatchdog`` releases a
launch blocked behind its WAIT, and the surplus release that leaves is dropped.
"""

from __future__ import annotations

import time
from typing import Any

from child_copies import Driver, LoopSchedule, StandIn
from child_seams import LaunchWatchdog


def event():
    """A timing CUDA event (torch imported on use: the child is run by path before torch is needed)."""
    import torch

    return torch.cuda.Event(enable_timing=True)


class DecodeLoop:
    """What each step of the decode loop did: ``steps`` (kind, bs, whether the size's first graph
    step, host ms, the executable launched and its events), ``launches`` (bs, host ms of the replay
    call), ``fires`` (the watchdog's releases) and ``first_launch_free`` (free bytes before and after
    each size's first launch)."""

    def __init__(self, eng: Any, runner: Any, runner_cls: type, schedule: LoopSchedule, driver: Driver,
                 dog: LaunchWatchdog, flag: Any, spin_cycles: int | None) -> None:
        self.eng, self.runner, self.runner_cls, self.schedule = eng, runner, runner_cls, schedule
        self.driver, self.dog, self.flag, self.spin_cycles = driver, dog, flag, spin_cycles
        self.steps: list[dict] = []
        self.launches: list[tuple[int, float]] = []
        self.fires: list[dict] = []
        self.first_launch_free: dict[str, list[int]] = {}
        self.seen_bs: set[int] = set()
        self.pending: dict = {}  # what the replay of the step in progress recorded, for forward_batch
        self.forward = eng.forward_batch

    def install(self) -> None:
        """Put the timed replay and forward in the engine's place: FreeToken looks both up at every call."""
        self.runner.replay, self.eng.forward_batch = self.replay, self.forward_batch

    def launcher(self, own: Any, label: str, handle: int | None, begin: Any, finish: Any):
        """The step's launch: the engine's own graph (``handle`` ``None``) or a copy, between two
        events; a control copy followed by the control's known extra GPU time."""
        import torch

        def launch() -> None:
            begin.record()
            if handle is None:
                own.replay()
            else:
                self.driver.launch(handle, torch.cuda.current_stream().cuda_stream)
                if label.startswith("control"):
                    torch.cuda._sleep(self.spin_cycles)
            finish.record()

        return launch

    def replay(self, batch: Any) -> Any:
        """``GraphRunner.replay`` timed: a size's first launch is the arm's own and untouched; later ones launch the
        cycle's executable in the engine's slot."""
        import torch

        bs = batch.padded_size
        first = str(bs) not in self.first_launch_free
        own = self.runner.graph_map[bs]
        if first:  # the arm's own first launch, untouched
            self.first_launch_free[str(bs)] = [torch.cuda.mem_get_info()[0]]
        else:
            label, handle = self.schedule.next(bs)
            begin, finish = event(), event()
            self.runner.graph_map[bs] = StandIn(self.launcher(own, label, handle, begin, finish))
            self.pending.update(exec=label, launch=(begin, finish))
        start, end = event(), event()
        start.record(self.eng.stream)
        t = self.dog.started = time.perf_counter()
        try:
            return self.runner_cls.replay(self.runner, batch)
        finally:
            self.dog.started = None
            self.runner.graph_map[bs] = own
            self.launches.append((bs, 1e3 * (time.perf_counter() - t)))
            end.record(self.eng.stream)
            if first:
                self.first_launch_free[str(bs)].append(torch.cuda.mem_get_info()[0])
            else:
                self.pending["graph"] = (start, end)

    def forward_batch(self, batch: Any, args: Any) -> Any:
        """``forward_batch`` between two events on the engine's stream, host-timed too: the decode step as #775 counts
        it."""
        on_graph = self.runner.can_use_cuda_graph(batch)
        bs = batch.padded_size if on_graph else batch.size
        fired_before = self.dog.fired
        start, end = event(), event()
        self.pending.clear()
        start.record(self.eng.stream)
        t = time.perf_counter()
        out = self.forward(batch, args)
        host_ms = 1e3 * (time.perf_counter() - t)
        end.record(self.eng.stream)
        if self.dog.fired > fired_before:
            # the watchdog and then the fill each released this step's WAIT: drop the surplus, or
            # every later WAIT would pass before its own fill (stale rows)
            self.eng.stream.synchronize()
            self.fires.append({"step": len(self.steps), "bs": bs, "flag_after": int(self.flag[0])})
            self.flag.zero_()
        kind = "graph" if on_graph else ("decode" if batch.is_decode else "prefill")
        self.steps.append({"kind": kind, "bs": bs, "first": on_graph and bs not in self.seen_bs,
                           "events": (start, end), "host_ms": host_ms, **self.pending})
        if on_graph:
            self.seen_bs.add(bs)
        return out

    def figures(self) -> dict[str, Any]:
        """The loop's part of the result, its events read (after a device synchronize): per bs, the
        graph steps after each size's first, their GPU ms (step, graph step, launch), host ms and
        executables; the first launches' host ms, GPU ms and free memory."""
        for s in self.steps:
            s["gpu_ms"] = elapsed(s.pop("events"))
        first_launch: dict[str, float] = {}
        for bs, host_ms in self.launches:
            first_launch.setdefault(str(bs), host_ms)
        return {
            "steps": {k: sum(s["kind"] == k for s in self.steps) for k in ("prefill", "decode", "graph")},
            "fires": self.fires, "first_launch_ms": first_launch,
            "max_launch_ms": max((host_ms for _, host_ms in self.launches), default=None),
            "first_launch_free_mib": {bs: [v / 2**20 for v in free] for bs, free in self.first_launch_free.items()},
            "first_step_gpu_ms": {str(s["bs"]): s["gpu_ms"] for s in self.steps if s["first"]},
            **warm_figures(self.steps),
        }


def warm_figures(steps: list[dict[str, Any]]) -> dict[str, dict[str, list]]:
    """Per bs, the graph steps after that size's first: GPU ms (step, graph, launch), host ms and executables."""
    warm: dict[str, list[dict]] = {}
    for s in steps:
        if s["kind"] == "graph" and not s["first"]:
            warm.setdefault(str(s["bs"]), []).append(s)
    return {
        "step_gpu_ms": {bs: [s["gpu_ms"] for s in ss] for bs, ss in warm.items()},
        "step_host_ms": {bs: [round(s["host_ms"], 5) for s in ss] for bs, ss in warm.items()},
        "graph_gpu_ms": {bs: [elapsed(s["graph"]) for s in ss] for bs, ss in warm.items()},
        "launch_gpu_ms": {bs: [elapsed(s["launch"]) for s in ss] for bs, ss in warm.items()},
        "step_exec": {bs: [s["exec"] for s in ss] for bs, ss in warm.items()},
    }


def elapsed(events: tuple[Any, Any]) -> float:
    """GPU ms between a pair of events, rounded so the record does not carry float noise."""
    return round(events[0].elapsed_time(events[1]), 5)
