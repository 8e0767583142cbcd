"""``bench --serve``: every mode in a real ``ft serve``, driven by the OpenAI client, through a rebuild.

Users run FreeToken's server, not its offline ``LLM``: an API server, tokenizer workers and a
spawned scheduler that captures the graphs, and runtime recaptures (``POST /v1/cache/rebuild``).
Per arm, a fresh ``python -m freetoken.cli serve`` (FreeToken's own CLI, what ``ft`` runs) on the
synthetic qwen4_exp of ``model`` or on ``--model`` with the FreeToken options after ``--``, in its
own process group, with ``FREETOKEN_PLE_SYNC=wait`` and only ``FT_GRAPH_UPLOAD`` set for shim arms
(the ``.pth`` brings the shim in, as for a user). Then, with the ``openai`` client streaming the
copy workload's prompts: a single request (bs 1) twice, a concurrent pair (bs 2) twice, a rebuild
to three quarters of the KV pages, the same again, ``GET /v1/cache/status``; and a clean stop
(SIGINT, a bounded wait, then SIGKILL of the group), reporting which was needed and what outlived it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .arms import PATCHED_ARMS, SHIM_ARMS, arm_env, patched_freetoken
from .common import Case, environment, seconds
from .settings import ServeSettings
from .workload import PAIR, SINGLE, build, load_tokenizer, read_text

ARMS = ("upstream", *SHIM_ARMS, *PATCHED_ARMS)
DEFAULT_ARMS = ("upstream", "auto", "deferred", "warm", "upload", "skip")
NEGATIVE = ("skip",)  # unprotected: with a WAIT the first decode may deadlock, never answering
REQUESTS = 12  # single x2 and the pair x2, before and after the rebuild
PASS_LINE = re.compile(r"\[freetoken_graphfix pid=(\d+)\] INFO (capture pass \d+: .*)")
WAIT_PASS = "PLE wait-sync"  # how the shim's capture-pass line names a graph holding the host-released WAIT
NO_WAIT_PASS = "no host-released WAIT"  # and one without


# ---------------------------------------------------------------- one server

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(arm: str, model_dir: str, ft_args: list[str], log_path: str,
          patched: str | None) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = arm_env(arm, patched)  # FREETOKEN_PLE_SYNC=wait: a PLE table puts its WAIT in every decode graph
    cmd = [sys.executable, "-m", "freetoken.cli", "serve", "--model", model_dir, "--host", "127.0.0.1",
           "--port", str(port), *ft_args]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, port


def http(method: str, url: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def wait_ready(proc: subprocess.Popen, port: int, timeout_s: float) -> float:
    """Seconds until ``/health`` says ``ok``; raises ``RuntimeError`` if the server dies or is late."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited {proc.returncode} before it was ready")
        try:
            status, doc = http("GET", f"http://127.0.0.1:{port}/health", timeout=5)
            if status == 200 and doc.get("status") == "ok":
                return time.perf_counter() - t0
            if doc.get("status") == "error":
                raise RuntimeError(f"/health: {doc.get('message')}")
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"not ready after {timeout_s:.0f} s")


def stream(client: Any, model: str, prompt: str, tokens: int) -> dict[str, Any]:
    """One streamed completion: client-side time to first token and between chunks (one a token), the
    text and how many chunks carried it."""
    t0 = time.perf_counter()
    stamps, text = [], []
    try:
        for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=tokens, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True}):
            if chunk.choices:
                stamps.append(time.perf_counter())
                text.append(chunk.choices[0].text or "")
    except Exception as exc:  # a client timeout is how a deadlocked server shows
        return {"hung": True, "error": f"{type(exc).__name__}: {exc}", "text": "".join(text), "chunks": len(text)}
    itl = [1e3 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False) if b > a]
    return {"hung": False, "ttft_ms": 1e3 * (stamps[0] - t0) if stamps else None, "itl_ms": itl,
            "text": "".join(text), "chunks": len(text)}


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> dict[str, Any]:
    """SIGINT to the server's group, a bounded wait, then SIGKILL of the group; and what outlived it."""
    group, how = proc.pid, "SIGINT"
    try:
        os.killpg(group, signal.SIGINT)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        how = f"SIGKILL (SIGINT not enough within {grace_s:g} s)"
        os.killpg(group, signal.SIGKILL)
        proc.wait(30)
    except ProcessLookupError:
        how = "already exited"
    deadline = time.monotonic() + 10
    while (stragglers := group_members(group)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if stragglers:  # workers still up after the server exited: killed, and reported
        os.killpg(group, signal.SIGKILL)
        time.sleep(0.5)
    return {"stopped_by": how, "exit_code": proc.returncode, "stragglers": stragglers,
            "outlived": group_members(group)}


def group_members(group: int) -> list[int]:
    """The live processes of process group ``group`` (``/proc``: stat field 5)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def run_arm(arm: str, model_dir: str, ft_args: list[str], texts: dict[str, str], settings: ServeSettings,
            log_dir: str, patched: str | None) -> dict[str, Any]:
    """One server for ``arm``, the request sequence, the stop; every figure of it."""
    import openai

    log_path = os.path.join(log_dir, f"serve-{arm}.log")
    proc, port = start(arm, model_dir, ft_args, log_path, patched)
    base = f"http://127.0.0.1:{port}"
    rec: dict[str, Any] = {"arm": arm, "log": log_path, "requests": [], "hung": 0}
    try:
        rec["ready_s"] = wait_ready(proc, port, settings.ready_timeout)
        model = http("GET", f"{base}/v1/models")[1]["data"][0]["id"]
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=settings.request_timeout, max_retries=0)
        for phase in ("before", "after"):
            if phase == "after":
                pages = int(http("GET", f"{base}/v1/cache/status")[1]["geometry"]["num_pages"]) * 3 // 4
                t0 = time.perf_counter()
                status, doc = http("POST", f"{base}/v1/cache/rebuild", {"num_pages": pages},
                                   timeout=settings.ready_timeout)
                rec["rebuild"] = {"http": status, "status": doc.get("status"), "s": time.perf_counter() - t0,
                                  "error": doc.get("error"), "num_pages": pages}
                if status != 200:
                    break
            for round_ in ("first", "steady"):
                single = stream(client, model, texts[SINGLE], settings.decode_steps)
                rec["requests"].append({"phase": phase, "round": round_, "bs": 1, "name": SINGLE, **single})
                if single["hung"]:
                    raise TimeoutError("a request hung")
                with ThreadPoolExecutor(2) as pool:
                    pair = list(pool.map(lambda p: stream(client, model, texts[p], settings.decode_steps), PAIR))
                for name, r in zip(PAIR, pair, strict=True):
                    rec["requests"].append({"phase": phase, "round": round_, "bs": 2, "name": name, **r})
                if any(r["hung"] for r in pair):
                    raise TimeoutError("a request hung")
        status, doc = http("GET", f"{base}/v1/cache/status")
        rec["cache_status"] = {"http": status, "num_pages": doc.get("geometry", {}).get("num_pages")}
    except (RuntimeError, TimeoutError, OSError, KeyError, IndexError, ValueError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        rec["hung"] = sum(r["hung"] for r in rec["requests"])
        rec.update(stop(proc))
        rec["passes"] = capture_passes(log_path)
    return rec


def capture_passes(log_path: str) -> list[tuple[int, str]]:
    """The shim's ``capture pass`` lines from the server's log, with the pid that printed them."""
    with open(log_path, errors="replace") as fh:
        return [(int(m.group(1)), m.group(2)) for m in map(PASS_LINE.search, fh) if m]


# ---------------------------------------------------------------- the comparison

def wait_case_of(runs: dict[str, dict[str, Any]], expects_wait: bool) -> bool:
    """Whether the model's decode graphs hold a host-released WAIT: what the shim's capture passes
    said in the shim arms' schedulers, or the model's config where no shim arm logged a pass."""
    lines = [line for rec in runs.values() for _, line in rec["passes"]]
    if any(WAIT_PASS in line for line in lines):
        return True
    return False if any(NO_WAIT_PASS in line for line in lines) else expects_wait  # upload's lines name no WAIT


def problems(rec: dict[str, Any], reference: dict[str, Any] | None, wait_case: bool = True) -> list[str]:
    """What fails this arm: a protected arm that hung, lost a request, changed a single request's
    text (deterministic: nothing to batch with), or left a process; where the graphs hold a
    host-released WAIT, a negative control that never hung (it could not fail, so it proves
    nothing), and elsewhere every arm is held to the protected standard; a shim arm without its
    capture passes."""
    arm, out = rec["arm"], []
    if rec["outlived"] or rec.get("stragglers"):
        out.append(f"processes outlived the arm: {rec['outlived'] or rec['stragglers']}"
                   + ("" if rec["outlived"] else " (killed once the server had exited)"))
    if arm in NEGATIVE and wait_case:
        if not rec["hung"]:
            out.append("the negative control never hung at this size: it could not have failed")
        return out
    if "error" in rec:
        out.append(rec["error"])
    answered = [r for r in rec["requests"] if not r["hung"] and r["chunks"] > 0]
    if len(answered) < REQUESTS:
        out.append(f"{len(answered)} of {REQUESTS} requests answered")
    if rec.get("rebuild", {}).get("status") != "ok":
        out.append(f"rebuild: {rec.get('rebuild')}")
    if any(len(texts) != 1 for texts in singles(rec).values()):
        out.append("the single request's text changed across the rebuild (same round, before and after)")
    if reference is not None and arm != reference["arm"] and singles(rec) != singles(reference):
        out.append("the single request's text differs from upstream's")
    if arm in SHIM_ARMS:
        pids = {pid for pid, line in rec["passes"]}
        if not any(sum(p == pid for p, _ in rec["passes"]) >= 2 for pid in pids):
            out.append(f"expected capture passes 0 and 1 from the scheduler process, got {rec['passes']}")
    return out


def singles(rec: dict[str, Any]) -> dict[str, set[str]]:
    """The single request's texts per round. Rounds differ legitimately: the steady round's prompt is
    served from FreeToken's radix cache (the first round put it there), so its prefill runs other
    kernels, and on dummy or synthetic weights the greedy text can follow. The rebuild empties the
    cache, so each round must give one text before and after it."""
    out: dict[str, set[str]] = {}
    for r in rec["requests"]:
        if r["name"] == SINGLE:
            out.setdefault(r["round"], set()).add(r["text"])
    return out


def pair_stable(rec: dict[str, Any]) -> bool | None:
    """Whether the concurrent pair produced the same texts in each round before and after the
    rebuild (``None``: no round ran on both sides). Not a failure: how two concurrent requests are
    batched depends on arrival."""
    compared = []
    for q in ("first", "steady"):
        runs = [tuple(r["text"] for r in rec["requests"] if r["bs"] == 2 and r["phase"] == p and r["round"] == q)
                for p in ("before", "after")]
        if all(len(texts) == 2 for texts in runs):
            compared.append(runs[0] == runs[1])
    return all(compared) if compared else None


def latency(rec: dict[str, Any], phase: str, round_: str, bs: int) -> dict[str, float]:
    reqs = [r for r in rec["requests"] if (r["phase"], r["round"], r["bs"]) == (phase, round_, bs) and not r["hung"]]
    ttft = [r["ttft_ms"] for r in reqs if r.get("ttft_ms") is not None]
    itl = [x for r in reqs for x in r["itl_ms"]]
    if not ttft:
        return {}
    q = statistics.quantiles(itl, n=10) if len(itl) > 1 else [itl[0] if itl else float("nan")] * 9
    return {"ttft_ms": max(ttft), "itl_median_ms": statistics.median(itl) if itl else float("nan"), "itl_p90_ms": q[8]}


def render(record: dict[str, Any]) -> str:
    env, runs = record["env"], record["runs"]
    case = ("its decode graphs hold a host-released WAIT (PLE wait-sync): skip is the negative control and "
            "must hang" if record["wait_case"] else
            "no decode graph holds a host-released WAIT: every arm must answer, shim arms are no-ops")
    lines = [f"{env['gpu']} | driver {env['driver']} | torch {env['torch']} | {env['date']}",
             f"ft serve, {record['model']}" + (f"; FreeToken options: {' '.join(record['ft_args'])}"
                                               if record["ft_args"] else ""),
             f"case: {case}",
             f"per arm: single x2, concurrent pair x2, rebuild to 3/4 of the KV pages, the same again; a "
             f"{record['context']}-token copy prompt and {record['decode_steps']} tokens a request; client-side ms "
             "(TTFT: the slower of the batch)",
             f"{'arm':14} {'ready s':>7} {'hung':>4} {'rebuild':>8} {'bs1 1st TTFT':>12} {'bs1 TTFT':>8} "
             f"{'bs1 ITL med/p90':>15} {'bs2 1st TTFT':>12} {'bs2 ITL med/p90':>15} {'after: bs1 1st':>14} "
             f"{'pair same':>9} {'stop':>8} {'passes':>6}"]

    def ms(d: dict[str, float], key: str) -> str:
        return f"{d[key]:.1f}" if d else "-"

    for arm, rec in runs.items():
        b1f, b1s, b2f = latency(rec, "before", "first", 1), latency(rec, "before", "steady", 1), latency(
            rec, "before", "first", 2)
        b2s, a1f = latency(rec, "before", "steady", 2), latency(rec, "after", "first", 1)
        stable = pair_stable(rec)
        lines.append(
            f"{arm:14} {rec.get('ready_s', float('nan')):7.1f} {rec['hung']:>4} "
            f"{(rec.get('rebuild') or {}).get('status') or '-':>8} {ms(b1f, 'ttft_ms'):>12} {ms(b1s, 'ttft_ms'):>8} "
            f"{(ms(b1s, 'itl_median_ms') + '/' + ms(b1s, 'itl_p90_ms')):>15} {ms(b2f, 'ttft_ms'):>12} "
            f"{(ms(b2s, 'itl_median_ms') + '/' + ms(b2s, 'itl_p90_ms')):>15} {ms(a1f, 'ttft_ms'):>14} "
            f"{'-' if stable is None else 'yes' if stable else 'no':>9} {rec['stopped_by'].split()[0]:>8} "
            f"{len(rec['passes']):>6}")
        lines += [f"{'':15}! {p}" for p in record["problems"][arm]]
    lines.append("text: the single request per round (nothing to batch with, so deterministic; the steady round's "
                 "prompt hits the prefix cache) across arms and across the rebuild; the pair against itself before "
                 "and after the rebuild ('pair same', informational: batching follows arrival)")
    bad = {arm: p for arm, p in record["problems"].items() if p}
    controls = "; every negative control hung" if record["wait_case"] and any(a in NEGATIVE for a in runs) else ""
    lines.append("safety: " + ("every protected arm answered every request before and after the rebuild, upstream's "
                               f"text, nothing left running{controls}" if not bad else
                               "FAILED: " + "; ".join(f"{a}: {', '.join(p)}" for a, p in bad.items())))
    return "\n".join(lines)


def serve_record(case: Case, settings: ServeSettings, log_dir: str) -> dict[str, Any]:
    """Run the arms on ``case``'s model: the first one alone (it compiles FreeToken's kernels into
    their caches; so does the first patched arm, another path), the rest ``settings.jobs`` at a time."""
    patched = patched_freetoken(settings.arms, log_dir)
    runs: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()
    ft_args = list(case.target.ft_args)
    with case.model_dir(log_dir) as model_dir:
        texts = {p.name: p.text for p in build(load_tokenizer(model_dir), settings.context,
                                               read_text(settings.prompt_file)).values()}

        def one(arm: str) -> None:
            rec = run_arm(arm, model_dir, ft_args, texts, settings, log_dir, patched)
            with lock:
                runs[arm] = rec
                print(f"serve {case.label} {arm}: ready {rec.get('ready_s', float('nan')):.1f} s, hung {rec['hung']}, "
                      f"rebuild {(rec.get('rebuild') or {}).get('status')}, stop {rec['stopped_by']}"
                      + (f", {rec['error']}" if "error" in rec else ""), file=sys.stderr, flush=True)

        firsts = [a for a in (settings.arms[0], next((a for a in settings.arms if a in PATCHED_ARMS), None)) if a]
        for arm in dict.fromkeys(firsts):
            one(arm)
        with ThreadPoolExecutor(max_workers=settings.jobs) as pool:
            list(pool.map(one, [a for a in settings.arms if a not in runs]))
    runs = {arm: runs[arm] for arm in settings.arms}
    return {"model": case.target.describe(), "label": case.label, "ft_args": ft_args, "context": settings.context,
            "decode_steps": settings.decode_steps, "jobs": settings.jobs, "env": environment(), "runs": runs,
            "expects_wait": case.target.expects_wait, **judge(runs, case.target.expects_wait)}


def judge(runs: dict[str, dict[str, Any]], expects_wait: bool) -> dict[str, Any]:
    """The record's verdict part from its raw runs alone (a saved record can be judged again)."""
    wait_case = wait_case_of(runs, expects_wait)
    reference = runs.get("upstream")
    return {"wait_case": wait_case, "problems": {arm: problems(rec, reference, wait_case) for arm, rec in runs.items()}}


def add_arguments(group: Any) -> None:
    """``bench``'s ``--serve`` options (the model and workload options are shared with ``--engine``)."""
    group.add_argument("--serve", action="store_true", help="run the real-server comparison")
    group.add_argument("--serve-arms", nargs="+", choices=ARMS, metavar="ARM",
                       help=f"arms, of: {', '.join(ARMS)} (default: {' '.join(DEFAULT_ARMS)}; patched runs the "
                            "patch series)")
    group.add_argument("--ready-timeout", type=seconds, default=300.0,
                       help="seconds for a server to be ready (default 300)")
    group.add_argument("--request-timeout", type=seconds, default=45.0,
                       help="seconds before a request counts as hung (default 45)")


def openai_missing() -> str | None:
    """Why ``--serve`` cannot run here, or ``None``."""
    try:
        import openai  # noqa: F401
    except ImportError:
        return "bench --serve: needs the openai client: pip install 'freetoken-graphfix[serve]'"
    return None
