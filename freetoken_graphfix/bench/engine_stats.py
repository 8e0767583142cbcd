"""``bench --engine``'s figures, derived from its processes' raw results (``engine.judge``).

Three kinds, in the order a verdict may rest on them:

- **In one process, in the decode loop** (``loop``): the upload itself (uploaded copies of a graph
  over never-uploaded ones) and each arm's own graph over its never-uploaded copies. Nothing that
  differs between processes can move them.
- **Across processes, in the decode loop**: each arm's own graph steps against the never-uploaded
  arm's. On the H200 a process's host side settles in one of a few speeds (host modes), whatever the
  build, and on a host-bound model that mode sets the step's GPU time; so processes are grouped by
  their host ms per step (``stats.modes``, as the rig groups instances) and compared only within a
  mode both arms have. Two arms that run the same never-uploaded graphs (the A/A pair) show how far
  processes of one build land apart: the noise floor no cross-process figure may claim to beat.
- **Diagnostics, from an idle GPU after the workload**: the graph replayed back to back, across
  processes and over its copies in its own process. A capture-time upload makes every executable of
  its process faster there on the H200, not in the decode loop, so these never decide a verdict.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from . import loop
from .arms import GATE, NEVER_UPLOADED, PROTECTED
from .stats import geometric_mean, grouped_ratio, instance_medians, mode_of, modes, summary

HOST_MODE_GAP = 0.25
"""Processes whose median host ms per decode step sit this far apart (relative to the median of all)
with none between are in different host modes. On the H200 the modes of a 16-layer llama were 0.20-0.27
and 0.37-0.42 ms: a gap of a third, where the spread within a mode over processes reached a quarter."""

CROSS = (("step", "step_gpu_ms", "GPU time per decode step"),
         ("graph", "graph_gpu_ms", "GPU time of the graph step (GraphRunner.replay)"),
         ("replay", "replay_gpu_ms", "the graph replayed back to back from an idle GPU (a diagnostic)"))
IN_LOOP = ("step", "graph")  # the cross-process figures of the decode loop, which host modes apply to

AA_PAIRS = {  # two arms whose decode graphs are the same and never uploaded, per case
    False: [("pre-697", other) for other in ("auto", "skip", "deferred", "warm", "patched")] + [("auto", "deferred")],
    True: [("pre-697", "skip"), ("auto", "deferred")],
}


def median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def own_steps(r: dict[str, Any], key: str, bs: str) -> list[float]:
    """The process's ``key`` figures at ``bs`` from the steps that launched its own graph (the copies'
    steps are the in-process figures'); every step where the record has no executables."""
    values, labels = r.get(key, {}).get(bs, []), r.get("step_exec", {}).get(bs)
    if not labels or len(labels) != len(values):
        return values
    return [v for v, label in zip(values, labels, strict=True) if label == "own"]


def process_row(r: dict[str, Any], round_: int) -> dict[str, Any]:
    """One process's medians per bs: host ms per decode step next to each cross-process figure."""
    row: dict[str, Any] = {"round": round_, "host_ms": {bs: median(v) for bs, v in r.get("step_host_ms", {}).items()}}
    for name, key, _ in CROSS:
        row[name] = {bs: median(v) if name == "replay" else median(own_steps(r, key, bs))
                     for bs, v in r.get(key, {}).items() if v}
    return row


def host_modes(rows: dict[str, list[dict[str, Any]]]) -> dict[str, list[float]]:
    """Per bs (a phase of the workload), the upper bounds of the host modes every process's median
    host ms falls into (``stats.modes``); and each row gets its mode per bs (``mode``)."""
    values: dict[str, list[float]] = {}
    for rs in rows.values():
        for row in rs:
            for bs, host in row["host_ms"].items():
                if not math.isnan(host):
                    values.setdefault(bs, []).append(host)
    bounds = {bs: modes(v, HOST_MODE_GAP) for bs, v in values.items()}
    for rs in rows.values():
        for row in rs:
            row["mode"] = {bs: mode_of(host, bounds[bs]) for bs, host in row["host_ms"].items() if bs in bounds
                           and not math.isnan(host)}
    return bounds


def cross(arm: list[dict[str, Any]], base: list[dict[str, Any]], name: str, bs: str) -> list[float]:
    """``arm`` over ``base`` processes for figure ``name`` at ``bs``: [ratio, relative SE, degrees of
    freedom], compared within each host mode both have (the decode loop's figures) or over all
    processes (the idle diagnostic); nan where no mode holds enough of both."""
    def grouped(rows: list[dict[str, Any]], mode: int | None | str) -> list[float]:
        return [row[name][bs] for row in rows if bs in row[name] and not math.isnan(row[name][bs])
                and (mode == "all" or row["mode"].get(bs) == mode)]

    if name in IN_LOOP:
        # a record without host times (an early release's) has no modes: its processes are one group
        shared = {row["mode"].get(bs) for row in arm} & {row["mode"].get(bs) for row in base}
        groups = [(grouped(arm, m), grouped(base, m)) for m in shared]
    else:
        groups = [(grouped(arm, "all"), grouped(base, "all"))]
    return list(grouped_ratio(groups))


def against_copies(r: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Per bs of one process, from idle: its engine graph and its uploaded copies, each over the mean
    of the never-uploaded copies of that graph (their medians)."""
    out = {}
    for bs, copied in r.get("copies_gpu_ms", {}).items():
        if not copied.get("never") or not r.get("replay_gpu_ms", {}).get(bs):
            continue
        never = statistics.fmean(instance_medians(copied["never"]))
        uploaded = instance_medians(copied.get("uploaded", []))
        out[bs] = (statistics.median(r["replay_gpu_ms"][bs]) / never,
                   statistics.fmean(uploaded) / never if uploaded else math.nan)
    return out


def idle_upload(runs: dict[str, list[dict[str, Any]]]) -> dict[str, list[float]]:
    """Per bs, the diagnostic from idle: uploaded copies over never-uploaded ones, every process of
    every arm one sample: [geometric mean, its relative SE, processes, copies of each kind]."""
    per_bs: dict[str, list[tuple[float, int]]] = {}
    for r in (r for rs in runs.values() for r in rs if "error" not in r):
        for bs, (_, uploaded) in against_copies(r).items():
            if not math.isnan(uploaded):
                per_bs.setdefault(bs, []).append((uploaded, len(r["copies_gpu_ms"][bs]["never"])))
    return {bs: [*geometric_mean([u for u, _ in per_bs[bs]]), len(per_bs[bs]), min(n for _, n in per_bs[bs])]
            for bs in sorted(per_bs, key=lambda bs: -int(bs))}


def idle_own(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per bs, the diagnostic from idle: the arm's own graph over the never-uploaded copies in its own
    processes, [geometric mean, relative SE, processes]."""
    per_bs: dict[str, list[float]] = {}
    for r in runs:
        for bs, (own, _) in against_copies(r).items():
            per_bs.setdefault(bs, []).append(own)
    return {bs: [*geometric_mean(v), len(v)] for bs, v in sorted(per_bs.items(), key=lambda kv: -int(kv[0]))}


def timeline(traced: list[dict[str, Any]]) -> dict[str, Any]:
    """The traced processes' kernel timelines per bs: each figure's median over processes with its
    range (``[median, min, max]``), the median gap per stream likewise; ``note`` says what ran."""
    ok = [t for t in traced if any(k.isdigit() for k in t)]
    notes = [t["note"] for t in traced if "note" in t and t not in ok]
    out: dict[str, Any] = {"processes": len(ok), "note": "; ".join(dict.fromkeys(notes))}
    if not ok:
        out["note"] = out["note"] or "not traced"
        return out
    sizes = sorted({bs for t in ok for bs in t if bs.isdigit()}, key=lambda bs: -int(bs))

    def spread(values: list[float | None]) -> list[float] | None:
        got = [v for v in values if v is not None]
        return [statistics.median(got), min(got), max(got)] if got else None

    for bs in sizes:
        per = [t[bs] for t in ok if bs in t]
        streams = sorted({s for f in per for s in f["gap_us"]}, key=lambda s: int(s[1:]))
        out[bs] = {key: spread([f.get(key) for f in per])
                   for key in ("graph_kernels", "step_kernels", "busy_us", "streams", "launches")}
        out[bs]["gap_us"] = {s: spread([f["gap_us"][s]["median"] for f in per if s in f["gap_us"]]) for s in streams}
        out[bs]["gap_quantiles"] = {s: [statistics.fmean(q) for q in zip(*qs, strict=True)]
                                    for s in streams
                                    if (qs := [f["gap_quantiles"][s] for f in per if s in f.get("gap_quantiles", {})])}
    return out


def tokens_check(runs: list[dict[str, Any]], traced: list[dict[str, Any]]) -> str | None:
    """Whether every timed process (the copies launched in its decode loop) gave the tokens of this
    arm's traced processes (its own graphs only), request by request over the traced run's length:
    ``same``, ``DIFF``, or ``None`` when nothing can be compared (no traced run, an older record)."""
    refs = [t["token_ids"] for t in traced if t.get("token_ids")]
    timed = [r["token_ids"] for r in runs if r.get("token_ids")]
    if not refs or not timed:
        return None
    same = all(len(a) == len(b) and all(x[:len(y)] == y for x, y in zip(a, b, strict=True))
               for a in timed for b in refs)
    return "same" if same else "DIFF"


def waits_captured(runs: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Per kind of WAIT, the counts captured into each process's graphs (every capture pass), distinct
    over the arm's processes: the PLE table's (``ple``) and the self-released ones the child counts
    (``cpu_moe``, ``locked_fetch``; a kind the FreeToken lacks, or a record from before they were
    counted, has none)."""
    kinds: dict[str, set[int]] = {"ple": {r["captured_waits"] for r in runs}} if runs else {}
    for r in runs:
        for kind, n in (r.get("self_released_waits") or {}).items():
            if n is not None:
                kinds.setdefault(kind, set()).add(n)
    return {kind: sorted(counts) for kind, counts in kinds.items()}


def upstream_protects(runs: dict[str, list[dict[str, Any]]]) -> bool:
    """Whether the FreeToken under test protects its graphs itself (0.2.x's ``_upload_graph``; 0.1.3
    has none, so there upstream is one more negative control and gate's tokens are the reference)."""
    good = [r for rs in runs.values() for r in rs if "error" not in r]
    return not good or any(r.get("freetoken_uploads", True) for r in good)  # no run: nothing says otherwise


def aa_pair(arms: list[str], wait_case: bool) -> tuple[str, str] | None:
    """The A/A control among ``arms``: two arms whose decode graphs are identical and never uploaded
    (without a host-released WAIT every shim arm is a no-op, like pre-697; with one, pre-697 and skip
    leave it exposed alike, auto and deferred defer it alike)."""
    return next((pair for pair in AA_PAIRS[wait_case] if pair[0] in arms and pair[1] in arms), None)


def summarise(runs: dict[str, list[dict[str, Any]]], traced: dict[str, list[dict[str, Any]]],
              wait_case: bool) -> dict[str, Any]:
    """Per arm over its processes, and the run's own figures: the upload in the decode loop, host
    modes, the A/A control and each arm's ratios to the never-uploaded arm."""
    arms: dict[str, Any] = {}
    reference = "upstream" if upstream_protects(runs) else GATE
    expected = {r["token_hash"] for r in runs.get(reference, []) if "error" not in r}
    rows = {arm: [process_row(r, i) for i, r in enumerate(rs) if "error" not in r] for arm, rs in runs.items()}
    bounds = host_modes(rows)
    for arm, rs in runs.items():
        good = [r for r in rs if "error" not in r]
        steps = {bs: [x for r in good for x in own_steps(r, "step_gpu_ms", bs)]
                 for bs in sorted({bs for r in good for bs in r["step_gpu_ms"]}, key=lambda bs: -int(bs))}
        arms[arm] = {
            "protected": not wait_case or arm in PROTECTED or (arm == "upstream" and reference == "upstream"),
            "errors": [r["error"] for r in rs if "error" in r] + [p for r in good for p in r.get("problems", [])],
            "fires": sum(len(r["fires"]) for r in good),
            "hashes": sorted({r["token_hash"] for r in good}),
            "distinct_tokens": min((r["distinct_tokens"] for r in good), default=None),
            "reference": reference,
            "same_tokens_as_reference": bool(expected) and {r["token_hash"] for r in good} == expected,
            "copies_tokens": tokens_check(good, traced.get(arm, [])),
            "waits": waits_captured(good),
            "first_launch_ms": {bs: max(r["first_launch_ms"][bs] for r in good) for bs in
                                (good[0]["first_launch_ms"] if good else {})},
            "upload_ms_per_graph": median([u for r in good for u in r["upload_ms"]]),
            "capture_ms": median([sum(r["capture_ms"]) for r in good]),
            "free_mib_after_capture": median([r["free_mib_after_capture"] for r in good]),
            "first_launch_mib": {bs: median([r["first_launch_free_mib"][bs][0] - r["first_launch_free_mib"][bs][1]
                                             for r in good if len(r["first_launch_free_mib"].get(bs, [])) == 2])
                                 for bs in (good[0]["first_launch_free_mib"] if good else {})},
            "step_gpu_ms": {bs: summary(v, (25, 75)) for bs, v in steps.items()},
            "graph_ms": {bs: median([row["graph"].get(bs, math.nan) for row in rows[arm]]) for bs in steps},
            "processes": rows[arm],
            "own_in_loop": loop.in_loop(good, "own"),
            "own_idle": idle_own(good),
            "timeline": timeline(traced.get(arm, [])),
        }
        arms[arm]["tok_s"] = {bs: 1e3 * int(bs) / q["median"] for bs, q in arms[arm]["step_gpu_ms"].items()
                              if q["n"]}
    base = next((a for a in (*NEVER_UPLOADED, "upstream") if a in arms and
                 (not arms[a]["protected"] or a in NEVER_UPLOADED)), None)
    for arm, s in arms.items():
        s["base"] = base
        s["cross"] = {name: {bs: cross(rows[arm], rows[base], name, bs) for bs in s["step_gpu_ms"]}
                      for name, _, _ in CROSS} if base else {}
    pair = aa_pair(list(arms), wait_case)
    aa: dict[str, Any] = {"pair": list(pair) if pair else None, "figures": {}}
    if pair:
        a, b = pair
        sizes = [bs for bs in arms[a]["step_gpu_ms"] if bs in arms[b]["step_gpu_ms"]]
        aa["figures"] = {name: {bs: cross(rows[b], rows[a], name, bs) for bs in sizes} for name, _, _ in CROSS}
    good_runs = [r for rs in runs.values() for r in rs if "error" not in r]
    return {"arms": arms, "base": base, "reference": reference, "host_modes": bounds, "aa": aa,
            "upload_in_loop": loop.in_loop(good_runs, "upload"), "control_in_loop": loop.in_loop(good_runs, "control"),
            "upload_idle": idle_upload(runs)}
