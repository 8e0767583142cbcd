"""``bench --engine``'s report, derived from its record: the terminal tables and, for ``--markdown``,
#775's own shape (GPU ms per decode step and tok/s per build, then the kernel-timeline bullets)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from .engine import PATCHED_ARMS, RESOLUTION, failures, fmt_ms
from .stats import paired, t975


def band(pair: list[float] | None, is_base: bool = False) -> str:
    """``1.0021 ± 0.0034`` (two standard errors over rounds), or why the run cannot say."""
    if is_base:
        return "1 (base)"
    if not pair or math.isnan(pair[0]) or math.isnan(pair[1]):
        return "n/a (needs 2 rounds)"
    return f"{pair[0]:.4f} ± {2 * pair[1]:.4f}"


def case_line(record: dict[str, Any]) -> str:
    if record["wait_case"]:
        return ("its decode graphs hold a WAIT the host releases after the launch (PLE wait-sync): the "
                "never-uploaded arms are the negative control, and may block")
    return ("no decode graph holds a WAIT the host releases after the launch: nothing needs protection, every "
            "shim arm is a no-op, and every arm must give upstream's tokens")


def header(record: dict[str, Any]) -> list[str]:
    env, summary = record["env"], record["summary"]
    first = next((r for rs in record["runs"].values() for r in rs if "freetoken" in r), {})
    ft = first.get("freetoken", "?") + ("; patched arm: patches/ applied"
                                        if any(arm in PATCHED_ARMS for arm in summary) else "")
    return [f"{env['gpu']} | driver {env['driver']} | torch {env['torch']} | freetoken {ft} | {env['date']}",
            f"model: {record['model']}" + (f"; FreeToken options: {' '.join(record['ft_args'])}"
                                           if record["ft_args"] else ""),
            f"workload: copy a text verbatim from a {record['context']}-token context, greedy, "
            f"{record['decode_steps']} decode steps per request, bs 2 (two requests) then bs 1; {record['rounds']} "
            "round(s), a process per arm per round, in rotated order",
            f"case: {case_line(record)}"]


METRICS = (("copies", "the graph replayed from an idle GPU over never-uploaded copies of it in its own process"),
           ("graph", "GPU time of the graph step in the decode loop"), ("step", "GPU time per decode step"),
           ("replay", "GPU time of the graph replayed from an idle GPU"))


VERDICTS = ("COSTS this GPU", "FASTER on this GPU",
            "no cost this run can resolve (95% interval wider than ±0.5%: more --rounds)",
            "no cost beyond ±0.5% (95% interval within it)")  # most telling first


def judged(ratio: float, se: float, samples: int) -> int:
    """What a ratio to never-uploaded graphs means (an index into ``VERDICTS``), on its 95% interval
    from ``samples`` values (Student's t). An interval inside ±0.5% is no cost, even when it excludes
    1: #775's regression is 1-2%, and a resolved +0.03% is not one. No band resolves nothing."""
    half = t975(samples) * se
    if abs(ratio - 1) + half <= RESOLUTION:
        return 3
    return 0 if ratio - 1 > half else 1 if 1 - ratio > half else 2


def copies_lines(record: dict[str, Any]) -> list[str]:
    """The upload measured inside each process: its copies of each engine graph, uploaded against never
    uploaded, over every process of the run (each process one sample)."""
    copies = record.get("upload_copies", {})
    if not copies:
        return ["the upload itself, same graph, same process: not measured (--copies 0, or no run timed its graphs)"]
    parts = [f"bs {bs} {100 * (r - 1):+.2f}% ± {200 * se:.2f}%" if not math.isnan(se) else f"bs {bs} n/a"
             for bs, (r, se, _, _) in copies.items()]
    tail = VERDICTS[min(judged(r, se, n) for r, se, n, _ in copies.values())]
    _, _, processes, each = next(iter(copies.values()))
    return [f"the upload itself, same graph, same process ({each} uploaded and as many never-uploaded copies of "
            f"each engine graph, {processes} processes): {', '.join(parts)}: {tail}"]


def graph_ms(s: dict[str, Any], bs: str) -> float:
    """An arm's graph step in the decode loop at ``bs``: the median of its rounds' medians (nan: none)."""
    rounds = [x for x in s["graph_rounds"].get(bs, []) if x]
    return statistics.median(rounds) if rounds else math.nan


def host_bound(summary: dict[str, Any]) -> list[str]:
    """Where the graph step takes much less GPU time than the decode step around it, the GPU waits for
    the host between graphs: there the step's GPU time and tok/s follow the host (the scheduler), and
    only the graph step measures the graph."""
    out = []
    for arm, s in summary.items():
        for bs, q in s["step_gpu_ms"].items():
            graph = graph_ms(s, bs)
            if q.get("median") and graph < 0.9 * q["median"]:
                out.append(f"{arm} bs {bs}: the graph step takes {100 * graph / q['median']:.0f}% "
                           "of the decode step's GPU time (host-bound: the step's GPU time and tok/s follow the host)")
    return out


def paired_rounds(summary: dict[str, Any], arm: str, key: str, bs: str) -> int:
    """How many rounds gave both ``arm`` and the base arm a figure: the samples of that ratio's band."""
    base = summary[summary[arm]["base"]][f"{key}_rounds"].get(bs, [])
    return len(paired(summary[arm][f"{key}_rounds"].get(bs, []), base))


def verdict(summary: dict[str, Any]) -> list[str]:
    """Per compared arm and bs: the ratio to the never-uploaded arm with its band (2 SE), and what it
    means, judged on the 95% interval of a standard error from that few rounds (Student's t: 4.3 SE
    at three rounds). Two never-uploaded arms came out 1.0% apart with a 2-SE band of 0.8% over three
    rounds on the H200: 2 SE from a handful of processes is not a 95% interval."""
    lines = []
    for arm in [a for a in ("upstream", "auto", "patched") if a in summary and a != summary[a]["base"]]:
        for key, what in METRICS:
            parts, tails = [], []
            for bs, pair in summary[arm][f"{key}_vs_never_uploaded"].items():
                parts.append(f"bs {bs} n/a" if math.isnan(pair[1]) else
                             f"bs {bs} {100 * (pair[0] - 1):+.2f}% ± {200 * pair[1]:.2f}%")
                tails.append(judged(*pair, paired_rounds(summary, arm, key, bs)))
            if not parts:
                continue
            tail = VERDICTS[min(tails)]
            lines.append(f"{arm} vs never uploaded ({summary[arm]['base']}), {what}: {', '.join(parts)}: {tail}")
    return lines


def render(record: dict[str, Any]) -> str:
    summary = record["summary"]
    lines = [*header(record),
             f"{'arm':14} {'fires':>5} {'1st launch ms':>14} {'upload ms/graph':>15} {'capture ms':>10} "
             f"{'free MiB':>9} {'1st-launch MiB':>14} {'tokens':>17} {'distinct':>8}"]
    for arm, s in summary.items():
        tokens = ",".join(s["hashes"]) + ("" if arm == s["reference"] or s["same_tokens_as_reference"] else " DIFF")
        mib = " ".join(f"{v:.0f}" for v in s["first_launch_mib"].values())
        lines.append(f"{arm:14} {s['fires']:>5} {fmt_ms(s['first_launch_ms']):>14} {s['upload_ms_per_graph']:>15.2f} "
                     f"{s['capture_ms']:>10.1f} {s['free_mib_after_capture']:>9.0f} {mib:>14} {tokens:>17} "
                     f"{s['distinct_tokens'] if s['distinct_tokens'] is not None else '-':>8}")
        lines += [f"{'':15}! {e}" for e in s["errors"]]
    lines.append("free MiB: free GPU memory after capture; 1st-launch MiB: taken by each graph's first launch "
                 "(bs 2, bs 1)")
    base = next(iter(summary.values()), {}).get("base")
    lines.append("GPU ms per decode step (CUDA events around forward_batch, warm graph steps) and tok/s (bs x 1000 / "
                 "ms); graph step: events around GraphRunner.replay in the same steps (its input copies and the "
                 "graph); replay: the graph alone from an idle GPU after the workload; copies: the same, over "
                 "never-uploaded copies of the graph in the same process (the process's own speed divides out); "
                 + (f"ratios to {base} ± 2 SE over rounds (verdicts: the 95% interval, Student's t)" if base else
                    "no never-uploaded arm, so no ratios (add --arms pre-697)"))
    lines.append(f"{'arm':14} {'bs':>3} {'step ms':>9} {'tok/s':>8} {'step / never':>17} {'graph ms':>9} "
                 f"{'graph / never':>17} {'replay / never':>17} {'copies / never':>17}")
    for arm, s in summary.items():
        for bs, q in s["step_gpu_ms"].items():
            lines.append(f"{arm:14} {bs:>3} {q.get('median', math.nan):9.4f} {s['tok_s'].get(bs, math.nan):8.1f} "
                         f"{band(s['step_vs_never_uploaded'].get(bs), arm == base):>17} {graph_ms(s, bs):9.4f} "
                         + " ".join(f"{band(s[f'{key}_vs_never_uploaded'].get(bs), arm == base):>17}"
                                    for key in ("graph", "replay", "copies")))
    lines += timeline_lines(summary)
    lines += host_bound(summary)
    lines += verdict(summary)
    lines += copies_lines(record)
    controls = [a for a, s in summary.items() if not s["protected"]]
    if controls:
        lines.append("negative control (never uploaded): " + ", ".join(
            f"{a} {'BLOCKED (watchdog fired)' if summary[a]['fires'] else 'never blocked at this size'}"
            for a in controls))
    bad = failures(record)
    reference = next(iter(summary.values()), {}).get("reference", "upstream")
    lines.append("safety: " + (f"every protected arm: no blocked launch, {reference}'s tokens" if not bad else
                               "FAILED: " + "; ".join(bad)))
    return "\n".join(lines)


def timeline_lines(summary: dict[str, Any]) -> list[str]:
    """The traced run's kernel timeline per arm and bs: kernels per decode step (the graph's), GPU busy
    time per step, and the median gap per stream of the decode graph (s1: most kernels)."""
    lines = ["kernel timeline (traced run, Kineto/CUPTI): per decode step, kernels (graph's) and GPU busy µs "
             "(union of kernel intervals); median gap µs between consecutive kernels per stream of the graph"]
    for arm, s in summary.items():
        t = s["timeline"]
        sizes = [bs for bs in t if bs != "note"]
        if not sizes:
            lines.append(f"{arm:14} {t.get('note', 'not traced')}")
        for bs in sizes:
            f = t[bs]
            gaps = " ".join(f"{name} {g['median']:.3f}" for name, g in f["gap_us"].items())
            kernels = f"{f['step_kernels']:.0f} ({f['graph_kernels']:.0f})" if f["step_kernels"] else \
                f"({f['graph_kernels']:.0f})"
            busy = f"{f['busy_us']:.1f}" if f["busy_us"] else "-"
            lines.append(f"{arm:14} bs {bs}: kernels {kernels}, busy {busy} µs, {f['streams']:.0f} streams, "
                         f"gap {gaps}")
    return lines


def markdown(records: list[dict[str, Any]]) -> str:
    """The report in #775's shape, one section per model: the environment and command, "GPU ms per
    decode step | tok/s" per build, the ratios with their bands, then the kernel-timeline bullets."""
    out = []
    for record in records:
        env, summary = record["env"], record["summary"]
        first = next((r for rs in record["runs"].values() for r in rs if "freetoken" in r), {})
        out += [f"### freetoken-graphfix bench --engine: {record['label']}", "", "| | |", "|---|---|",
                *(f"| {k} | {v} |" for k, v in (
                    ("GPU", env["gpu"]), ("driver", env["driver"]), ("torch", env["torch"]),
                    ("FreeToken", first.get("freetoken", "?")), ("model", record["model"]),
                    ("workload", f"{record['context']}-token context, greedy, {record['decode_steps']} decode steps, "
                                 f"bs 2 then bs 1, {record['rounds']} rounds"),
                    ("date", env["date"]), ("command", f"`{record['command']}`"))),
                "", f"Case: {case_line(record)}.", "",
                "| build | bs | GPU ms per decode step | tok/s | vs never uploaded (± 2 SE) | graph step vs never "
                "uploaded | graph replayed from idle vs never uploaded | the same, over never-uploaded copies in its "
                "process |", "|---|---|---|---|---|---|---|---|"]
        for arm, s in summary.items():
            for bs, q in s["step_gpu_ms"].items():
                out.append(f"| {arm} | {bs} | {q.get('median', math.nan):.3f} | {s['tok_s'].get(bs, math.nan):.1f} | "
                           + " | ".join(band(s[f"{key}_vs_never_uploaded"].get(bs), arm == s["base"])
                                        for key in ("step", "graph", "replay", "copies")) + " |")
        out.append("")
        out += [f"- {line}" for line in timeline_lines(summary)]
        out += [f"- free GPU memory after capture, {arm}: {s['free_mib_after_capture']:.0f} MiB; taken by the first "
                f"launch: " + ", ".join(f"bs {bs} {v:.0f} MiB" for bs, v in s["first_launch_mib"].items())
                for arm, s in summary.items()]
        out += [f"- {line}" for line in host_bound(summary)]
        out += [f"- **{line}**" for line in (*verdict(summary), *copies_lines(record))]
        bad = failures(record)
        out += [f"- safety: {'every protected arm: no blocked launch, the same tokens' if not bad else '; '.join(bad)}",
                ""]
    return "\n".join(out)
