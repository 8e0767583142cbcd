"""``bench --engine``'s report, derived from its record's figures (``engine_stats``): the terminal
tables and, for ``--markdown``, #775's own shape. The verdicts lead with what process noise cannot
move (the upload inside one process's decode loop), then the kernel timeline, then the arms across
processes (within a shared host mode, never claiming more than the A/A control allows), and last
the diagnostics from an idle GPU, which never decide on their own."""

from __future__ import annotations

import math
from typing import Any

from .arms import GATE, PATCHED_ARMS
from .cupti import first_streams
from .engine import failures, fmt_ms
from .engine_stats import CROSS
from .loop import METRICS as LOOP_METRICS
from .stats import half_width
from .verdicts import COSTS, FASTER, REPORTERS_CHECK, judged, pct, recovered, worst

NO_AA = "not judged: no A/A control in this run ({})"
NOT_JUDGED = "not judged: the positive control was not recovered"
IDLE_ONLY = "from idle only; in the decode loop: {}"
LAUNCH_PATH = "the engine's own launch path against the copies' (never uploaded either): not the upload"
AS_CONTROL = "as {}'s own graph, never uploaded: the engine's own launch path, not the upload"
SHORT = {"step": "decode step", "launch": "graph launch"}
UPLOADED_AT_CAPTURE = ("upstream", "upload", GATE)  # FreeToken's _upload_graph (gate: upstream, fill before launch)


def band(triple: list[float] | None, is_base: bool = False) -> str:
    """A cross-process ratio with its 95% interval, or why the run cannot say."""
    if is_base:
        return "1 (base)"
    if not triple or math.isnan(triple[0]):
        return "n/a"
    half = half_width(triple[1], int(triple[2]))
    return f"{triple[0]:.4f}" + ("" if math.isnan(half) else f" ± {half:.4f}")


def case_line(record: dict[str, Any]) -> str:
    if record["wait_case"]:
        return ("its decode graphs hold a WAIT the host releases after the launch (PLE wait-sync): the "
                "never-uploaded arms are the negative control, and may block")
    return ("no decode graph holds a WAIT the host releases after the launch: nothing needs protection, every "
            "shim arm is a no-op, and every arm must give upstream's tokens")


def freetoken_of(record: dict[str, Any]) -> str:
    first = next((r for rs in record["runs"].values() for r in rs if "freetoken" in r), {})
    return first.get("freetoken", "?")


def header(record: dict[str, Any]) -> list[str]:
    env, arms = record["env"], record["summary"]["arms"]
    ft = freetoken_of(record) + ("; patched arm: patches/ applied" if any(a in PATCHED_ARMS for a in arms) else "")
    return [f"{env['gpu']} | driver {env['driver']} | torch {env['torch']} | freetoken {ft} | {env['date']}",
            f"model: {record['model']}" + (f"; FreeToken options: {' '.join(record['ft_args'])}"
                                           if record["ft_args"] else ""),
            f"workload: copy a text verbatim from a {record['context']}-token context, greedy, "
            f"{record['decode_steps']} decode steps per request, bs 2 (two requests) then bs 1; {record['rounds']} "
            "round(s), a process per arm per round, in rotated order",
            f"case: {case_line(record)}"]


# ---------------------------------------------------------------- inside one process

def loop_parts(figures: dict[str, dict[str, Any]], metric: str) -> tuple[list[str], list[str]]:
    parts, verdicts = [], []
    for bs, f in figures.get(metric, {}).items():
        spread = ""
        if f["processes"] > 1:
            lo, hi = min(f["per_process"]), max(f["per_process"])
            spread = f" (processes {100 * (lo - 1):+.2f}..{100 * (hi - 1):+.2f}%)"
        parts.append(f"bs {bs} {pct(f['ratio'], f['half'])}{spread}")
        verdicts.append(judged(f["ratio"], f["half"]))
    return parts, verdicts


def own_graph_verdicts(summary: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Per arm, its own graph over its never-uploaded copies in the decode loop: the figures and the
    verdict. The engine launches its own executable through torch's ``CUDAGraph.replay()`` and the
    copies through ``cuGraphLaunch`` from Python, so where the step is host-bound the two launch paths
    alone set them apart (1.4% on a 4-layer qwen3_moe on the H200, in every arm). An arm whose graphs
    were not uploaded at capture is the control for that: its own graph never yields a verdict, and an
    uploaded arm's cost or speed-up that a control shows too is the launch path's, not the upload's."""
    figures: dict[str, tuple[str, str]] = {}
    for arm, s in summary["arms"].items():
        parts, verdicts = [], []
        for metric, _, _ in LOOP_METRICS:
            p, v = loop_parts(s["own_in_loop"], metric)
            if p:
                parts.append(f"{SHORT[metric]} {', '.join(p)}")
                verdicts += v
        if parts:
            figures[arm] = ("; ".join(parts), worst(verdicts))
    controls = {arm: v for arm, (_, v) in figures.items() if arm not in UPLOADED_AT_CAPTURE}
    out = {}
    for arm, (parts, v) in figures.items():
        if v in (COSTS, FASTER):
            if arm not in UPLOADED_AT_CAPTURE:
                v = LAUNCH_PATH
            elif same := [c for c, cv in controls.items() if cv == v]:
                v = AS_CONTROL.format(same[0])
        out[arm] = parts, v
    return out


def control_lines(summary: dict[str, Any]) -> tuple[list[str], dict[tuple[str, str], bool] | None]:
    """The positive control in the decode loop (a spin of known GPU time after a never-uploaded copy's
    launch, in the same cycle): what it added and read per metric and bs, and per (metric, bs) whether
    it was read back (``verdicts.recovered``); ``None`` where none ran (``--copies 0``, or a record
    from before)."""
    ctl = summary.get("control_in_loop") or {}
    if not ctl:
        return ["  positive control: not measured (--copies 0, or a record from before the bench ran one)"], None
    seen, got = {}, []
    for metric, _, what in LOOP_METRICS:
        parts = []
        for bs, f in ctl.get(metric, {}).items():
            seen[metric, bs] = recovered(f["ratio"], f["half"], f["added"])
            parts.append(f"bs {bs} {100 * f['added']:+.2f}% added, read {pct(f['ratio'], f['half'])}"
                         + ("" if seen[metric, bs] else " (not recovered)"))
        if parts:
            got.append(f"{what} {', '.join(parts)}")
    head = "  positive control (a spin of known GPU time after two more never-uploaded copies, in the same cycle): "
    if not any(seen.values()):
        return [f"{head}{'; '.join(got)}: NOT recovered, so the upload is not judged"], seen
    up = summary["upload_in_loop"]  # a process with a control figure has an upload figure at that metric and bs
    widest = max(up[metric][bs]["half"] for (metric, bs), ok in seen.items() if ok)
    tail = "recovered" if all(seen.values()) else "recovered but where marked; the upload is judged only where it was"
    return [f"{head}{'; '.join(got)}: {tail}; this run names any cost above +{100 * widest:.2f}%"], seen


def in_loop_lines(summary: dict[str, Any]) -> list[str]:
    """The headline: the upload inside one process's decode loop, each figure judged only where the
    positive control at that metric and bs was read back, then each arm's own graph there."""
    up = summary["upload_in_loop"]
    if not up:
        return ["the upload in the decode loop, same graph, same process: not measured (--copies 0, or a record "
                "from before the decode loop launched copies)"]
    first = next(iter(next(iter(up.values())).values()))
    lines = [f"the upload in the decode loop, same graph, same process ({first['copies']} uploaded and as many "
             f"never-uploaded copies of each engine graph, launched in turn with it step by step, {first['processes']} "
             "processes; ± the 95% interval over steps, copies and processes):"]
    controls, seen = control_lines(summary)
    for metric, _, what in LOOP_METRICS:
        parts, verdicts = loop_parts(up, metric)
        if seen is not None:  # a figure whose control was not read back is shown, not judged
            blind = [not seen.get((metric, bs)) for bs in up.get(metric, {})]
            parts = [p + (" (not judged)" if b else "") for p, b in zip(parts, blind, strict=True)]
            verdicts = [v for v, b in zip(verdicts, blind, strict=True) if not b]
        if parts:
            lines.append(f"  {what}: {', '.join(parts)}: {worst(verdicts) if verdicts else NOT_JUDGED}")
    lines += controls
    for arm, (parts, verdict) in own_graph_verdicts(summary).items():
        what = "uploaded at capture" if arm in UPLOADED_AT_CAPTURE else "not uploaded at capture: a control"
        lines.append(f"  {arm}'s own graph ({what}) over its never-uploaded copies: {parts}: {verdict}")
    return lines


# ---------------------------------------------------------------- the kernel timeline

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


# ---------------------------------------------------------------- host modes and the A/A control

def mode_name(k: int | None) -> str:
    return "-" if k is None else chr(ord("A") + k)


def host_mode_lines(summary: dict[str, Any]) -> list[str]:
    """Which process was in which host mode, per phase (bs), with its host and GPU ms per step."""
    bounds = summary["host_modes"]
    several = {bs: b for bs, b in bounds.items() if len(b) > 1}
    cut = "; ".join(f"bs {bs}: " + " | ".join(f"{mode_name(i)} < {b:.3f} ms" for i, b in enumerate(bd[:-1]))
                    for bs, bd in several.items())
    lines = ["host modes (median host ms per decode step of each process and phase; processes compare across arms "
             "only within a mode): " + (f"several: {cut}" if several else "one per phase")]
    for arm, s in summary["arms"].items():
        for row in s["processes"]:
            parts = [f"bs {bs} host {host:.3f} / GPU {row['step'].get(bs, math.nan):.3f} ms "
                     f"{mode_name(row['mode'].get(bs))}" for bs, host in row["host_ms"].items()]
            lines.append(f"  {arm} round {row['round']}: " + ", ".join(parts))
    return lines


def aa_floor(summary: dict[str, Any], name: str, bs: str) -> float | None:
    """How far the A/A control's two identical arms came apart in ``name`` at ``bs``, with its band: no
    cross-process figure may claim to resolve less. ``None`` where the run has no such figure."""
    triple = summary["aa"]["figures"].get(name, {}).get(bs)
    if not triple or math.isnan(triple[0]):
        return None
    half = half_width(triple[1], int(triple[2]))
    return abs(triple[0] - 1) + (0.0 if math.isnan(half) else half)


def no_aa_reason(summary: dict[str, Any], wait_case: bool) -> str:
    if summary["aa"]["pair"]:
        a, b = summary["aa"]["pair"]
        return f"{a} and {b} share no host mode here, or ran one round"
    return "add --arms " + ("pre-697 skip, or auto deferred" if wait_case else "pre-697 auto")


def aa_lines(record: dict[str, Any]) -> list[str]:
    summary = record["summary"]
    pair = summary["aa"]["pair"]
    if not pair:
        return [f"A/A control: none ({no_aa_reason(summary, record['wait_case'])}: two arms that run the same "
                "never-uploaded graphs); no cross-process figure is judged"]
    a, b = pair
    parts = []
    for name, _, what in CROSS:
        got = [f"bs {bs} {pct(t[0], half_width(t[1], int(t[2])))}" for bs, t in summary["aa"]["figures"][name].items()]
        parts.append(f"{what}: {', '.join(got)}")
    return [f"A/A control ({b} over {a}: the same never-uploaded graphs, so any difference is the processes'): "
            + "; ".join(parts) + ": the run's noise floor for every cross-process figure"]


# ---------------------------------------------------------------- across processes

def cross_figure(record: dict[str, Any], name: str, bs: str, triple: list[float]) -> tuple[str, str]:
    """One cross-process ratio (``[ratio, SE, dof]``) as ``bs 2 +0.10% ± 0.20%`` and its verdict, held to
    the A/A floor of that figure and bs (none judged without one)."""
    half = half_width(triple[1], int(triple[2]))
    floor = aa_floor(record["summary"], name, bs)
    verdict = NO_AA.format(no_aa_reason(record["summary"], record["wait_case"])) if floor is None else \
        judged(triple[0], half, floor)
    return f"bs {bs} {pct(triple[0], half)}", verdict


def cross_verdicts(record: dict[str, Any]) -> tuple[list[str], dict[tuple[str, str, str], str]]:
    """Per compared arm, the decode loop's figures across processes (within host modes, against the
    A/A floor); and each verdict by (arm, figure, bs), for the diagnostics to be held against."""
    summary = record["summary"]
    lines: list[str] = []
    by: dict[tuple[str, str, str], str] = {}
    base = summary["base"]
    for arm in compared(summary):
        for name, _, what in CROSS[:2]:
            parts, verdicts = [], []
            for bs, t in summary["arms"][arm]["cross"].get(name, {}).items():
                part, v = cross_figure(record, name, bs, t)
                parts.append(part)
                verdicts.append(v)
                by[arm, name, bs] = v
            if parts:
                lines.append(f"{arm} vs never uploaded ({base}), across processes within host modes, {what}: "
                             f"{', '.join(parts)}: {worst(verdicts)}")
    return lines, by


def host_bound(summary: dict[str, Any]) -> list[str]:
    """Where the graph step takes much less GPU time than the decode step around it, the GPU waits for
    the host between graphs: there the step's GPU time and tok/s follow the host (the scheduler)."""
    out = []
    for arm, s in summary["arms"].items():
        for bs, q in s["step_gpu_ms"].items():
            graph = s["graph_ms"].get(bs, math.nan)
            if q.get("median") and graph < 0.9 * q["median"]:
                out.append(f"{arm} bs {bs}: the graph step takes {100 * graph / q['median']:.0f}% "
                           "of the decode step's GPU time (host-bound: the step's GPU time and tok/s follow the host)")
    return out


# ---------------------------------------------------------------- diagnostics from idle

def held_against(idle: str, in_loop: str | None) -> str:
    """A diagnostic's verdict never claims a cost or a speed-up the decode loop does not show."""
    if idle in (COSTS, FASTER) and in_loop is not None and in_loop != idle:
        return IDLE_ONLY.format(in_loop)
    return idle


def compared(summary: dict[str, Any]) -> list[str]:
    """The arms held against the never-uploaded base across processes: not the base, nor the A/A
    control's other arm (that pair is the noise floor, not a finding)."""
    base, pair = summary["base"], set(summary["aa"]["pair"] or ())
    return [a for a in ("upstream", "auto", "patched") if a in summary["arms"] and a != base and {a, base} != pair]


def diagnostic_lines(record: dict[str, Any], loop_by: dict[tuple[str, str, str], str]) -> list[str]:
    summary = record["summary"]
    lines = ["diagnostics, from an idle GPU after the workload (never a verdict on their own):"]
    base = summary["base"]
    for arm in compared(summary):
        parts, verdicts = [], []
        for bs, t in summary["arms"][arm]["cross"].get("replay", {}).items():
            part, v = cross_figure(record, "replay", bs, t)
            parts.append(part)
            verdicts.append(held_against(v, loop_by.get((arm, "graph", bs))))
        if parts:
            lines.append(f"  {arm} vs never uploaded ({base}), the graph replayed back to back, across processes: "
                         f"{', '.join(parts)}: {worst(verdicts)}")
    for arm, s in summary["arms"].items():
        own = s["own_idle"]
        if not own:
            continue
        lines.append(f"  {arm}'s own graph over its never-uploaded copies, replayed back to back: "
                     + idle_against_loop(own, s["own_in_loop"]))
    idle = summary["upload_idle"]
    if idle:
        _, _, processes, each = next(iter(idle.values()))
        lines.append(f"  the upload itself, replayed back to back ({each} uploaded and as many never-uploaded copies, "
                     f"{processes} processes): " + idle_against_loop(idle, summary["upload_in_loop"]))
    return lines


def idle_against_loop(idle: dict[str, list[float]], in_loop: dict[str, dict[str, Any]]) -> str:
    """In-process figures from idle per bs (``[ratio, SE, processes, ...]``) with their verdict, held
    against the same figure's graph launch in the decode loop."""
    loop_launch = {bs: judged(f["ratio"], f["half"]) for bs, f in in_loop.get("launch", {}).items()}
    parts, verdicts = [], []
    for bs, (ratio, se, n, *_) in idle.items():
        half = half_width(se, int(n) - 1)
        parts.append(f"bs {bs} {pct(ratio, half)}")
        verdicts.append(held_against(judged(ratio, half), loop_launch.get(bs)))
    return f"{', '.join(parts)}: {worst(verdicts)}"


# ---------------------------------------------------------------- the whole report

def arm_table(summary: dict[str, Any]) -> list[str]:
    lines = [f"{'arm':14} {'fires':>5} {'1st launch ms':>14} {'upload ms/graph':>15} {'capture ms':>10} "
             f"{'free MiB':>9} {'1st-launch MiB':>14} {'tokens':>17} {'distinct':>8} {'copies':>6}"]
    for arm, s in summary["arms"].items():
        tokens = ",".join(s["hashes"]) + ("" if arm == s["reference"] or s["same_tokens_as_reference"] else " DIFF")
        mib = " ".join(f"{v:.0f}" for v in s["first_launch_mib"].values())
        lines.append(f"{arm:14} {s['fires']:>5} {fmt_ms(s['first_launch_ms']):>14} {s['upload_ms_per_graph']:>15.2f} "
                     f"{s['capture_ms']:>10.1f} {s['free_mib_after_capture']:>9.0f} {mib:>14} {tokens:>17} "
                     f"{s['distinct_tokens'] if s['distinct_tokens'] is not None else '-':>8} "
                     f"{s['copies_tokens'] or '-':>6}")
        lines += [f"{'':15}! {e}" for e in s["errors"]]
    lines.append("free MiB: free GPU memory after capture; 1st-launch MiB: taken by each graph's first launch; "
                 "copies: the decode loop with copies gave the tokens of the arm's traced run (its own graphs only)")
    return lines


WAIT_KINDS = {"ple": "PLE table", "cpu_moe": "CPU-MoE executor", "locked_fetch": "locked fetch"}


def waits_line(summary: dict[str, Any]) -> list[str]:
    """The WAITs captured into each process's graphs, per kind, where the graphs held self-released
    ones (FreeToken's own threads release them; the shim never sees them and must decide as without)."""
    per_arm = {arm: s.get("waits", {}) for arm, s in summary["arms"].items()}
    if not any(n for w in per_arm.values() for kind, counts in w.items() if kind != "ple" for n in counts):
        return []

    def counts(w: dict[str, list[int]]) -> str:
        return ", ".join(f"{WAIT_KINDS.get(k, k)} {'/'.join(map(str, n))}" for k, n in w.items())

    shown = {counts(w) for w in per_arm.values()}
    body = f"every arm: {shown.pop()}" if len(shown) == 1 else "; ".join(
        f"{arm}: {counts(w)}" for arm, w in per_arm.items())
    return [f"WAITs captured per process (every graph and capture pass): {body} (CPU-MoE and locked-fetch WAITs "
            "are released by FreeToken's own threads: the shim never sees them)"]


def cross_table(summary: dict[str, Any]) -> list[str]:
    base = summary["base"]
    lines = ["across processes, the arm's own graph steps (CUDA events around forward_batch, and around "
             "GraphRunner.replay for the graph step), ratios to " + (f"{base} within host modes ± the 95% interval"
                                                                     if base else "none: no never-uploaded arm")]
    lines.append(f"{'arm':14} {'bs':>3} {'step ms':>9} {'tok/s':>8} {'step / never':>17} {'graph ms':>9} "
                 f"{'graph / never':>17} {'idle / never':>17}")
    for arm, s in summary["arms"].items():
        for bs, q in s["step_gpu_ms"].items():
            cells = [band(s["cross"].get(name, {}).get(bs), arm == base) for name in ("step", "graph", "replay")]
            lines.append(f"{arm:14} {bs:>3} {q.get('median', math.nan):9.4f} {s['tok_s'].get(bs, math.nan):8.1f} "
                         f"{cells[0]:>17} {s['graph_ms'].get(bs, math.nan):9.4f} {cells[1]:>17} {cells[2]:>17}")
    return lines


def safety_lines(record: dict[str, Any]) -> list[str]:
    summary = record["summary"]["arms"]
    lines = []
    controls = [a for a, s in summary.items() if not s["protected"]]
    if controls:
        lines.append("negative control (never uploaded): " + ", ".join(
            f"{a} {'BLOCKED (watchdog fired)' if summary[a]['fires'] else 'never blocked at this size'}"
            for a in controls))
    bad = failures(record)
    reference = record["summary"]["reference"]
    lines.append("safety: " + (f"every protected arm: no blocked launch, {reference}'s tokens" if not bad else
                               "FAILED: " + "; ".join(bad)))
    return lines


def render(record: dict[str, Any]) -> str:
    summary = record["summary"]
    cross_lines, loop_by = cross_verdicts(record)
    lines = [*header(record), *arm_table(summary), *waits_line(summary), *in_loop_lines(summary),
             *timeline_lines(summary), *host_mode_lines(summary), *cross_table(summary), *aa_lines(record),
             *cross_lines, *host_bound(summary), *diagnostic_lines(record, loop_by), *safety_lines(record)]
    return "\n".join(lines)


def table_775(summary: dict[str, Any]) -> list[str]:
    """#775's own table, to paste into the issue: per build and bs, GPU ms per decode step and the
    median inter-kernel gap on each stream of the decode graph (the first four, from the traced
    processes; "not traced" where none ran)."""
    out = ["| build | bs | GPU ms per decode step | median gap between kernels per stream, µs (traced) |",
           "|---|---|---|---|"]
    for arm, s in summary["arms"].items():
        for bs, q in s["step_gpu_ms"].items():
            gaps = {name: g[0] for name, g in s["timeline"].get(bs, {}).get("gap_us", {}).items() if g}
            out.append(f"| {arm} | {bs} | {q.get('median', math.nan):.3f} | {first_streams(gaps) or 'not traced'} |")
    return out


def markdown(records: list[dict[str, Any]]) -> str:
    """The report in #775's shape, one section per model: the environment and command, #775's own
    table (ms a step and the gap per stream, per build), the upload in the decode loop, "GPU ms per
    decode step | tok/s" per build, the kernel-timeline bullets, then the cross-process verdicts, the
    diagnostics and the safety line."""
    out = []
    for record in records:
        env, summary = record["env"], record["summary"]
        cross_lines, loop_by = cross_verdicts(record)
        out += [f"### freetoken-graphfix bench --engine: {record['label']}", "", "| | |", "|---|---|",
                *(f"| {k} | {v} |" for k, v in (
                    ("GPU", env["gpu"]), ("driver", env["driver"]), ("torch", env["torch"]),
                    ("FreeToken", freetoken_of(record)), ("model", record["model"]),
                    ("workload", f"{record['context']}-token context, greedy, {record['decode_steps']} decode steps, "
                                 f"bs 2 then bs 1, {record['rounds']} rounds"),
                    ("date", env["date"]), ("command", f"`{record.get('command', 'not recorded')}`"))),
                "", *table_775(summary), "", f"Case: {case_line(record)}.", ""]
        out += [f"**{line.strip()}**" if i == 0 else f"- {line.strip()}"
                for i, line in enumerate(in_loop_lines(summary))]
        out += ["", "| build | bs | GPU ms per decode step | tok/s | vs never uploaded, within host modes (95%) | "
                "graph step vs never uploaded | replayed from idle vs never uploaded (diagnostic) |",
                "|---|---|---|---|---|---|---|"]
        for arm, s in summary["arms"].items():
            for bs, q in s["step_gpu_ms"].items():
                cells = [band(s["cross"].get(name, {}).get(bs), arm == summary["base"])
                         for name in ("step", "graph", "replay")]
                out.append(f"| {arm} | {bs} | {q.get('median', math.nan):.3f} | {s['tok_s'].get(bs, math.nan):.1f} | "
                           + " | ".join(cells) + " |")
        out.append("")
        out += [f"- {line}" for line in waits_line(summary)]
        out += [f"- {line.strip()}" for line in timeline_lines(summary)]
        out += [f"- {line.strip()}" for line in host_mode_lines(summary)]
        out += [f"- free GPU memory after capture, {arm}: {s['free_mib_after_capture']:.0f} MiB; taken by the first "
                f"launch: " + ", ".join(f"bs {bs} {v:.0f} MiB" for bs, v in s["first_launch_mib"].items())
                for arm, s in summary["arms"].items()]
        out += [f"- {line}" for line in host_bound(summary)]
        out += [f"- **{line}**" for line in (*aa_lines(record), *cross_lines)]
        out += [f"- {line.strip()}" for line in diagnostic_lines(record, loop_by)]
        out += [f"- {line}" for line in safety_lines(record)] + ["", f"_{REPORTERS_CHECK}._", ""]
    return "\n".join(out)
