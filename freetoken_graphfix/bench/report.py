"""The replay benchmark's table and plot, derived from its raw record (``replay.run_arms``)."""

from __future__ import annotations

import statistics
from typing import Any

from .cupti import SHOWN_STREAMS
from .stats import control_line, judging_width, mode_notes, rows, supported, verdict
from .verdicts import REPORTERS_CHECK


def stream_gaps(gaps_us: dict[str, list[float]]) -> str:
    """The median gap of each stream of the graph, in rank order (``s1`` first): ``0.38/0.41/0.40/0.39``.
    Past the first ``SHOWN_STREAMS`` only their count is shown (``--json`` keeps every one)."""
    ranked = [v for _, v in sorted(gaps_us.items(), key=lambda kv: int(kv[0][1:])) if v]
    medians = "/".join(f"{statistics.median(v):.2f}" for v in ranked[:SHOWN_STREAMS]) or "n/a"
    return medians + (f" +{len(ranked) - SHOWN_STREAMS}" if len(ranked) > SHOWN_STREAMS else "")


def _ratio(r: dict[str, Any]) -> str:
    """``1.0013 ± 0.0028`` (the 95% interval over instances, or the A/A floor where wider), or ``n/a``."""
    if r["arm"] == "skip":
        return "1 (base)"
    return f"{r['ratio_skip']:.4f} ± {judging_width(r):.4f}" if supported(r) else "n/a"


def render(record: dict[str, Any]) -> str:
    env, cfg = record["env"], record["config"]
    lines = [f"{env['gpu']} | driver {env['driver']} | torch {env['torch']} | freetoken {env['freetoken']} | "
             f"{env['date']}",
             f"graph: {cfg['kernels']} kernels over {cfg['streams']} streams, head WAIT "
             f"{'no' if cfg['no_wait'] else 'yes (real DiskRowTable)'}, H2D {'yes' if cfg['h2d'] else 'no'}, "
             f"bs {cfg['batch_sizes']}; {cfg['instances']} graph instances per strategy, {cfg['reps']} interleaved "
             "replays each; times in µs (all instances pooled)",
             f"{'strategy':9} {'bs':>3} {'action':9} {'median':>9} {'p10':>9} {'p90':>9} {'/skip ± 95%':>17} "
             f"{'spread':>7} {'gap µs s1/s2/s3/s4 +more':>28} {'1st launch ms':>14} {'hook ms':>8} {'logits':>7}"]
    shown: set[str] = set()
    table = rows(record)
    for r in table:
        gaps = ""
        if r["arm"] not in shown:  # once per strategy: the gaps are traced at the largest bs only
            shown.add(r["arm"])
            gaps = stream_gaps(record["arms"][r["arm"]]["gaps_us"])
        blocked = f" BLOCKED {r['blocked']}/{r['instances']}" if r["blocked"] else ""
        lines.append(f"{r['arm']:9} {r['bs']:>3} {'/'.join(r['actions']):9} {r['median']:9.1f} {r['p10']:9.1f} "
                     f"{r['p90']:9.1f} {_ratio(r):>17} {100 * r['instance_spread']:6.2f}% {gaps:>28} "
                     f"{r['first_launch_ms']:>14.2f}{blocked} {r['hook_ms']:8.2f} "
                     f"{'same' if r['logits_equal_upload'] else 'DIFF':>7}")
    lines.append("/skip: mean of the instances' medians over skip's, within the modes the never-uploaded arms fall "
                 "into, ± the wider of its 95% interval and the A/A floor; spread: max - min "
                 "of the instances' medians over the pooled median; gap: median µs between consecutive kernels on "
                 "each stream of the graph (s1: the one with most kernels; +N: N more streams), traced at the "
                 "largest bs")
    lines += mode_notes(table)
    lines.append(control_line(table))
    lines.append(verdict(table))
    lines.append(f"CUPTI: {record.get('gaps_note', 'n/a')}")
    ho = record.get("host_overhead")
    if ho:
        st = ho["step_host_us"]
        lines.append(f"host time per decode step (forward_host_ctx + replay, median µs): shim installed "
                     f"{st['shim installed']['median']:.1f}, uninstalled {st['shim uninstalled']['median']:.1f}, "
                     f"ratio {ho['ratio']:.4f}; while a deferred graph awaits its first launch the PLE table's "
                     f"stager adds {ho['armed_hook_us']:.2f} µs a dispatch (other graphs' replays: nothing)")
    return "\n".join(lines)


def markdown(record: dict[str, Any]) -> str:
    """A report to paste into an upstream thread, in #775's terms: GPU ms per step and the ratio."""
    env, cfg = record["env"], record["config"]
    table = rows(record)
    out = ["### freetoken-graphfix bench: does the capture-time upload cost this GPU?", "",
           "| | |", "|---|---|",
           *(f"| {k} | {v} |" for k, v in (("GPU", env["gpu"]), ("driver", env["driver"]), ("torch", env["torch"]),
                                          ("FreeToken", env["freetoken"]), ("date", env["date"]),
                                          ("command", f"`{record.get('command', 'not recorded')}`"))),
           "", f"GPU time of one decode-like graph replay ({cfg['kernels']} kernels over {cfg['streams']} streams"
           f"{' behind a PLE wait-sync WAIT' if not cfg['no_wait'] else ''}), {cfg['instances']} instances per "
           f"strategy x {cfg['reps']} interleaved replays; ratios ± their 95% interval over instances:", "",
           "| strategy | bs | ms per step (median) | vs never uploaded (skip) |", "|---|---|---|---|",
           *(f"| {r['arm']} | {r['bs']} | {r['median'] / 1e3:.4f} | {_ratio(r)} |" for r in table), ""]
    out += [f"- {note}" for note in mode_notes(table)]
    out += [f"- {control_line(table)}", "", f"**{verdict(table)}**", "", f"_{REPORTERS_CHECK}._", ""]
    return "\n".join(out)


def plot(record: dict[str, Any], path: str) -> str:
    import matplotlib  # present: bench refuses --plot up front without it (cli.plot_missing)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
