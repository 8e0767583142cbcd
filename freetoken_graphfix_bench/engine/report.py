"""``bench engine``'s report of a case, the terminal's and ``--markdown``'s (#775's own shape): the
headline first (``headline``), then the environment, the arms' table and the sections (``sections``)."""

from __future__ import annotations

import math

from ..records import EngineCase, largest_first
from ..timeline import first_streams
from ..verdicts import REPORTERS_CHECK
from . import sections
from .figures import EngineFigures
from .headline import answer, failures, safety

WAIT_KINDS = {"ple": "PLE table", "cpu_moe": "CPU-MoE executor", "locked_fetch": "locked fetch"}
DETAIL = ("_The kernel timeline per arm, every process's host level and memory and the diagnostics from an idle "
          "GPU: `--verbose` (and `--json`)._")


def case_line(figures: EngineFigures) -> str:
    """What the case means for the arms, in one line: whether the never-uploaded arms are a negative control or must be
    no-ops."""
    if figures.wait_case:
        return ("its decode graphs hold a WAIT the host releases after the launch (PLE wait-sync): the "
                "never-uploaded arms are the negative control, and may block")
    return ("no decode graph holds a WAIT the host releases after the launch: nothing needs protection, every "
            "shim arm is a no-op, and every arm must give upstream's tokens")


def freetoken_of(case: EngineCase) -> str:
    """The FreeToken version the arms ran, as the first process that ran says it."""
    return next((r.freetoken for rs in case.runs.values() for r in rs if r.ok and r.freetoken), "?")


def env_of(case: EngineCase) -> tuple[str, str, str, str]:
    """GPU, driver, torch and date, or ``?`` each for a record that kept none."""
    env = case.env
    return (env.gpu, env.driver, env.torch, env.date) if env else ("?", "?", "?", "?")


def header(case: EngineCase, figures: EngineFigures) -> list[str]:
    """The report's first lines: environment, model, workload and case, so a pasted report says what it measured."""
    gpu, driver, torch, day = env_of(case)
    ft = freetoken_of(case) + ("; patched arm: patches/ applied" if "patched" in figures.arms else "")
    return [f"{gpu} | driver {driver} | torch {torch} | freetoken {ft} | {day}",
            f"model: {case.model}" + (f"; FreeToken options: {' '.join(case.ft_args)}" if case.ft_args else ""),
            f"workload: copy a text verbatim from a {case.context}-token context, greedy, "
            f"{case.decode_steps} decode steps per request, bs 2 (two requests) then bs 1; {case.rounds} "
            "round(s), a process per arm per round, in rotated order",
            f"case: {case_line(figures)}"]


def fmt_ms(per_bs: dict[str, float]) -> str:
    """Figures per bs in the workload's order (largest first), two decimals."""
    return " ".join(f"{per_bs[bs]:.2f}" for bs in largest_first(per_bs))


def arm_table(figures: EngineFigures) -> list[str]:
    """One row per arm of what safety is judged on: watchdog fires, first launches, upload and capture time, memory,
    tokens; each process error under it."""
    lines = [f"{'arm':14} {'fires':>5} {'1st launch ms':>14} {'upload ms/graph':>15} {'capture ms':>10} "
             f"{'free MiB':>9} {'1st-launch MiB':>14} {'tokens':>17} {'distinct':>8} {'copies':>6}"]
    for arm, s in figures.arms.items():
        compared = arm == s.reference or s.same_tokens_as_reference or s.reference not in figures.arms
        tokens = ",".join(s.hashes) + ("" if compared else " DIFF")
        mib = " ".join(f"{v:.0f}" for v in s.first_launch_mib.values())
        lines.append(f"{arm:14} {s.fires:>5} {fmt_ms(s.first_launch_ms):>14} {s.upload_ms_per_graph:>15.2f} "
                     f"{s.capture_ms:>10.1f} {s.free_mib_after_capture:>9.0f} {mib:>14} {tokens:>17} "
                     f"{s.distinct_tokens if s.distinct_tokens is not None else '-':>8} "
                     f"{s.copies_tokens or '-':>6}")
        lines += [f"{'':15}! {e}" for e in s.errors]
    lines.append("free MiB: free GPU memory after capture; 1st-launch MiB: taken by each graph's first launch; "
                 "copies: the decode loop with copies gave the tokens of the arm's traced run (its own graphs only)")
    return lines


def waits_line(figures: EngineFigures) -> list[str]:
    """The WAITs captured into each process's graphs, per kind, where the graphs held self-released
    ones (FreeToken's own threads release them; the shim never sees them and must decide as without)."""
    per_arm = {arm: s.waits for arm, s in figures.arms.items()}
    if not any(n for w in per_arm.values() for kind, counts in w.items() if kind != "ple" for n in counts):
        return []

    def counts(w: dict[str, list[int]]) -> str:
        return ", ".join(f"{WAIT_KINDS.get(k, k)} {'/'.join(map(str, n))}" for k, n in w.items())

    shown = {counts(w) for w in per_arm.values()}
    body = f"every arm: {shown.pop()}" if len(shown) == 1 else "; ".join(
        f"{arm}: {counts(w)}" for arm, w in per_arm.items())
    return [f"WAITs captured per process (every graph and capture pass): {body} (CPU-MoE and locked-fetch WAITs "
            "are released by FreeToken's own threads: the shim never sees them)"]


def safety_lines(figures: EngineFigures) -> list[str]:
    """The negative control's outcome and the safety verdict, for the detail (the answer has the verdict already)."""
    controls = [a for a, s in figures.arms.items() if not s.protected]
    lines = []
    if controls:
        lines.append("negative control (never uploaded): " + ", ".join(
            f"{a} {'BLOCKED (watchdog fired)' if figures.arms[a].fires else 'never blocked at this size'}"
            for a in controls))
    return lines + [safety(figures, failures(figures)).split(" (negative control:")[0]]


def render(case: EngineCase, figures: EngineFigures) -> str:
    """The terminal report of one case."""
    cross_lines, loop_by = sections.cross_verdicts(figures)
    lines = [*answer(figures), "", *header(case, figures), *arm_table(figures), *waits_line(figures),
             *sections.in_loop_lines(figures), *sections.timeline_lines(figures), *sections.host_level_lines(figures),
             *sections.cross_table(figures), *sections.aa_lines(figures), *cross_lines, *sections.host_bound(figures),
             *sections.diagnostic_lines(figures, loop_by), *safety_lines(figures)]
    return "\n".join(lines)


def table_775(figures: EngineFigures) -> list[str]:
    """#775's own table, to paste into the issue: per build and bs, GPU ms per decode step and the
    median inter-kernel gap on each stream of the decode graph (the first four, from the traced
    processes; "not traced" where none ran)."""
    out = ["| build | bs | GPU ms per decode step | median gap between kernels per stream, µs (traced) |",
           "|---|---|---|---|"]
    for arm, s in figures.arms.items():
        for bs, q in s.step_gpu_ms.items():
            f = s.timeline.by_bs.get(bs)
            gaps = {name: g[0] for name, g in f.gap_us.items() if g} if f else {}
            out.append(f"| {arm} | {bs} | {q.median:.3f} | {first_streams(gaps) or 'not traced'} |")
    return out


def verbose_lines(figures: EngineFigures, loop_by: dict[tuple[str, str, str], str]) -> list[str]:
    """``--verbose``'s part of the markdown: what the terminal report prints beyond the answer and the
    verdicts (the timeline per arm, each process's host level, memory, the diagnostics from idle)."""
    out = ["", "Detail:", ""]
    out += [f"- {line.strip()}" for line in sections.timeline_lines(figures)]
    out += [f"- {line.strip()}" for line in sections.host_level_lines(figures)]
    out += [f"- free GPU memory after capture, {arm}: {s.free_mib_after_capture:.0f} MiB; taken by the first "
            f"launch: " + ", ".join(f"bs {bs} {v:.0f} MiB" for bs, v in s.first_launch_mib.items())
            for arm, s in figures.arms.items()]
    return out + [f"- {line.strip()}" for line in sections.diagnostic_lines(figures, loop_by)]


def markdown_case(case: EngineCase, figures: EngineFigures, verbose: bool) -> list[str]:
    """One case in #775's shape: the answer, the environment and command, #775's own table, the upload in
    the decode loop, "GPU ms per decode step | tok/s" per build, the verdicts and the safety line."""
    gpu, driver, torch, day = env_of(case)
    cross_lines, loop_by = sections.cross_verdicts(figures)
    out = [f"### freetoken-graphfix bench engine: {case.label}", "",
           *(f"- **{line}**" if i == 0 else f"- {line}" for i, line in enumerate(answer(figures))), "",
           "| | |", "|---|---|",
           *(f"| {k} | {v} |" for k, v in (
               ("GPU", gpu), ("driver", driver), ("torch", torch), ("FreeToken", freetoken_of(case)),
               ("model", case.model),
               ("workload", f"{case.context}-token context, greedy, {case.decode_steps} decode steps, bs 2 then bs 1, "
                            f"{case.rounds} rounds"),
               ("date", day), ("command", f"`{case.command or 'not recorded'}`"))),
           "", *table_775(figures), "", f"Case: {case_line(figures)}.", ""]
    out += [f"**{line.strip()}**" if i == 0 else f"- {line.strip()}"
            for i, line in enumerate(sections.in_loop_lines(figures))]
    out += ["", "| build | bs | GPU ms per decode step | tok/s | vs never uploaded, within host levels (95%) | "
            "graph step vs never uploaded | replayed from idle vs never uploaded (diagnostic) |",
            "|---|---|---|---|---|---|---|"]
    for arm, s in figures.arms.items():
        for bs, q in s.step_gpu_ms.items():
            out.append(f"| {arm} | {bs} | {q.median:.3f} | {s.tok_s.get(bs, math.nan):.1f} | "
                       + " | ".join(sections.cross_cells(s, arm == figures.base, bs)) + " |")
    out.append("")
    out += [f"- {line}" for line in waits_line(figures)]
    out += [f"- {line}" for line in sections.host_bound(figures)]
    out += [f"- **{line}**" for line in (*sections.aa_lines(figures), *cross_lines)]
    out += [f"- {line}" for line in safety_lines(figures)]
    out += verbose_lines(figures, loop_by) if verbose else ["", DETAIL]
    return out + ["", f"_{REPORTERS_CHECK}._", ""]
