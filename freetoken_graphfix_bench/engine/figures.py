"""``bench engine``'s figures, derived from a case's raw processes (``records.EngineCase``) by ``figures_of``.

Three kinds, in the order a verdict may rest on them:

- **In one process, in the decode loop** (``loop``): the upload itself (uploaded copies of a graph
  over never-uploaded ones) and each arm's own graph over its never-uploaded copies. Nothing that
  differs between processes can move them.
- **Across processes, in the decode loop**: each arm's own graph steps against the never-uploaded
  arm's. On the H200 a process's host side settles at one of a few speeds (host levels), whatever the
  build, and on a host-bound model that level sets the step's GPU time; so processes are grouped by
  their host ms per step (``stats.clusters``) and compared only within a level both arms have. Two
  arms that run the same never-uploaded graphs (the A/A pair) show how far processes of one build land
  apart: the noise floor no cross-process figure may claim to beat.
- **Diagnostics, from an idle GPU after the workload**: the graph replayed back to back, across
  processes and over its copies in its own process. A capture-time upload makes every executable of
  its process faster there on the H200, not in the decode loop, so these never decide a verdict.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..arms import ARMS, GATE, NO_UPLOAD, SKIP, UPSTREAM, aa_pair
from ..records import EngineCase, EngineProcess, Summary, TracedBs, TracedRun, largest_first
from ..stats import Ratio, cluster_of, clusters, geometric_mean, grouped_ratio, instance_medians, summary
from . import loop, process_checks
from .loop import LoopFigure

HOST_LEVEL_GAP = 0.25
"""Processes whose median host ms per decode step sit this far apart (relative to the median of all)
with none between are at different host levels. On the H200 the levels of a 16-layer llama were
0.20-0.27 and 0.37-0.42 ms: a gap of a third, where the spread within one over processes reached a
quarter."""

CROSS = (("step", "step_gpu_ms", "GPU time per decode step"),
         ("graph", "graph_gpu_ms", "GPU time of the graph step (GraphRunner.replay)"),
         ("replay", "replay_gpu_ms", "the graph replayed back to back from an idle GPU (a diagnostic)"))
IN_LOOP = ("step", "graph")  # the cross-process figures of the decode loop, which host levels apply to


@dataclass
class ProcessRow:
    """One process's medians per bs: host ms per decode step next to each cross-process figure."""

    round: int
    host_ms: dict[str, float]
    figures: dict[str, dict[str, float]]  # step, graph, replay -> bs -> median
    level: dict[str, int] = field(default_factory=dict)  # bs -> its host level


@dataclass(frozen=True)
class IdleFigure:
    """A diagnostic from idle over processes: the geometric mean of per-process ratios, its relative SE."""

    ratio: float
    se: float
    processes: int
    copies: int | None = None  # the upload's: copies of each kind per process


@dataclass(frozen=True)
class TimelineFigure:
    """One bs of an arm's kernel timeline, each figure ``(median, min, max)`` over its traced processes."""

    launches: tuple[float, float, float] | None
    graph_kernels: tuple[float, float, float] | None
    step_kernels: tuple[float, float, float] | None
    busy_us: tuple[float, float, float] | None
    streams: tuple[float, float, float] | None
    gap_us: dict[str, tuple[float, float, float]]
    gap_quantiles: dict[str, list[float]]


@dataclass(frozen=True)
class Timeline:
    processes: int
    note: str
    by_bs: dict[str, TimelineFigure] = field(default_factory=dict)


@dataclass
class ArmFigures:
    """One arm over its processes."""

    protected: bool
    errors: list[str]
    fires: int
    hashes: list[str]
    distinct_tokens: int | None
    reference: str
    same_tokens_as_reference: bool
    copies_tokens: str | None  # same, DIFF, or None where nothing could be compared
    waits: dict[str, list[int]]
    first_launch_ms: dict[str, float]
    upload_ms_per_graph: float
    capture_ms: float
    free_mib_after_capture: float
    first_launch_mib: dict[str, float]
    step_gpu_ms: dict[str, Summary]
    graph_ms: dict[str, float]
    processes: list[ProcessRow]
    own_in_loop: dict[str, dict[str, LoopFigure]]
    own_idle: dict[str, IdleFigure]
    timeline: Timeline
    tok_s: dict[str, float]
    cross: dict[str, dict[str, Ratio]] = field(default_factory=dict)  # figure -> bs -> against the base


@dataclass
class EngineFigures:
    """Every figure of one case, and the verdicts' inputs."""

    wait_case: bool  # the runs found the host-released WAIT in the decode graphs
    arms: dict[str, ArmFigures]
    base: str | None  # the never-uploaded arm every cross-process ratio is taken to
    reference: str  # whose tokens the protected arms must give
    host_levels: dict[str, list[float]]  # bs -> the levels' upper bounds
    aa_pair: tuple[str, str] | None
    aa: dict[str, dict[str, Ratio]]  # figure -> bs -> the A/A pair's second over its first
    upload_in_loop: dict[str, dict[str, LoopFigure]]
    control_in_loop: dict[str, dict[str, LoopFigure]]
    upload_idle: dict[str, IdleFigure]
    problems: dict[str, list[list[str]]]  # arm -> per process, what makes it no proof

    def aa_floor(self, name: str, bs: str) -> float | None:
        """How far the A/A pair came apart in figure ``name`` at ``bs``, with its band; ``None`` without one."""
        r = self.aa.get(name, {}).get(bs)
        if r is None or math.isnan(r.ratio):
            return None
        return abs(r.ratio - 1) + (0.0 if math.isnan(r.half) else r.half)


def median(values: list[float]) -> float:
    """The median, or NaN for no values: a missing figure must read as not measured, never raise."""
    return statistics.median(values) if values else math.nan


def own_steps(r: EngineProcess, key: str, bs: str) -> list[float]:
    """The process's ``key`` figures at ``bs`` from the steps that launched its own graph (the copies'
    steps are the in-process figures'); every step where the record has no executables."""
    values, labels = getattr(r, key).get(bs, []), r.step_exec.get(bs)
    if not labels or len(labels) != len(values):
        return values
    return [v for v, label in zip(values, labels, strict=True) if label == "own"]


def process_row(r: EngineProcess, round_: int) -> ProcessRow:
    """One process's medians per bs, the sample every cross-process figure and host level is drawn from."""
    figures = {name: {bs: median(v) if name == "replay" else median(own_steps(r, key, bs))
                      for bs, v in getattr(r, key).items() if v} for name, key, _ in CROSS}
    return ProcessRow(round_, {bs: median(v) for bs, v in r.step_host_ms.items()}, figures)


def host_levels(rows: dict[str, list[ProcessRow]]) -> dict[str, list[float]]:
    """Per bs (a phase of the workload), the upper bounds of the host levels every process's median
    host ms falls into (``stats.clusters``); and each row gets its level per bs."""
    values: dict[str, list[float]] = {}
    for row in (row for rs in rows.values() for row in rs):
        for bs, host in row.host_ms.items():
            if not math.isnan(host):
                values.setdefault(bs, []).append(host)
    bounds = {bs: clusters(v, HOST_LEVEL_GAP) for bs, v in values.items()}
    for row in (row for rs in rows.values() for row in rs):
        row.level = {bs: cluster_of(host, bounds[bs]) for bs, host in row.host_ms.items() if bs in bounds
                     and not math.isnan(host)}
    return bounds


def cross(arm: list[ProcessRow], base: list[ProcessRow], name: str, bs: str) -> Ratio:
    """``arm`` over ``base`` processes for figure ``name`` at ``bs``, compared within each host level
    both have (the decode loop's figures) or over all processes (the idle diagnostic)."""
    def grouped(rows: list[ProcessRow], level: int | None | str) -> list[float]:
        return [row.figures[name][bs] for row in rows if bs in row.figures[name]
                and not math.isnan(row.figures[name][bs]) and (level == "all" or row.level.get(bs) == level)]

    if name in IN_LOOP:
        # a record without host times (an early release's) has no levels: its processes are one group
        shared = {row.level.get(bs) for row in arm} & {row.level.get(bs) for row in base}
        return grouped_ratio([(grouped(arm, lv), grouped(base, lv)) for lv in shared])
    return grouped_ratio([(grouped(arm, "all"), grouped(base, "all"))])


def against_copies(r: EngineProcess) -> dict[str, tuple[float, float]]:
    """Per bs of one process, from idle: its engine graph and its uploaded copies, each over the mean
    of the never-uploaded copies of that graph (their medians)."""
    out = {}
    for bs, copied in r.copies_gpu_ms.items():
        if not copied.get("never") or not r.replay_gpu_ms.get(bs):
            continue
        never = statistics.fmean(instance_medians(copied["never"]))
        uploaded = instance_medians(copied.get("uploaded", []))
        out[bs] = (statistics.median(r.replay_gpu_ms[bs]) / never,
                   statistics.fmean(uploaded) / never if uploaded else math.nan)
    return out


def idle_upload(good: list[EngineProcess]) -> dict[str, IdleFigure]:
    """Per bs, the diagnostic from idle: uploaded copies over never-uploaded ones, every process of
    every arm one sample."""
    per_bs: dict[str, list[tuple[float, int]]] = {}
    for r in good:
        for bs, (_, uploaded) in against_copies(r).items():
            if not math.isnan(uploaded):
                per_bs.setdefault(bs, []).append((uploaded, len(r.copies_gpu_ms[bs]["never"])))
    return {bs: IdleFigure(*geometric_mean([u for u, _ in per_bs[bs]]), len(per_bs[bs]), min(n for _, n in per_bs[bs]))
            for bs in largest_first(per_bs)}


def idle_own(good: list[EngineProcess]) -> dict[str, IdleFigure]:
    """Per bs, the diagnostic from idle: the arm's own graph over the never-uploaded copies in its own
    processes."""
    per_bs: dict[str, list[float]] = {}
    for r in good:
        for bs, (own, _) in against_copies(r).items():
            per_bs.setdefault(bs, []).append(own)
    return {bs: IdleFigure(*geometric_mean(per_bs[bs]), len(per_bs[bs])) for bs in largest_first(per_bs)}


def spread(values: list[float | None]) -> tuple[float, float, float] | None:
    """Median, low and high of the values present: the shape every traced figure is reported in."""
    got = [v for v in values if v is not None]
    return (statistics.median(got), min(got), max(got)) if got else None


def timeline_figure(per: list[TracedBs]) -> TimelineFigure:
    """One bs over the traced processes that ran it: each figure's spread, the gaps per stream, the gap quantiles
    averaged stream by stream."""
    streams = sorted({s for f in per for s in f.gap_us}, key=lambda s: int(s[1:]))
    quantiles = {s: [statistics.fmean(q) for q in zip(*qs, strict=True)] for s in streams
                 if (qs := [f.gap_quantiles[s] for f in per if s in f.gap_quantiles])}
    return TimelineFigure(spread([f.launches for f in per]), spread([f.graph_kernels for f in per]),
                          spread([f.step_kernels for f in per]), spread([f.busy_us for f in per]),
                          spread([f.streams for f in per]),
                          {s: spread([f.gap_us[s] for f in per if s in f.gap_us]) for s in streams}, quantiles)


def timeline(traced: list[TracedRun]) -> Timeline:
    """The traced processes' kernel timelines per bs: each figure's median over processes with its range,
    the median gap per stream likewise; ``note`` says what ran."""
    ok = [t for t in traced if t.by_bs]
    notes = "; ".join(dict.fromkeys(t.note for t in traced if t.note and t not in ok))
    if not ok:
        return Timeline(0, notes or "not traced")
    by_bs = {bs: timeline_figure([t.by_bs[bs] for t in ok if bs in t.by_bs])
             for bs in largest_first(bs for t in ok for bs in t.by_bs)}
    return Timeline(len(ok), notes, by_bs)


def tokens_check(good: list[EngineProcess], traced: list[TracedRun]) -> str | None:
    """Whether every timed process (the copies launched in its decode loop) gave the tokens of this
    arm's traced processes (its own graphs only), request by request over the traced run's length:
    ``same``, ``DIFF``, or ``None`` when nothing can be compared (no traced run, an older record)."""
    refs = [t.token_ids for t in traced if t.token_ids]
    timed = [r.token_ids for r in good if r.token_ids]
    if not refs or not timed:
        return None
    same = all(len(a) == len(b) and all(x[:len(y)] == y for x, y in zip(a, b, strict=True))
               for a in timed for b in refs)
    return "same" if same else "DIFF"


def waits_captured(good: list[EngineProcess]) -> dict[str, list[int]]:
    """Per kind of WAIT, the counts captured into each process's graphs (every capture pass), distinct
    over the arm's processes: the PLE table's (``ple``) and the self-released ones the child counts
    (``cpu_moe``, ``locked_fetch``; a kind the FreeToken lacks, or a record from before they were
    counted, has none)."""
    kinds: dict[str, set[int]] = {"ple": {r.captured_waits for r in good}} if good else {}
    for r in good:
        for kind, n in r.self_released_waits.items():
            if n is not None:
                kinds.setdefault(kind, set()).add(n)
    return {kind: sorted(counts) for kind, counts in kinds.items()}


def upstream_protects(runs: dict[str, list[EngineProcess]]) -> bool:
    """Whether the FreeToken under test protects its graphs itself (0.2.x's ``_upload_graph``; 0.1.3
    has none, so there upstream is one more negative control and gate's tokens are the reference)."""
    good = [r for rs in runs.values() for r in rs if r.ok]
    return not good or any(r.freetoken_uploads for r in good)  # no run: nothing says otherwise


def is_protected(arm: str, wait_case: bool, reference: str) -> bool:
    """Whether ``arm`` must never block: every arm where no graph holds the WAIT; else a protecting arm, upstream
    only where it is the reference (0.2.x's own upload)."""
    return not wait_case or ARMS[arm].protected and (arm != UPSTREAM or reference == UPSTREAM)


def arm_errors(rs: list[EngineProcess], problems: list[list[str]]) -> list[str]:
    """Every process's error, then every problem that makes a process no proof."""
    return [r.error for r in rs if r.error is not None] + [p for ps in problems for p in ps]


def first_launch_ms(good: list[EngineProcess]) -> dict[str, float]:
    """Per bs, the slowest first launch over the processes."""
    sizes = good[0].first_launch_ms if good else {}
    return {bs: max(r.first_launch_ms[bs] for r in good) for bs in sizes}


def first_launch_mib(good: list[EngineProcess]) -> dict[str, float]:
    """Per bs, the device memory the first launch took (free before minus after), median over the processes."""
    sizes = good[0].first_launch_free_mib if good else {}
    taken = {bs: [r.first_launch_free_mib[bs][0] - r.first_launch_free_mib[bs][1] for r in good
                  if len(r.first_launch_free_mib.get(bs, [])) == 2] for bs in sizes}
    return {bs: median(values) for bs, values in taken.items()}


def step_gpu_ms(good: list[EngineProcess]) -> dict[str, Summary]:
    """Per bs, the quartiles of every decode step's GPU time over the processes (their own graphs' steps)."""
    sizes = largest_first(bs for r in good for bs in r.step_gpu_ms)
    return {bs: summary([x for r in good for x in own_steps(r, "step_gpu_ms", bs)], (25, 75)) for bs in sizes}


def graph_ms(rows: list[ProcessRow], sizes: Iterable[str]) -> dict[str, float]:
    """Per bs, the median over the processes of each one's own graph time."""
    return {bs: median([row.figures["graph"].get(bs, math.nan) for row in rows]) for bs in sizes}


def tok_s(steps: dict[str, Summary]) -> dict[str, float]:
    """Per bs, decode tokens a second at the median step."""
    return {bs: 1e3 * int(bs) / q.median for bs, q in steps.items() if q.n}


def arm_figures(arm: str, rs: list[EngineProcess], rows: list[ProcessRow], problems: list[list[str]],
                traced: list[TracedRun], wait_case: bool, reference: str, expected: set[str]) -> ArmFigures:
    """One arm over its processes (the cross-process ratios are added once the base is known)."""
    good = [r for r in rs if r.ok]
    hashes = {r.token_hash for r in good}
    steps = step_gpu_ms(good)
    return ArmFigures(
        protected=is_protected(arm, wait_case, reference), errors=arm_errors(rs, problems),
        fires=sum(len(r.fires) for r in good), hashes=sorted(hashes),
        distinct_tokens=min((r.distinct_tokens for r in good), default=None), reference=reference,
        same_tokens_as_reference=bool(expected) and hashes == expected,
        copies_tokens=tokens_check(good, traced), waits=waits_captured(good), first_launch_ms=first_launch_ms(good),
        upload_ms_per_graph=median([u for r in good for u in r.upload_ms]),
        capture_ms=median([sum(r.capture_ms) for r in good]),
        free_mib_after_capture=median([r.free_mib_after_capture for r in good]),
        first_launch_mib=first_launch_mib(good), step_gpu_ms=steps, graph_ms=graph_ms(rows, steps),
        processes=rows, own_in_loop=loop.in_loop(good, "own"), own_idle=idle_own(good), timeline=timeline(traced),
        tok_s=tok_s(steps))


def ratio_base(arms: dict[str, ArmFigures]) -> str | None:
    """The arm every ratio is taken to: the first never-uploaded (or unprotected) arm present."""
    return next((a for a in (NO_UPLOAD, SKIP, UPSTREAM) if a in arms and
                 (not arms[a].protected or ARMS[a].never_uploaded)), None)


def aa_figures(pair: tuple[str, str] | None, arms: dict[str, ArmFigures], rows: dict[str, list[ProcessRow]]
               ) -> dict[str, dict[str, Ratio]]:
    """The A/A control: the same cross-process ratios between two arms that run the same thing."""
    if not pair:
        return {}
    a, b = pair
    sizes = [bs for bs in arms[a].step_gpu_ms if bs in arms[b].step_gpu_ms]
    return {name: {bs: cross(rows[b], rows[a], name, bs) for bs in sizes} for name, _, _ in CROSS}


def figures_of(case: EngineCase) -> EngineFigures:
    """Every figure of ``case`` by the current rules, from its raw processes alone (so a saved record is
    judged again): which case the runs found, every process's problems, the arms, the upload in the
    decode loop, host levels, the A/A control and each arm's ratios to the never-uploaded arm."""
    runs, wait_case = case.runs, process_checks.wait_case_of(case.runs)
    problems = {arm: [process_checks.problems(arm, r, wait_case, case.expects_wait) for r in rs if r.ok]
                for arm, rs in runs.items()}
    reference = UPSTREAM if upstream_protects(runs) else GATE
    expected = {r.token_hash for r in runs.get(reference, []) if r.ok}
    rows = {arm: [process_row(r, i) for i, r in enumerate(rs) if r.ok] for arm, rs in runs.items()}
    levels = host_levels(rows)  # labels each row's host level, which the cross-process ratios pair within
    arms = {arm: arm_figures(arm, rs, rows[arm], problems[arm], case.traced.get(arm, []), wait_case, reference,
                             expected) for arm, rs in runs.items()}
    base = ratio_base(arms)
    for arm, s in arms.items():
        s.cross = {name: {bs: cross(rows[arm], rows[base], name, bs) for bs in s.step_gpu_ms}
                   for name, _, _ in CROSS} if base else {}
    pair = aa_pair(list(arms), wait_case)
    good = [r for rs in runs.values() for r in rs if r.ok]
    return EngineFigures(wait_case, arms, base, reference, levels, pair, aa_figures(pair, arms, rows),
                         loop.in_loop(good, "upload"), loop.in_loop(good, "control"), idle_upload(good), problems)
