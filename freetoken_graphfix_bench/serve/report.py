"""``bench serve``'s verdicts and report, derived from a case's raw runs (``records.ServeCase``): which
case the servers found, each arm's problems, the latency table and the safety line."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from freetoken_graphfix.decide import NO_WAIT
from freetoken_graphfix.detect import PLE_KIND

from ..arms import ARMS, UPSTREAM
from ..records import ServeCase, ServeRun
from ..workload import SINGLE

NEGATIVE = tuple(n for n, a in ARMS.items() if a.in_serve and not a.protected)  # with a WAIT: the first decode hangs
REQUESTS = 12  # single x2 and the pair x2, before and after the rebuild


@dataclass(frozen=True)
class Latency:
    ttft_ms: float  # the slower of the batch
    itl_median_ms: float
    itl_p90_ms: float


@dataclass(frozen=True)
class ServeVerdict:
    wait_case: bool
    problems: dict[str, list[str]]  # arm -> what fails it

    def failures(self) -> list[str]:
        """The arms' problems, each prefixed by its arm: the lines that make ``bench serve`` exit 1."""
        return [f"{arm}: {', '.join(p)}" for arm, p in self.problems.items() if p]


def wait_case_of(case: ServeCase) -> bool:
    """Whether the model's decode graphs hold a host-released WAIT: what the shim's capture passes
    said in the shim arms' schedulers, or the model's config where no shim arm recorded a pass."""
    reasons = [g.reason for run in case.runs.values() for _, p in run.passes() for g in p.graphs]
    if any(PLE_KIND in reason for reason in reasons):
        return True
    return False if any(NO_WAIT in reason for reason in reasons) else case.expects_wait  # upload's name none


def judge(case: ServeCase) -> ServeVerdict:
    """The case's verdicts from its raw runs alone (a saved record is judged again)."""
    wait_case = wait_case_of(case)
    reference = case.runs.get(UPSTREAM)
    problems = {arm: problems_of(run, reference, wait_case) for arm, run in case.runs.items()}
    if not case.runs:
        problems["(none)"] = ["no server ran: nothing was measured"]
    return ServeVerdict(wait_case, problems)


def problems_of(run: ServeRun, reference: ServeRun | None, wait_case: bool = True) -> list[str]:
    """What fails this arm: a protected arm that hung, lost a request, changed a single request's
    text (deterministic: nothing to batch with), or left a process; where the graphs hold a
    host-released WAIT, a negative control that never hung (it could not fail, so it proves
    nothing), and elsewhere every arm is held to the protected standard; a shim arm without its
    capture passes."""
    out = stragglers(run)
    if run.arm in NEGATIVE and wait_case:
        return out + ([] if run.hung else ["the negative control never hung at this size: it could not have failed"])
    found = (run.error, unanswered(run), rebuild_failed(run), *texts_changed(run, reference), passes_missing(run))
    return out + [p for p in found if p is not None]


def stragglers(run: ServeRun) -> list[str]:
    """Processes the arm left behind, if any."""
    if not (run.outlived or run.stragglers):
        return []
    return [f"processes outlived the arm: {run.outlived or run.stragglers}"
            + ("" if run.outlived else " (killed once the server had exited)")]


def unanswered(run: ServeRun) -> str | None:
    """Requests that hung or came back empty."""
    answered = [r for r in run.requests if not r.hung and r.chunks > 0]
    return f"{len(answered)} of {REQUESTS} requests answered" if len(answered) < REQUESTS else None


def rebuild_failed(run: ServeRun) -> str | None:
    """The cache rebuild, unless it said ok."""
    return None if (run.rebuild or {}).get("status") == "ok" else f"rebuild: {run.rebuild}"


def texts_changed(run: ServeRun, reference: ServeRun | None) -> tuple[str | None, str | None]:
    """Whether the single request's text changed across the rebuild, and whether it differs from upstream's."""
    across = any(len(texts) != 1 for texts in singles(run).values())
    upstream = reference is not None and run.arm != reference.arm and singles(run) != singles(reference)
    return ("the single request's text changed across the rebuild (same round, before and after)" if across else None,
            "the single request's text differs from upstream's" if upstream else None)


def passes_missing(run: ServeRun) -> str | None:
    """A shim arm whose scheduler process did not report capture passes 0 and 1 (start-up, then the rebuild)."""
    if not ARMS[run.arm].shim_mode or any(len(status.passes) >= 2 for status in run.shims):
        return None
    found = [(pid, p.index) for pid, p in run.passes()]
    return f"expected capture passes 0 and 1 from the scheduler process, got {found}"


def singles(run: ServeRun) -> dict[str, set[str]]:
    """The single request's texts per round. Rounds differ legitimately: the steady round's prompt is
    served from FreeToken's radix cache (the first round put it there), so its prefill runs other
    kernels, and on dummy or synthetic weights the greedy text can follow. The rebuild empties the
    cache, so each round must give one text before and after it."""
    out: dict[str, set[str]] = {}
    for r in run.requests:
        if r.name == SINGLE:
            out.setdefault(r.round, set()).add(r.text)
    return out


def pair_stable(run: ServeRun) -> bool | None:
    """Whether the concurrent pair produced the same texts in each round before and after the
    rebuild (``None``: no round ran on both sides). Not a failure: how two concurrent requests are
    batched depends on arrival."""
    compared = []
    for q in ("first", "steady"):
        sides = [tuple(r.text for r in run.requests if r.bs == 2 and r.phase == p and r.round == q)
                 for p in ("before", "after")]
        if all(len(texts) == 2 for texts in sides):
            compared.append(sides[0] == sides[1])
    return all(compared) if compared else None


def latency(run: ServeRun, phase: str, round_: str, bs: int) -> Latency | None:
    """One phase's client-side latency for one arm: the slowest TTFT of the batch, the median and p90 inter-token time;
    ``None`` where nothing answered."""
    reqs = [r for r in run.requests if (r.phase, r.round, r.bs) == (phase, round_, bs) and not r.hung]
    ttft = [r.ttft_ms for r in reqs if r.ttft_ms is not None]
    itl = [x for r in reqs for x in r.itl_ms]
    if not ttft:
        return None
    q = statistics.quantiles(itl, n=10) if len(itl) > 1 else [itl[0] if itl else math.nan] * 9
    return Latency(max(ttft), statistics.median(itl) if itl else math.nan, q[8])


def ms(value: Latency | None, key: str) -> str:
    """A latency cell, or ``-`` where nothing was measured."""
    return f"{getattr(value, key):.1f}" if value else "-"


def run_line(arm: str, run: ServeRun) -> str:
    """One arm's row: readiness, hangs, the rebuild, first-launch and steady latencies, whether the pair was stable, how
    it stopped, its capture passes."""
    b1f, b1s, b2f = latency(run, "before", "first", 1), latency(run, "before", "steady", 1), latency(
        run, "before", "first", 2)
    b2s, a1f = latency(run, "before", "steady", 2), latency(run, "after", "first", 1)
    stable = pair_stable(run)
    return (f"{arm:14} {run.ready_s:7.1f} {run.hung:>4} "
            f"{(run.rebuild or {}).get('status') or '-':>8} {ms(b1f, 'ttft_ms'):>12} {ms(b1s, 'ttft_ms'):>8} "
            f"{(ms(b1s, 'itl_median_ms') + '/' + ms(b1s, 'itl_p90_ms')):>15} {ms(b2f, 'ttft_ms'):>12} "
            f"{(ms(b2s, 'itl_median_ms') + '/' + ms(b2s, 'itl_p90_ms')):>15} {ms(a1f, 'ttft_ms'):>14} "
            f"{'-' if stable is None else 'yes' if stable else 'no':>9} {(run.stopped_by or '-').split()[0]:>8} "
            f"{len(run.passes()):>6}")


def render(case: ServeCase, verdict: ServeVerdict) -> str:
    """The serve report: environment, the case, a row per arm, then each arm's problems."""
    env = case.env
    what = ("its decode graphs hold a host-released WAIT (PLE wait-sync): skip is the negative control and "
            "must hang" if verdict.wait_case else
            "no decode graph holds a host-released WAIT: every arm must answer, shim arms are no-ops")
    lines = [f"{env.gpu} | driver {env.driver} | torch {env.torch} | {env.date}" if env else "?",
             f"ft serve, {case.model}" + (f"; FreeToken options: {' '.join(case.ft_args)}" if case.ft_args else ""),
             f"case: {what}",
             f"per arm: single x2, concurrent pair x2, rebuild to 3/4 of the KV pages, the same again; a "
             f"{case.context}-token copy prompt and {case.decode_steps} tokens a request; client-side ms "
             "(TTFT: the slower of the batch)",
             f"{'arm':14} {'ready s':>7} {'hung':>4} {'rebuild':>8} {'bs1 1st TTFT':>12} {'bs1 TTFT':>8} "
             f"{'bs1 ITL med/p90':>15} {'bs2 1st TTFT':>12} {'bs2 ITL med/p90':>15} {'after: bs1 1st':>14} "
             f"{'pair same':>9} {'stop':>8} {'passes':>6}"]
    for arm, run in case.runs.items():
        lines.append(run_line(arm, run))
        lines += [f"{'':15}! {p}" for p in verdict.problems[arm]]
    lines.append("text: the single request per round (nothing to batch with, so deterministic; the steady round's "
                 "prompt hits the prefix cache) across arms and across the rebuild; the pair against itself before "
                 "and after the rebuild ('pair same', informational: batching follows arrival)")
    bad = verdict.failures()
    controls = "; every negative control hung" if verdict.wait_case and any(a in NEGATIVE for a in case.runs) else ""
    lines.append("safety: " + ("every protected arm answered every request before and after the rebuild, upstream's "
                               f"text, nothing left running{controls}" if not bad else "FAILED: " + "; ".join(bad)))
    return "\n".join(lines)
