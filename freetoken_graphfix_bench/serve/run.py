"""``bench serve``: every arm in a real ``ft serve``, driven by the OpenAI client, through a rebuild.

Users run FreeToken's server, not its offline ``LLM``: an API server, tokenizer workers and a
spawned scheduler that captures the graphs, and runtime recaptures (``POST /v1/cache/rebuild``).
Per arm, a fresh ``python -m freetoken.cli serve`` (FreeToken's own CLI, what ``ft`` runs) on the
synthetic qwen4_exp of ``model`` or on ``--model`` with the FreeToken options after ``--``, in its
own process group, with ``FREETOKEN_PLE_SYNC=wait`` and only ``FT_GRAPH_UPLOAD`` set for shim arms
(the ``.pth`` brings the shim in, as for a user; ``FT_GRAPHFIX_STATUS_DIR`` has every shimmed process
write its status, read back as data). Then, with the ``openai`` client streaming the copy workload's
prompts: a single request (bs 1) twice, a concurrent pair (bs 2) twice, a rebuild to three quarters
of the KV pages, the same again, ``GET /v1/cache/status``; and a clean stop (SIGINT, a bounded wait,
then SIGKILL of the group), reporting which was needed and what outlived it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from freetoken_graphfix import status_record
from freetoken_graphfix.config import ENV_STATUS_DIR

from ..arms import ARMS, arm_env, patched_freetoken
from ..cases import Case
from ..records import Environment, Request, ServeCase, ServeRun
from ..settings import ServeSettings
from ..workload import PAIR, SINGLE, build, load_tokenizer, read_text

# ---------------------------------------------------------------- one server

def free_port() -> int:
    """A port free now on the loopback: every arm's server gets its own, so arms can run at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(arm: str, model_dir: str, ft_args: list[str], log_path: str, patched: str | None,
          status_dir: str) -> tuple[subprocess.Popen, int]:
    """One arm's ``ft serve`` (FreeToken's own CLI) in its own session, so the whole process group can be stopped; its
    log to ``log_path``."""
    port = free_port()
    env = arm_env(arm, patched)  # FREETOKEN_PLE_SYNC=wait: a PLE table puts its WAIT in every decode graph
    env[ENV_STATUS_DIR] = status_dir
    cmd = [sys.executable, "-m", "freetoken.cli", "serve", "--model", model_dir, "--host", "127.0.0.1",
           "--port", str(port), *ft_args]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, port


def http(method: str, url: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, dict]:
    """A JSON request with the standard library alone, an HTTP error returned as its status: the rebuild's refusal is an
    answer, not a failure."""
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


def stream(client: Any, model: str, prompt: str, tokens: int, phase: str, round_: str, bs: int,
           name: str) -> Request:
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
        return Request(phase, round_, bs, name, True, "".join(text), len(text), error=f"{type(exc).__name__}: {exc}")
    itl = [1e3 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False) if b > a]
    return Request(phase, round_, bs, name, False, "".join(text), len(text),
                   1e3 * (stamps[0] - t0) if stamps else None, itl)


def stop(proc: subprocess.Popen, rec: ServeRun, grace_s: float = 20.0) -> None:
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
    rec.stopped_by, rec.exit_code, rec.stragglers, rec.outlived = how, proc.returncode, stragglers, group_members(group)


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
            log_dir: str, patched: str | None) -> ServeRun:
    """One server for ``arm``, the request sequence, the stop; every figure of it."""
    rec = ServeRun(arm, os.path.join(log_dir, f"serve-{arm}.log"))
    status_dir = os.path.join(log_dir, f"serve-{arm}-status")
    proc, port = start(arm, model_dir, ft_args, rec.log, patched, status_dir)
    try:
        rec.ready_s = wait_ready(proc, port, settings.ready_timeout)
        requests(rec, f"http://127.0.0.1:{port}", texts, settings)
    except (RuntimeError, TimeoutError, OSError, KeyError, IndexError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
    finally:
        rec.hung = sum(r.hung for r in rec.requests)
        stop(proc, rec)
        try:
            rec.shims = status_record.read_all(status_dir)
        except status_record.StatusFileError as exc:
            rec.error = rec.error or str(exc)
    return rec


def requests(rec: ServeRun, base: str, texts: dict[str, str], settings: ServeSettings) -> None:
    """The request sequence against a ready server: single and pair, twice, before and after a rebuild;
    raises ``TimeoutError`` once a request hung (the server is stopped next)."""
    import openai

    model = http("GET", f"{base}/v1/models")[1]["data"][0]["id"]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", timeout=settings.request_timeout, max_retries=0)
    for phase in ("before", "after"):
        if phase == "after":
            pages = int(http("GET", f"{base}/v1/cache/status")[1]["geometry"]["num_pages"]) * 3 // 4
            t0 = time.perf_counter()
            status, doc = http("POST", f"{base}/v1/cache/rebuild", {"num_pages": pages}, timeout=settings.ready_timeout)
            rec.rebuild = {"http": status, "status": doc.get("status"), "s": time.perf_counter() - t0,
                           "error": doc.get("error"), "num_pages": pages}
            if status != 200:
                return
        for round_ in ("first", "steady"):
            rec.requests.append(stream(client, model, texts[SINGLE], settings.decode_steps, phase, round_, 1, SINGLE))
            if rec.requests[-1].hung:
                raise TimeoutError("a request hung")
            with ThreadPoolExecutor(2) as pool:
                pair = list(pool.map(lambda p, r=round_, ph=phase: stream(
                    client, model, texts[p], settings.decode_steps, ph, r, 2, p), PAIR))
            rec.requests += pair
            if any(r.hung for r in pair):
                raise TimeoutError("a request hung")
    status, doc = http("GET", f"{base}/v1/cache/status")
    rec.cache_status = {"http": status, "num_pages": doc.get("geometry", {}).get("num_pages")}


def serve_case(case: Case, settings: ServeSettings, log_dir: str) -> ServeCase:
    """Run the arms on ``case``'s model: the first one alone (it compiles FreeToken's kernels into
    their caches; so does the first patched arm, another path), the rest ``settings.jobs`` at a time."""
    patched = patched_freetoken(settings.arms, log_dir)
    runs: dict[str, ServeRun] = {}
    lock = threading.Lock()
    ft_args = list(case.target.ft_args)
    with case.model_dir(log_dir) as model_dir:
        texts = {p.name: p.text for p in build(load_tokenizer(model_dir), settings.context,
                                               read_text(settings.prompt_file)).values()}

        def one(arm: str) -> None:
            rec = run_arm(arm, model_dir, ft_args, texts, settings, log_dir, patched)
            with lock:
                runs[arm] = rec
                print(f"serve {case.label} {arm}: ready {rec.ready_s:.1f} s, hung {rec.hung}, "
                      f"rebuild {(rec.rebuild or {}).get('status')}, stop {rec.stopped_by}"
                      + (f", {rec.error}" if rec.error else ""), file=sys.stderr, flush=True)

        firsts = [a for a in (settings.arms[0], next((a for a in settings.arms if ARMS[a].patched), None)) if a]
        for arm in dict.fromkeys(firsts):
            one(arm)
        with ThreadPoolExecutor(max_workers=settings.jobs) as pool:
            list(pool.map(one, [a for a in settings.arms if a not in runs]))
    return ServeCase(case.target.describe(), case.label, ft_args, settings.context, settings.decode_steps,
                     settings.jobs, case.target.expects_wait, {arm: runs[arm] for arm in settings.arms},
                     Environment.here())


def openai_missing() -> str | None:
    """Why ``bench serve`` cannot run here, or ``None``."""
    try:
        import openai  # noqa: F401
    except ImportError:
        return "bench serve: needs the openai client: pip install 'freetoken-graphfix[serve]'"
    return None
