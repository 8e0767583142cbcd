"""``bench rig``'s report, derived from its record's figures (``figures``): the table, the clusters the
instances fall into, the positive control, the verdict, ``--markdown`` and ``--plot``."""

from __future__ import annotations

import math
import statistics

from ..records import RigRecord
from ..stats import fisher_exact
from ..timeline import SHOWN_STREAMS
from ..verdicts import CANNOT, COSTS, FASTER, NO_COST, REPORTERS_CHECK, judged, pct, recovered, worst
from .figures import CONTROL, Row, rows

TAILS = {COSTS: "the upload COSTS this GPU replay time, up to {:+.2f}% (bs {}); auto avoids it where no graph "
                "needs protection",
         FASTER: "uploaded graphs replay FASTER on this GPU, by {:+.2f}% (bs {})",
         NO_COST: "no cost beyond ±0.5% on this GPU (95% interval within it)",
         CANNOT: "no cost this run can resolve (its interval reaches beyond ±0.5%: run with more --instances)"}


def row_pct(row: Row) -> str:
    """``+2.00% ± 0.12%``: the row's ratio to ``skip`` with the interval it is judged on, or ``n/a``."""
    return pct(row.to_skip.ratio, row.judging_width) if row.supported else "n/a"


def control_recovered(row: Row) -> bool:
    """Whether the positive control's known cost was read back within the row's band: without it the row's verdict
    stands for nothing."""
    return recovered(row.to_skip.ratio, row.to_skip.half, row.added, row.aa_floor)


def cluster_notes(table: list[Row]) -> list[str]:
    """One line per bs whose instances fall into several clusters: the counts per mode, and whether a
    mode falls into them in other proportions than ``skip`` does (which a within-cluster ratio hides)."""
    notes = []
    for bs in dict.fromkeys(r.bs for r in table):
        at = [r for r in table if r.bs == bs]
        if at[0].clusters < 2:
            continue
        counts = ", ".join(f"{r.arm} {'/'.join(map(str, r.cluster_counts))}" for r in at)
        line = (f"bs {bs}: the instances fall into {at[0].clusters} clusters (fastest first; a property of each "
                f"instance, not of time): {counts}")
        skip = next((r for r in at if r.arm == "skip"), None)
        if skip is not None and at[0].clusters == 2:
            odd = [r.arm for r in at if r is not skip and fisher_exact(*r.cluster_counts, *skip.cluster_counts) < 0.05]
            if odd:
                line += (f"; {', '.join(odd)} fall into them unlike skip (Fisher p < 0.05): that itself may be "
                         "a cost")
        notes.append(line)
    return notes


def control_line(table: list[Row]) -> str:
    """What the positive control recovered and, from the upload's interval, the smallest cost this run
    names; or that the record has no control (written before the bench ran one)."""
    controls = [r for r in table if r.arm == CONTROL]
    if not controls:
        return "positive control: not measured (it needs the skip mode; a record written before it has none)"
    read = ", ".join(f"bs {r.bs} {100 * r.added:+.2f}% added, read {row_pct(r)}" for r in controls)
    head = "positive control (a spin of known GPU time in a never-uploaded graph): "
    if not all(control_recovered(r) for r in controls):
        return f"{head}{read}: NOT recovered, so no verdict"
    ups = [r for r in table if r.arm == "upload" and r.supported]
    seen = f"; this run names any cost above +{100 * max(r.judging_width for r in ups):.2f}%" if ups else ""
    return f"{head}{read}: recovered{seen}"


def verdict(table: list[Row]) -> str:
    """One line that answers the user's question: does the upload cost this GPU anything? Judged as
    ``bench engine`` judges (``verdicts.judged``), and only where the positive control was recovered."""
    ups = [r for r in table if r.arm == "upload"]
    if not ups or not any(r.arm == "skip" for r in table):
        return "verdict: needs the upload and skip modes"
    if not all(r.supported for r in ups):
        return ("verdict: none: this run cannot support the upload/skip ratio (needs --instances 2 or more, "
                "and instances of both in one cluster)")
    missed = [r for r in table if r.arm == CONTROL and not control_recovered(r)]
    if missed:
        return (f"verdict: none: the positive control was not recovered (bs {missed[0].bs}: "
                f"{100 * missed[0].added:+.2f}% added, read {row_pct(missed[0])}), so this run could not have "
                "seen a cost of #775's size")
    words = {r.bs: judged(r.to_skip.ratio, r.to_skip.half, r.aa_floor) for r in ups}
    word = worst(list(words.values()))
    parts = ", ".join(f"bs {r.bs} {row_pct(r)}" for r in ups)
    if word in (COSTS, FASTER):
        hit = max((r for r in ups if words[r.bs] == word), key=lambda r: abs(r.to_skip.ratio - 1))
        tail = TAILS[word].format(100 * (hit.to_skip.ratio - 1), hit.bs)
    else:
        tail = TAILS.get(word, TAILS[CANNOT])  # within the A/A floor: the run cannot resolve it either
    return f"verdict: upload vs never uploaded (skip) replay: {parts} (95% intervals over instances): {tail}"


def stream_gaps(gaps_us: dict[str, list[float]]) -> str:
    """The median gap of each stream of the graph, in rank order (``s1`` first): ``0.38/0.41/0.40/0.39``.
    Past the first ``SHOWN_STREAMS`` only their count is shown (``--json`` keeps every one)."""
    ranked = [v for _, v in sorted(gaps_us.items(), key=lambda kv: int(kv[0][1:])) if v]
    medians = "/".join(f"{statistics.median(v):.2f}" for v in ranked[:SHOWN_STREAMS]) or "n/a"
    return medians + (f" +{len(ranked) - SHOWN_STREAMS}" if len(ranked) > SHOWN_STREAMS else "")


def _ratio(r: Row) -> str:
    """``1.0013 ± 0.0028`` (the 95% interval over instances, or the A/A floor where wider), or ``n/a``."""
    if r.arm == "skip":
        return "1 (base)"
    return f"{r.to_skip.ratio:.4f} ± {r.judging_width:.4f}" if r.supported else "n/a"


def render(record: RigRecord) -> str:
    """The rig's terminal report: the table per mode and bs, the clusters, the positive control, the verdict and what a
    waiting graph costs the PLE table."""
    env, cfg = record.env, record.config
    lines = [f"{env.gpu} | driver {env.driver} | torch {env.torch} | freetoken {env.freetoken} | {env.date}",
             f"graph: {cfg.kernels} kernels over {cfg.streams} streams, head WAIT "
             f"{'no' if cfg.no_wait else 'yes (real DiskRowTable)'}, H2D {'yes' if cfg.h2d else 'no'}, "
             f"bs {list(cfg.batch_sizes)}; {cfg.instances} graph instances per mode, {cfg.reps} interleaved "
             "replays each; times in µs (all instances pooled)",
             f"{'mode':9} {'bs':>3} {'action':9} {'median':>9} {'p10':>9} {'p90':>9} {'/skip ± 95%':>17} "
             f"{'spread':>7} {'gap µs s1/s2/s3/s4 +more':>28} {'1st launch ms':>14} {'hook ms':>8} {'logits':>7}"]
    shown: set[str] = set()
    table = rows(record)
    for r in table:
        gaps = ""
        if r.arm not in shown:  # once per mode: the gaps are traced at the largest bs only
            shown.add(r.arm)
            gaps = stream_gaps(record.arms[r.arm].gaps_us)
        blocked = f" BLOCKED {r.blocked}/{r.instances}" if r.blocked else ""
        lines.append(f"{r.arm:9} {r.bs:>3} {'/'.join(r.actions):9} {r.median:9.1f} {r.p10:9.1f} "
                     f"{r.p90:9.1f} {_ratio(r):>17} {100 * r.instance_spread:6.2f}% {gaps:>28} "
                     f"{r.first_launch_ms:>14.2f}{blocked} {r.hook_ms:8.2f} "
                     f"{'same' if r.logits_equal_upload else 'DIFF':>7}")
    lines.append("/skip: mean of the instances' medians over skip's, within the clusters the never-uploaded modes "
                 "fall into, ± the wider of its 95% interval and the A/A floor; spread: max - min "
                 "of the instances' medians over the pooled median; gap: median µs between consecutive kernels on "
                 "each stream of the graph (s1: the one with most kernels; +N: N more streams), traced at the "
                 "largest bs")
    lines += cluster_notes(table)
    lines.append(control_line(table))
    lines.append(verdict(table))
    lines.append(f"CUPTI: {record.gaps_note}")
    if not math.isnan(record.stager_us):
        lines.append(f"while a deferred graph awaits its first launch, the PLE table's stager adds "
                     f"{record.stager_us:.2f} µs a dispatch (other graphs' replays: nothing)")
    return "\n".join(lines)


def markdown(record: RigRecord) -> str:
    """A report to paste into an upstream thread, in #775's terms: GPU ms per step and the ratio."""
    env, cfg = record.env, record.config
    table = rows(record)
    out = ["### freetoken-graphfix bench rig: does the capture-time upload cost this GPU?", "",
           "| | |", "|---|---|",
           *(f"| {k} | {v} |" for k, v in (("GPU", env.gpu), ("driver", env.driver), ("torch", env.torch),
                                          ("FreeToken", env.freetoken), ("date", env.date),
                                          ("command", f"`{record.command or 'not recorded'}`"))),
           "", f"GPU time of one decode-like graph replay ({cfg.kernels} kernels over {cfg.streams} streams"
           f"{' behind a PLE wait-sync WAIT' if not cfg.no_wait else ''}), {cfg.instances} instances per "
           f"mode x {cfg.reps} interleaved replays; ratios ± their 95% interval over instances:", "",
           "| mode | bs | ms per step (median) | vs never uploaded (skip) |", "|---|---|---|---|",
           *(f"| {r.arm} | {r.bs} | {r.median / 1e3:.4f} | {_ratio(r)} |" for r in table), ""]
    out += [f"- {note}" for note in cluster_notes(table)]
    out += [f"- {control_line(table)}", "", f"**{verdict(table)}**", "", f"_{REPORTERS_CHECK}._", ""]
    return "\n".join(out)


def plot(record: RigRecord, path: str) -> str:
    """``--plot``: the CUPTI gaps per mode as box plots, the figure #775 argues from (offered only for a record
    that has them)."""
    import matplotlib  # present: bench refuses --plot up front without it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = {a: [g for v in r.gaps_us.values() for g in v] for a, r in record.arms.items() if r.gaps_us}
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.boxplot(list(arms.values()), showfliers=False)
    ax.set_xticks(range(1, len(arms) + 1), list(arms))
    ax.set_ylabel("inter-kernel gap per stream (µs)")
    ax.set_title(f"{record.env.gpu}, driver {record.env.driver}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return f"wrote {path}"
