"""``bench --engine``'s report, derived from its record's figures (``engine_stats``): the terminal
report and, for ``--markdown``, #775's own shape. The verdicts lead with what process noise cannot
move (``engine_loop_report``: the upload inside one process's decode loop), then the kernel timeline
(``engine_timeline``), then the arms across processes and the diagnostics from an idle GPU
(``engine_cross_report``); this module holds the header, the arms' table, the safety line and the
whole of each."""

from __future__ import annotations

import math
from typing import Any

from .arms import PATCHED_ARMS
from .cupti import first_streams
from .engine import failures, fmt_ms
from .engine_cross_report import (
    aa_lines,
    band,
    cross_table,
    cross_verdicts,
    diagnostic_lines,
    host_bound,
    host_mode_lines,
)
from .engine_headline import headline
from .engine_loop_report import in_loop_lines
from .engine_timeline import timeline_lines
from .verdicts import REPORTERS_CHECK


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
    lines = [*headline(record), "", *header(record), *arm_table(summary), *waits_line(summary), *in_loop_lines(summary),
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


DETAIL = ("_The kernel timeline per arm, every process's host mode and memory and the diagnostics from an idle "
          "GPU: `--verbose` (and `--json`)._")


def detail(record: dict[str, Any], loop_by: dict[tuple[str, str, str], str]) -> list[str]:
    """``--verbose``'s part of the markdown: what the terminal report prints beyond the answer and the
    verdicts (the timeline per arm, each process's host mode, memory, the diagnostics from idle)."""
    summary = record["summary"]
    out = ["", "Detail:", ""]
    out += [f"- {line.strip()}" for line in timeline_lines(summary)]
    out += [f"- {line.strip()}" for line in host_mode_lines(summary)]
    out += [f"- free GPU memory after capture, {arm}: {s['free_mib_after_capture']:.0f} MiB; taken by the first "
            f"launch: " + ", ".join(f"bs {bs} {v:.0f} MiB" for bs, v in s["first_launch_mib"].items())
            for arm, s in summary["arms"].items()]
    return out + [f"- {line.strip()}" for line in diagnostic_lines(record, loop_by)]


def markdown(records: list[dict[str, Any]], verbose: bool = False) -> str:
    """The report in #775's shape, one section per model: the environment and command, #775's own
    table (ms a step and the gap per stream, per build), the upload in the decode loop, "GPU ms per
    decode step | tok/s" per build, the kernel-timeline bullets, then the cross-process verdicts, the
    diagnostics and the safety line."""
    out = []
    for record in records:
        env, summary = record["env"], record["summary"]
        cross_lines, loop_by = cross_verdicts(record)
        out += [f"### freetoken-graphfix bench --engine: {record['label']}", "",
                *(f"- **{line}**" if i == 0 else f"- {line}" for i, line in enumerate(headline(record))), "",
                "| | |", "|---|---|",
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
        out += [f"- {line}" for line in host_bound(summary)]
        out += [f"- **{line}**" for line in (*aa_lines(record), *cross_lines)]
        out += [f"- {line}" for line in safety_lines(record)]
        out += detail(record, loop_by) if verbose else ["", DETAIL]
        out += ["", f"_{REPORTERS_CHECK}._", ""]
    return "\n".join(out)
