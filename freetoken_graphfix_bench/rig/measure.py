"""``bench rig``'s measurement: several graph instances per mode, captured through the shim, replayed
interleaved round-robin so slow drift of clocks or temperature lands on every mode alike; beside them
the positive control, skip's graphs plus a spin of known GPU time (about #775's 2% of the step)
measured by exactly the same schedule, which shows what cost this run could have seen."""

from __future__ import annotations

import statistics
import time
from typing import Any

from freetoken_graphfix.tools import child

from .. import spin
from ..cupti import gaps_from_child, profile_gaps
from ..records import Environment, FirstLaunches, GraphActions, RigArm, RigRecord, Spin
from ..running import progress, rotated
from ..settings import RigSettings
from ..verdicts import CONTROL_ADDED
from .figures import CONTROL


def build_arms(settings: RigSettings, control: bool = False
               ) -> tuple[Any, dict[tuple[str, int], Any], dict[str, RigArm], Spin | None]:
    """Capture ``settings.instances`` runners per mode through the shim and launch each graph the way
    FreeToken does (first launch, then a check step whose logits every mode must share with ``upload``);
    with ``control`` (and ``skip`` among the modes), the positive control's arm as well, and its
    spin's calibration.

    Several instances per mode because separately captured copies of one graph replay up to ~1%
    apart on the H200 even when treated identically: one instance per mode cannot resolve a 0.3% band.
    """
    import torch

    import freetoken_graphfix

    from .pieces import Rig, install_mode, last_pass

    rig = Rig(kernels=settings.kernels, streams=settings.streams, wait=not settings.no_wait, h2d=settings.h2d)
    bs_list = tuple(sorted(settings.batch_sizes, reverse=True))
    arms: dict[str, RigArm] = {}
    runners: dict[tuple[str, int], Any] = {}
    logits: dict[str, list[dict[int, Any]]] = {}

    def capture(name: str, mode: str) -> None:
        install_mode(mode)
        rec = arms[name] = RigArm([], {}, {str(bs): FirstLaunches([], []) for bs in bs_list},
                                  {str(bs): [[] for _ in range(settings.instances)] for bs in bs_list})
        for i in range(settings.instances):
            t0 = time.perf_counter()
            runner = runners[name, i] = rig.capture(bs_list)
            rec.capture_s.append(time.perf_counter() - t0)
            for g in last_pass().graphs:
                graph = rec.graphs.setdefault(str(g.name), GraphActions([], []))
                graph.action.append(g.action)
                graph.hook_ms.append(g.hook_ms)
            for bs in bs_list:
                first = rig.step(runner, bs, seed=bs, watchdog_s=settings.watchdog)
                rec.first_launch[str(bs)].launch_ms.append(first.launch_ms)
                rec.first_launch[str(bs)].blocked.append(first.fired)
            logits.setdefault(name, []).append(
                {bs: rig.step(runner, bs, seed=1000 + bs, watchdog_s=settings.watchdog).logits for bs in bs_list})

    for mode in settings.modes:
        capture(mode, mode)
    calibration = None
    if control and "skip" in settings.modes:
        skip = [("skip", i) for i in range(settings.instances)]
        step_us = statistics.median(replay_times(rig, runners, skip, bs_list))
        calibrated = spin.calibrate(CONTROL_ADDED * step_us, rig.stream)
        rig.model.spin_cycles = calibrated["spin_cycles"]
        capture(CONTROL, "skip")  # never uploaded, exactly as skip's graphs, plus the spin
        rig.model.spin_cycles = 0
        calibration = Spin(**calibrated, step_us=step_us)
    freetoken_graphfix.uninstall()
    ref = logits.get("upload", next(iter(logits.values())))[0]
    for arm, per_instance in logits.items():
        arms[arm].logits_equal_upload = all(torch.equal(got[bs], ref[bs]) for got in per_instance for bs in bs_list)
    return rig, runners, arms, calibration


def replay_times(rig: Any, runners: dict[tuple[str, int], Any], keys: list[tuple[str, int]],
                 bs_list: tuple[int, ...], reps: int = 10) -> list[float]:
    """GPU µs of ``reps`` rounds of replays of the runners ``keys`` name, round-robin as the timed
    schedule runs them (one graph replayed back to back runs faster), after one untimed round."""
    import torch

    timed = timed_launcher(rig, runners)
    times = []
    with torch.cuda.stream(rig.stream):
        for rep in range(reps + 1):
            for key in keys:
                for bs in bs_list:
                    us = timed(*key, bs)
                    if rep:
                        times.append(us)
    return times


def launcher(rig: Any, runners: dict[tuple[str, int], Any]) -> Any:
    """Replay instance ``i`` of ``arm``'s graph for ``bs``, its head WAIT released just before the launch."""
    from freetoken_graphfix.device import read_flag, signal_flag

    flag = rig.table._flag if rig.table is not None else None

    def launch(arm: str, i: int, bs: int) -> None:
        if flag is not None:
            assert read_flag(flag) == 0, "surplus release"
            signal_flag(flag)  # the WAIT passes at once: time the graph, not the host's fill
        runners[arm, i].graph_map[bs].replay()

    return launch


def timed_launcher(rig: Any, runners: dict[tuple[str, int], Any]) -> Any:
    """``launcher``'s launch, timed: the GPU µs of that one replay, between CUDA events around it."""
    import torch

    launch = launcher(rig, runners)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(arm: str, i: int, bs: int) -> float:
        start.record(rig.stream)
        launch(arm, i, bs)
        end.record(rig.stream)
        end.synchronize()
        return 1e3 * start.elapsed_time(end)

    return timed


def run_arms(settings: RigSettings, command: str = "") -> RigRecord:
    """The replay-cost record: every instance of every mode captured and launched, then interleaved
    timed replays. CUPTI is never initialised in this process (it slows and spreads every replay);
    the gaps come from a child process that captures the same modes under the profiler."""
    import torch

    rig, runners, arms, calibration = build_arms(settings, control=True)
    keys, stream = list(runners), rig.stream
    bs_list = sorted(map(int, next(iter(arms.values())).replay_us), reverse=True)
    launch, timed = launcher(rig, runners), timed_launcher(rig, runners)
    with torch.cuda.stream(stream):
        for arm, i in keys:  # warm-up: every graph a few times
            for bs in bs_list:
                for _ in range(3):
                    launch(arm, i, bs)
                    stream.synchronize()
        for rep in progress(range(settings.reps), settings.reps, "interleaved replays"):
            for arm, i in rotated(keys, rep):
                for bs in bs_list:
                    arms[arm].replay_us[str(bs)][i].append(timed(arm, i, bs))
    gaps, note = gaps_from_child(settings) if settings.profile_reps else ({}, "not traced (--profile-reps 0)")
    for arm in arms:
        arms[arm].gaps_us = gaps.get(arm, {})
    return RigRecord(Environment.here(), settings, arms, command, calibration, note, armed_hook_cost())


def armed_hook_cost(calls: int = 20000) -> float:
    """Extra host µs per dispatch while a graph reading the PLE table awaits its first launch: the
    table's ``host_fill_batch`` goes through the guard's stager (every other graph's replay is
    FreeToken's own, so this is the whole cost, and only until the last marked graph launches)."""
    from types import SimpleNamespace

    from freetoken_graphfix.deferred import FirstLaunchGuard

    class Table:
        def host_fill_batch(self, batch: Any, use_graph: bool) -> Any:
            return batch  # stands for the deferred fill FreeToken returns in CUDA wait-sync mode

    class Graph:
        def replay(self) -> None:
            return None

    table, batch = Table(), SimpleNamespace(padded_size=1)

    def timed() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            table.host_fill_batch(batch, True)
        return time.perf_counter() - t0

    plain = timed()
    guard = FirstLaunchGuard(lambda graph, stream: None, None)
    waiting = Graph()
    guard.mark(waiting, 2, None, [table], lambda how: None)  # the bs-2 graph never launches here
    armed = timed()
    vars(waiting)["replay"].consume("measured")
    assert "host_fill_batch" not in vars(table)
    return 1e6 * (armed - plain) / calls


def gaps_child(settings: RigSettings) -> int:
    """In a fresh process: initialise CUPTI, capture the modes, trace replays, answer the gaps (``child.answer``)."""
    from torch.profiler import _utils

    # CUPTI must be initialised before graphs are captured, or their kernels go untraced (PyTorch #75504)
    _utils._init_for_cuda_graphs()
    rig, runners, arms, _ = build_arms(settings)
    bs = max(settings.batch_sizes)
    launch = launcher(rig, runners)
    gaps, note = profile_gaps(list(arms), bs, lambda arm, bs: launch(arm, 0, bs), rig.stream, settings.profile_reps)
    child.answer({"gaps": gaps, "note": note + f" (bs {bs})"})
    return 0
