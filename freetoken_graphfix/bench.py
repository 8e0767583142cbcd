"""``python -m freetoken_graphfix bench``: what the upload and each strategy cost on this GPU.

Measuring is kept apart from reporting: every arm's raw figures go to ``--json``; the table is
derived. Arms run in one process and their replays are interleaved round-robin, so slow drift of
clocks or temperature lands on every arm alike; ratios are taken to ``skip`` (never uploaded).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from datetime import date
from typing import Any, TypeVar

STRATEGIES = ("upload", "skip", "warm", "deferred", "auto")
OK, ERR = 0, 1
T = TypeVar("T")


# ---------------------------------------------------------------- statistics and rendering

def summary(values: list[float], percentiles: tuple[int, int] = (10, 90)) -> dict[str, float]:
    """Median and two percentiles (p10/p90 by default; more robust than the mean), with the count."""
    if not values:
        return {"n": 0}
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"n": len(values), "median": statistics.median(values), **{f"p{p}": q[p - 1] for p in percentiles}}


def environment() -> dict[str, str]:
    import torch

    from .compat import freetoken_version

    driver = "unknown"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        pass
    return {"gpu": torch.cuda.get_device_name(), "driver": driver, "torch": torch.__version__,
            "cuda": str(torch.version.cuda), "freetoken": freetoken_version(), "python": platform.python_version(),
            "date": date.today().isoformat()}


def rotated(names: Sequence[T], rep: int) -> list[T]:
    """Arm order for pass ``rep``: each arm takes every position in turn, so none is always first."""
    k = rep % len(names)
    return [*names[k:], *names[:k]]


def last_stderr_line(proc: subprocess.CompletedProcess) -> str:
    return (proc.stderr.strip().splitlines() or ["no output"])[-1]


def progress(iterable: Iterable, total: int, desc: str) -> Iterable:
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, leave=False, disable=total < 50)


# ---------------------------------------------------------------- CUPTI inter-kernel gaps

def kernel_gaps(trace_file: str, launches: list[str],
                skip_first: set[str]) -> tuple[dict[str, dict[str, list[float]]], str]:
    """Per arm and stream, the gaps (µs) between consecutive kernels of one replay, from Kineto's trace.

    Every launch replays the same graph body and was synchronised before the next, so the kernel
    records, in start order, fall into ``len(launches)`` equal chunks, one per launch, in
    ``launches`` order (an arm name per launch); the chunking is checked against the timeline.
    Each arm's first traced replay is dropped (the profiler loses events at session start).
    Returns the gaps ({} when the trace does not split that way) and a note on what it held.
    """
    with open(trace_file) as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("cat") == "kernel"]
    events.sort(key=lambda e: float(e["ts"]))
    per_launch, extra = divmod(len(events), max(1, len(launches)))
    note = f"{len(events)} kernel records for {len(launches)} launches"
    if extra or not per_launch:
        return {}, note + ": not an equal number per launch, gaps not reported"
    chunks = [events[i * per_launch:(i + 1) * per_launch] for i in range(len(launches))]
    for before, after in zip(chunks, chunks[1:], strict=False):
        if max(float(e["ts"]) + float(e.get("dur", 0)) for e in before) > float(after[0]["ts"]):
            return {}, note + ": launches overlap in the trace, gaps not reported"
    gaps: dict[str, dict[str, list[float]]] = {}
    seen: set[str] = set()
    for arm, chunk in zip(launches, chunks, strict=True):
        if arm in skip_first and arm not in seen:
            seen.add(arm)
            continue
        per_stream: dict[str, list[dict]] = {}
        for e in chunk:
            per_stream.setdefault(str(e.get("args", {}).get("stream", e.get("tid"))), []).append(e)
        for stream, ks in sorted(per_stream.items()):
            out = gaps.setdefault(arm, {}).setdefault(stream, [])
            out.extend(float(b["ts"]) - (float(a["ts"]) + float(a.get("dur", 0)))
                       for a, b in zip(ks, ks[1:], strict=False))
    return gaps, note + f", {per_launch} per launch"


# ---------------------------------------------------------------- the replay-cost benchmark

def build_arms(opts: argparse.Namespace) -> tuple[Any, dict[tuple[str, int], Any], dict[str, dict[str, Any]]]:
    """Capture ``opts.instances`` runners per strategy through the shim and launch each graph the way
    FreeToken does (first launch, then a check step whose logits every arm must share with ``upload``).

    Several instances per strategy because separately captured copies of one graph replay up to ~1%
    apart on the H200 even when treated identically: one instance per arm cannot resolve a 0.3% band.
    """
    import torch

    from . import hooks
    from .rig import Rig

    rig = Rig(kernels=opts.kernels, streams=opts.streams, wait=not opts.no_wait, h2d=opts.h2d)
    bs_list = tuple(sorted(opts.batch_sizes, reverse=True))
    arms: dict[str, dict[str, Any]] = {}
    runners: dict[tuple[str, int], Any] = {}
    logits: dict[str, list[dict[int, Any]]] = {}
    for arm in opts.strategies:
        hooks.uninstall()
        hooks.install(arm)
        rec = arms[arm] = {"capture_s": [], "graphs": {},
                           "first_launch": {str(bs): {"launch_ms": [], "blocked": []} for bs in bs_list},
                           "replay_us": {str(bs): [[] for _ in range(opts.instances)] for bs in bs_list}}
        for i in range(opts.instances):
            t0 = time.perf_counter()
            runner = runners[arm, i] = rig.capture(bs_list)
            rec["capture_s"].append(time.perf_counter() - t0)
            for g in hooks.status()["passes"][-1]["graphs"]:
                graph = rec["graphs"].setdefault(str(g["name"]), {"action": [], "hook_ms": []})
                graph["action"].append(g["action"])
                graph["hook_ms"].append(g["hook_ms"])
            for bs in bs_list:
                first = rig.step(runner, bs, seed=bs, watchdog_s=opts.watchdog)
                rec["first_launch"][str(bs)]["launch_ms"].append(first.launch_ms)
                rec["first_launch"][str(bs)]["blocked"].append(first.fired)
            logits.setdefault(arm, []).append(
                {bs: rig.step(runner, bs, seed=1000 + bs, watchdog_s=opts.watchdog).logits for bs in bs_list})
    hooks.uninstall()
    ref = logits.get("upload", next(iter(logits.values())))[0]
    for arm, per_instance in logits.items():
        arms[arm]["logits_equal_upload"] = all(torch.equal(got[bs], ref[bs]) for got in per_instance for bs in bs_list)
    return rig, runners, arms


def launcher(rig: Any, runners: dict[tuple[str, int], Any]) -> Any:
    """Replay instance ``i`` of ``arm``'s graph for ``bs``, its head WAIT released just before the launch."""
    from .device import read_flag, signal_flag

    flag = rig.table._flag if rig.table is not None else None

    def launch(arm: str, i: int, bs: int) -> None:
        if flag is not None:
            assert read_flag(flag) == 0, "surplus release"
            signal_flag(flag)  # the WAIT passes at once: time the graph, not the host's fill
        runners[arm, i].graph_map[bs].replay()

    return launch


def run_arms(opts: argparse.Namespace) -> dict[str, Any]:
    """The replay-cost record: every instance of every arm captured and launched, then interleaved
    timed replays. CUPTI is never initialised in this process (it slows and spreads every replay);
    the gaps come from a child process that captures the same arms under the profiler."""
    import torch

    rig, runners, arms = build_arms(opts)
    keys, stream = list(runners), rig.stream
    bs_list = sorted(map(int, next(iter(arms.values()))["replay_us"]), reverse=True)
    launch = launcher(rig, runners)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        for arm, i in keys:  # warm-up: every graph a few times
            for bs in bs_list:
                for _ in range(3):
                    launch(arm, i, bs)
                    stream.synchronize()
        for rep in progress(range(opts.reps), opts.reps, "interleaved replays"):
            for arm, i in rotated(keys, rep):
                for bs in bs_list:
                    start.record(stream)
                    launch(arm, i, bs)
                    end.record(stream)
                    end.synchronize()
                    arms[arm]["replay_us"][str(bs)][i].append(1e3 * start.elapsed_time(end))
    record = {"env": environment(), "config": {k: v for k, v in vars(opts).items() if k not in ("json", "plot")},
              "arms": arms, "host_overhead": host_overhead(rig, runners.get(("auto", 0)) or runners[keys[0]])}
    gaps, record["gaps_note"] = gaps_from_child(opts) if opts.profile_reps else ({}, "not traced (--profile-reps 0)")
    for arm in arms:
        arms[arm]["gaps_us"] = gaps.get(arm, {})
    return record


def gaps_from_child(opts: argparse.Namespace) -> tuple[dict[str, Any], str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "gaps.json")
        cmd = [sys.executable, "-m", "freetoken_graphfix", "bench", "--gaps-child", out,
               "--kernels", str(opts.kernels), "--streams", str(opts.streams), "--instances", "1", "--profile-reps",
               str(opts.profile_reps), "--batch-sizes", *map(str, opts.batch_sizes), "--strategies",
               *opts.strategies, *(["--no-wait"] if opts.no_wait else []), *(["--h2d"] if opts.h2d else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "FT_GRAPH_UPLOAD": "off"})  # the child installs per arm
        if proc.returncode != 0 or not os.path.exists(out):
            return {}, "CUPTI child failed: " + last_stderr_line(proc)
        with open(out) as fh:
            got = json.load(fh)
        return got["gaps"], got["note"]


def gaps_child(opts: argparse.Namespace) -> int:
    """In a fresh process: initialise CUPTI, capture the arms, trace replays, write the gaps."""
    from torch.profiler import _utils

    # CUPTI must be initialised before graphs are captured, or their kernels go untraced (PyTorch #75504)
    _utils._init_for_cuda_graphs()
    rig, runners, arms = build_arms(opts)
    bs = max(opts.batch_sizes)
    launch = launcher(rig, runners)
    gaps, note = profile_gaps(list(arms), bs, lambda arm, bs: launch(arm, 0, bs), rig.stream, opts.profile_reps)
    with open(opts.gaps_child, "w") as fh:
        json.dump({"gaps": gaps, "note": note + f" (bs {bs})"}, fh)
    return OK


def profile_gaps(names: list[str], bs: int, launch: Any, stream: Any, reps: int) -> tuple[dict[str, Any], str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    order: list[str] = []
    with torch.cuda.stream(stream), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for rep in range(reps + 1):
            for arm in rotated(names, rep):
                launch(arm, bs)
                stream.synchronize()
                order.append(arm)
    torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        path = fh.name
    try:
        prof.export_chrome_trace(path)
        return kernel_gaps(path, order, set(names))
    finally:
        os.unlink(path)


def host_overhead(rig: Any, runner: Any, blocks: int = 20, per_block: int = 25) -> dict[str, Any]:
    """Per-step host time (forward_host_ctx around replay, no sync) with and without the shim installed,
    on the same graphs, in alternating blocks; and the cost of one armed replay hook call."""
    import gc

    import torch

    from . import hooks

    bs = min(runner.graph_map)
    times: dict[str, list[float]] = {"shim installed": [], "shim uninstalled": []}
    for block in range(blocks):
        for arm in (("shim installed", "shim uninstalled") if block % 2 else ("shim uninstalled", "shim installed")):
            hooks.install("auto") if arm == "shim installed" else hooks.uninstall()
            gc.collect()
            for i in range(per_block):
                batch = rig.batch(bs, seed=i)
                t0 = time.perf_counter()
                with torch.cuda.stream(rig.stream), rig.ctx.forward_batch(batch), rig.host_ctx(batch):
                    runner.replay(batch)
                times[arm].append(1e6 * (time.perf_counter() - t0))
                rig.stream.synchronize()
    hooks.uninstall()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"step_host_us": {k: summary(v) for k, v in times.items()},
            "ratio": med["shim installed"] / med["shim uninstalled"], "armed_hook_us": armed_hook_cost()}


def armed_hook_cost(calls: int = 20000) -> float:
    """Extra host µs per ``GraphRunner.replay`` call while deferred hooks are armed (an unmarked graph)."""
    from types import SimpleNamespace

    from .deferred import FirstLaunchGuard

    class Graph:
        pass

    class Runner:
        graph_map = {1: Graph()}

        def replay(self, batch: Any) -> None:
            return None

    runner, batch = Runner(), SimpleNamespace(padded_size=1)

    def timed() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            runner.replay(batch)
        return time.perf_counter() - t0

    plain = timed()
    guard = FirstLaunchGuard(Runner, lambda graph, stream: None)
    pending = Graph()
    guard.mark(pending, [], lambda how: None)  # another graph awaits its first launch: the hook stays armed
    armed = timed()
    guard.forget()
    return 1e6 * (armed - plain) / calls


def rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The table's figures per (arm, bs), derived from the raw record: every instance's replays
    pooled, the ratio of pooled medians to ``skip``'s, the spread of the instances' medians
    (identically treated graphs differ by that much), and the ratio's standard error from the
    instances' medians, the unit that varies (``nan`` with fewer than two instances)."""
    arms = record["arms"]
    skip = {bs: (summary(pooled(times))["median"], instance_medians(times))
            for bs, times in arms["skip"]["replay_us"].items()} if "skip" in arms else {}
    out = []
    for arm, rec in arms.items():
        for bs, per_instance in rec["replay_us"].items():
            s = summary(pooled(per_instance))
            medians = instance_medians(per_instance)
            skip_median, skip_medians = skip.get(bs, (math.nan, []))
            graph = rec["graphs"].get(f"bs={bs}", {"action": ["?"], "hook_ms": []})
            first = rec["first_launch"][bs]
            out.append({
                "arm": arm, "bs": bs, "actions": sorted(set(graph["action"])), **s,
                "ratio_skip": s["median"] / skip_median, "ratio_se": standard_error(medians, skip_medians),
                "instance_spread": (max(medians) - min(medians)) / s["median"] if len(medians) > 1 else 0.0,
                "first_launch_ms": statistics.median(first["launch_ms"]), "blocked": sum(first["blocked"]),
                "instances": len(per_instance),
                "hook_ms": statistics.median(graph["hook_ms"]) if graph["hook_ms"] else math.nan,
                "logits_equal_upload": rec["logits_equal_upload"],
            })
    return out


def pooled(per_instance: list[list[float]]) -> list[float]:
    return [t for times in per_instance for t in times]


def instance_medians(per_instance: list[list[float]]) -> list[float]:
    return [statistics.median(times) for times in per_instance if times]


def standard_error(a: list[float], b: list[float]) -> float:
    """Relative standard error of mean(a) / mean(b), instances as the samples; nan below two each."""
    if len(a) < 2 or len(b) < 2:
        return math.nan
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    return (ma / mb) * ((statistics.variance(a) / len(a)) / ma**2 + (statistics.variance(b) / len(b)) / mb**2) ** 0.5


def verdict(table: list[dict[str, Any]]) -> str:
    """One line that answers the user's question: does the upload cost this GPU anything?"""
    ups = [r for r in table if r["arm"] == "upload" and not math.isnan(r["ratio_skip"])]
    if not ups:
        return "verdict: needs the upload and skip strategies"
    if any(math.isnan(r["ratio_se"]) for r in ups):
        return "verdict: needs --instances 2 or more (the instances' spread is the yardstick)"
    parts = ", ".join(f"bs {r['bs']} {100 * (r['ratio_skip'] - 1):+.2f}% ± {200 * r['ratio_se']:.2f}%" for r in ups)
    costly = [r for r in ups if r["ratio_skip"] - 1 > 2 * r["ratio_se"]]
    return (f"verdict: upload vs never uploaded (skip) replay: {parts} (± 2 standard errors over instances): "
            + ("the upload COSTS this GPU replay time; auto avoids it where no graph needs protection"
               if costly else "no measurable cost on this GPU"))


def render(record: dict[str, Any]) -> str:
    env, cfg = record["env"], record["config"]
    lines = [f"{env['gpu']} | driver {env['driver']} | torch {env['torch']} | freetoken {env['freetoken']} | "
             f"{env['date']}",
             f"graph: {cfg['kernels']} kernels over {cfg['streams']} streams, head WAIT "
             f"{'no' if cfg['no_wait'] else 'yes (real DiskRowTable)'}, H2D {'yes' if cfg['h2d'] else 'no'}, "
             f"bs {cfg['batch_sizes']}; {cfg['instances']} graph instances per strategy, {cfg['reps']} interleaved "
             "replays each; times in µs (all instances pooled)",
             f"{'strategy':9} {'bs':>3} {'action':9} {'median':>9} {'p10':>9} {'p90':>9} {'/skip':>7} {'spread':>7} "
             f"{'gap µs (med/stream)':>22} {'1st launch ms':>14} {'hook ms':>8} {'logits':>7}"]
    shown: set[str] = set()
    table = rows(record)
    for r in table:
        gaps = ""
        if r["arm"] not in shown:  # once per strategy: the gaps are traced at the largest bs only
            shown.add(r["arm"])
            gap_lists = [v for v in record["arms"][r["arm"]]["gaps_us"].values() if v]
            gaps = (f"{statistics.median(map(statistics.median, gap_lists)):.3f} ({len(gap_lists)} streams)"
                    if gap_lists else "n/a")
        blocked = f" BLOCKED {r['blocked']}/{r['instances']}" if r["blocked"] else ""
        lines.append(f"{r['arm']:9} {r['bs']:>3} {'/'.join(r['actions']):9} {r['median']:9.1f} {r['p10']:9.1f} "
                     f"{r['p90']:9.1f} {r['ratio_skip']:7.4f} {100 * r['instance_spread']:6.2f}% {gaps:>22} "
                     f"{r['first_launch_ms']:>14.2f}{blocked} {r['hook_ms']:8.2f} "
                     f"{'same' if r['logits_equal_upload'] else 'DIFF':>7}")
    lines.append("spread: max - min of the instances' medians over the pooled median; /skip: pooled medians")
    lines.append(verdict(table))
    lines.append(f"CUPTI: {record.get('gaps_note', 'n/a')}")
    ho = record.get("host_overhead")
    if ho:
        st = ho["step_host_us"]
        lines.append(f"host time per decode step (forward_host_ctx + replay, median µs): shim installed "
                     f"{st['shim installed']['median']:.1f}, uninstalled {st['shim uninstalled']['median']:.1f}, "
                     f"ratio {ho['ratio']:.4f}; armed replay hook {ho['armed_hook_us']:.2f} µs/call "
                     "(only until every deferred graph has launched once)")
    return "\n".join(lines)


def plot(record: dict[str, Any], path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "--plot skipped: matplotlib is not installed"
    arms = {a: [g for v in r["gaps_us"].values() for g in v] for a, r in record["arms"].items() if r["gaps_us"]}
    if not arms:
        return "--plot skipped: no CUPTI gaps were recorded"
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.boxplot(list(arms.values()), showfliers=False)
    ax.set_xticks(range(1, len(arms) + 1), list(arms))
    ax.set_ylabel("inter-kernel gap per stream (µs)")
    ax.set_title(f"{record['env']['gpu']}, driver {record['env']['driver']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return f"wrote {path}"


# ---------------------------------------------------------------- first-launch deadlock probes

def probe(opts: argparse.Namespace) -> dict[str, Any]:
    """One case: capture one graph (head WAIT + kernels) with ``strategy``, then its first launch
    in FreeToken's serving order with a watchdog. Printed as one JSON line."""
    from . import hooks
    from .rig import Rig

    rig = Rig(kernels=opts.kernels, streams=opts.streams, wait=True)
    hooks.uninstall()  # importing the package installed the environment's mode
    hooks.install(opts.strategy)
    t0 = time.perf_counter()
    runner = rig.capture((1,))
    capture_s = time.perf_counter() - t0
    first = rig.step(runner, 1, seed=1, watchdog_s=opts.watchdog)
    later = rig.step(runner, 1, seed=2, watchdog_s=opts.watchdog)
    return {"strategy": opts.strategy, "kernels": opts.kernels, "streams": opts.streams,
            "first_launch_ms": first.launch_ms, "blocked": first.fired, "second_blocked": later.fired,
            "capture_s": capture_s, "action": hooks.status()["passes"][-1]["graphs"][0]["action"]}


def deadlock_matrix(opts: argparse.Namespace) -> tuple[list[dict[str, Any]], str]:
    """Every (kernels, streams, strategy) case in its own process, ``opts.jobs`` at a time. A blocked
    case shows as a launch the watchdog released, so concurrent cases cannot hide one; their
    first-launch times are less precise than in a sequential run."""
    from concurrent.futures import ThreadPoolExecutor

    def run_case(case: tuple[int, int, str]) -> dict[str, Any]:
        kernels, streams, arm = case
        cmd = [sys.executable, "-m", "freetoken_graphfix", "bench", "--probe", "--strategy", arm,
               "--kernels", str(kernels), "--streams", str(streams), "--watchdog", str(opts.watchdog)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "FT_GRAPH_UPLOAD": arm})
        try:
            row = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            row = {"strategy": arm, "kernels": kernels, "streams": streams, "error": last_stderr_line(proc)}
        print("probe", json.dumps(row), file=sys.stderr, flush=True)
        return row

    cases = [(k, s, arm) for k in opts.matrix_kernels for s in (1, 4) for arm in opts.strategies]
    with ThreadPoolExecutor(max_workers=opts.jobs) as pool:
        rows = list(progress(pool.map(run_case, cases), len(cases), "deadlock probes"))
    lines = [f"{'kernels':>8} {'streams':>7} " + " ".join(f"{a:>16}" for a in opts.strategies)]
    for kernels in opts.matrix_kernels:
        for streams in (1, 4):
            cells = []
            for arm in opts.strategies:
                r = next(r for r in rows if (r["kernels"], r["streams"], r["strategy"]) == (kernels, streams, arm))
                cells.append("error" if "error" in r else
                             f"blocked ({r['first_launch_ms']:.0f} ms)" if r["blocked"] else
                             f"ok {r['first_launch_ms']:.2f} ms")
            lines.append(f"{kernels:>8} {streams:>7} " + " ".join(f"{c:>16}" for c in cells))
    return rows, "\n".join(lines)


# ---------------------------------------------------------------- interpreter start-up

def startup(runs: int) -> tuple[dict[str, Any], str]:
    """``python -c pass`` in two fresh venvs, interleaved: one bare, one holding this package's .pth
    (FT_GRAPH_UPLOAD unset). Needs no GPU."""
    import shutil
    import venv

    from .bootstrap import PTH_NAME, installed_pth

    pth = installed_pth()
    if pth is None:
        raise RuntimeError(f"{PTH_NAME} is not installed in this environment")
    root = tempfile.mkdtemp(prefix="graphfix-startup-")
    try:
        pythons = {}
        for name in ("without", "with"):
            venv.create(os.path.join(root, name), with_pip=False, symlinks=True)
            py = os.path.join(root, name, "bin", "python")
            site_dir = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                      capture_output=True, text=True, check=True).stdout.strip()
            if name == "with":
                shutil.copy(pth, os.path.join(site_dir, PTH_NAME))
            pythons[name] = py
        env = {k: v for k, v in os.environ.items() if k not in ("FT_GRAPH_UPLOAD", "PYTHONPATH")}
        times: dict[str, list[float]] = {"without": [], "with": []}
        for i in range(runs):
            for name in (("with", "without") if i % 2 else ("without", "with")):
                t0 = time.perf_counter()
                subprocess.run([pythons[name], "-c", "pass"], env=env, check=True)
                times[name].append(1e3 * (time.perf_counter() - t0))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    record = {"runs": runs, "ms": {k: summary(v) for k, v in times.items()}, "ratio": med["with"] / med["without"],
              "delta_ms": med["with"] - med["without"], "python": platform.python_version()}
    text = (f"python -c pass, {runs} interleaved runs each, FT_GRAPH_UPLOAD unset: without the package "
            f"{med['without']:.2f} ms, with its .pth {med['with']:.2f} ms (median); ratio {record['ratio']:.4f}, "
            f"delta {record['delta_ms']:+.3f} ms")
    return record, text


# ---------------------------------------------------------------- entry point

def positive(text: str) -> int:
    return _whole_at_least(text, 1)


def non_negative(text: str) -> int:
    return _whole_at_least(text, 0)


def _whole_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"{text!r}: accepted values are whole numbers of {low} or more")
    return value


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m freetoken_graphfix bench", description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=positive, default=1090, help="small kernels per graph (default 1090)")
    ap.add_argument("--streams", type=positive, default=4, help="streams, fork/join per layer (default 4)")
    ap.add_argument("--batch-sizes", type=positive, nargs="+", default=[1, 2], help="one graph each (default 1 2)")
    ap.add_argument("--instances", type=positive, default=4,
                    help="graphs captured per strategy and bs, their replays pooled (default 4)")
    ap.add_argument("--reps", type=positive, default=300,
                    help="interleaved timed replays per graph instance (default 300)")
    ap.add_argument("--profile-reps", type=non_negative, default=20,
                    help="replays per arm traced for CUPTI gaps (0: off)")
    ap.add_argument("--no-wait", action="store_true", help="no head WAIT (no PLE table in the graph)")
    ap.add_argument("--h2d", action="store_true", help="add a pinned-host H2D copy per layer (MoE-offload-like)")
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    ap.add_argument("--watchdog", type=float, default=4.0, help="seconds before a blocked launch is released")
    ap.add_argument("--json", metavar="PATH", help="write every raw figure here")
    ap.add_argument("--plot", metavar="PATH", help="PNG of the gap distributions (needs matplotlib)")
    ap.add_argument("--short", action="store_true", help="the quick form doctor runs")
    ap.add_argument("--deadlock", action="store_true", help="first-launch probe matrix, a subprocess per case")
    ap.add_argument("--matrix-kernels", type=positive, nargs="+", default=[1000, 8000, 32000, 64000])
    ap.add_argument("--jobs", type=positive, default=1, help="--deadlock cases run at once (default 1)")
    ap.add_argument("--startup", action="store_true", help="interpreter start-up with and without the .pth")
    ap.add_argument("--startup-runs", type=positive, default=200)
    from . import engine_bench  # imported here: it builds on this module's helpers

    engine_bench.add_arguments(ap.add_argument_group(
        "--engine: every mode in FreeToken's real engine (synthetic qwen4_exp)"))
    ap.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gaps-child", metavar="PATH", help=argparse.SUPPRESS)
    ap.add_argument("--strategy", default="auto", choices=STRATEGIES, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    if opts.startup:
        record, text = startup(opts.startup_runs)
        _write_json(opts.json, record)
        print(text)
        return OK
    import torch

    if not torch.cuda.is_available():
        print("bench: no CUDA device; nothing to measure (use --startup for the start-up benchmark)",
              file=sys.stderr)
        return ERR
    if opts.engine:
        from . import engine_bench

        return engine_bench.main(opts)
    if opts.probe:
        print(json.dumps(probe(opts)))
        return OK
    if opts.gaps_child:
        return gaps_child(opts)
    if opts.deadlock:
        rows, text = deadlock_matrix(opts)
        _write_json(opts.json, {"env": environment(), "probes": rows})
        print(text)
        protected = [r for r in rows if r["strategy"] != "skip"]
        return ERR if any(r.get("error") or r.get("blocked") for r in protected) else OK
    if opts.short:
        opts.reps, opts.profile_reps, opts.batch_sizes, opts.instances = 50, 0, [1], 1
    record = run_arms(opts)
    _write_json(opts.json, record)
    print(render(record))
    if opts.plot:
        print(plot(record, opts.plot))
    return OK


def _write_json(path: str | None, record: Any) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(record, fh, indent=1)
