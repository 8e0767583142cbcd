"""``bench serve`` on CPU: the synthetic model's tokenizer through FreeToken's own loader, option
errors, stopping a server's process group, the shim's capture passes read as data, and the verdicts
drawn from serve results. The servers themselves run on the GPU (tests/test_serve_gpu.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from dataclasses import asdict

import pytest

from freetoken_graphfix import status_record
from freetoken_graphfix_bench import model, record_files, records, workload
from freetoken_graphfix_bench.serve import report as serve
from freetoken_graphfix_bench.serve import run as serve_run


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-model")
    model.build_model_dir(str(folder), layers=8)
    return str(folder)


def test_text_prompts_round_trip_through_freetokens_tokenizer(model_dir):
    """FreeToken's load_tokenizer builds a Qwen3.5 tokenizer from qwen4_exp's config, not the
    tokenizer.json's own class: the copy prompt must still reach the server as text that decodes to
    itself, the same length in tokens within the repeats' seams."""
    tok = workload.load_tokenizer(model_dir)
    assert type(tok).__name__ == "Qwen3_5Tokenizer"
    for prompt in workload.build(tok, 512, workload.read_text(None)).values():
        ids = tok.encode(prompt.text, add_special_tokens=False)
        assert tok.decode(ids) == prompt.text and abs(len(ids) - 512) <= 4


@pytest.mark.parametrize("args, message", [
    (["--layers", "2"], "layers=2: need at least 4 (a QSA layer is every 4th, the PLE layer is 1)"),
    (["--request-timeout", "0"], "argument --request-timeout: '0': accepted values are seconds above 0"),
    (["--ready-timeout", "-1"], "argument --ready-timeout: '-1': accepted values are seconds above 0"),
])
def test_bad_options_are_named(capfd, args, message):
    out = subprocess.run([sys.executable, "-m", "freetoken_graphfix", "bench", "serve", *args],
                         capture_output=True, text=True)
    assert out.returncode in (1, 2) and message in out.stderr.strip().splitlines()[-1]


def test_bad_arm_is_refused_by_the_parser():
    out = subprocess.run([sys.executable, "-m", "freetoken_graphfix", "bench", "serve", "--arms", "fast"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "invalid choice: 'fast'" in out.stderr
    pre = subprocess.run([sys.executable, "-m", "freetoken_graphfix", "bench", "serve", "--arms", "no-upload"],
                         capture_output=True, text=True)  # an engine arm: it needs the engine child's seams
    assert pre.returncode == 2 and "invalid choice: 'no-upload'" in pre.stderr


SERVER = textwrap.dedent("""
    import os, signal, sys, time
    if sys.argv[1] == "stubborn":
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a scheduler stuck in a graph launch
    else:  # a server's own handling, whatever this test run inherited (a background job ignores SIGINT)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.fork() == 0:  # a worker in the server's group
        if sys.argv[1] == "stubborn":
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        time.sleep(60)
        os._exit(0)
    print("up", flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("kind, stopped_by", [("polite", "SIGINT"), ("stubborn", "SIGKILL")])
def test_stop_ends_the_whole_group(tmp_path, kind, stopped_by):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    proc = subprocess.Popen([sys.executable, str(script), kind], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "up"
    time.sleep(0.2)
    assert len(serve_run.group_members(proc.pid)) == 2
    result = records.ServeRun("x")
    serve_run.stop(proc, result, grace_s=5.0 if kind == "polite" else 1.0)
    assert result.stopped_by.startswith(stopped_by) and result.outlived == result.stragglers == []
    assert serve_run.group_members(proc.pid) == []


def test_the_shims_passes_are_read_as_the_processes_wrote_their_status(tmp_path):
    """Each shimmed process of a server writes its status (``FT_GRAPHFIX_STATUS_DIR``): read back, every
    capture pass of every process, by pid, as data."""
    passes = [status_record.CapturePass(i, "GraphRunner._capture_graphs", [
        status_record.GraphRecord(0, "bs=2", [], "deferred", "PLE wait-sync", 0.1),
        status_record.GraphRecord(1, "bs=1", [], "deferred", "PLE wait-sync", 0.1)], done=True) for i in (0, 1)]
    status_record.write(status_record.Status(True, "auto", True, "ok", passes=passes, pid=12), str(tmp_path))
    status_record.write(status_record.Status(True, "auto", True, "ok", pid=11), str(tmp_path))  # the API server
    (tmp_path / "noise.txt").write_text("not a status")
    found = status_record.read_all(str(tmp_path))
    assert [s.pid for s in found] == [11, 12] and found[1].actions() == ["deferred"] * 4
    assert found[1].passes[1].summary() == "capture pass 1: 2 graphs: 2 deferred (PLE wait-sync)"


def req(phase, round_, bs, name, text, hung=False):
    return {"phase": phase, "round": round_, "bs": bs, "name": name, "hung": hung, "text": text,
            "chunks": len(text), "ttft_ms": 20.0, "itl_ms": [10.0, 12.0, 11.0]}


def arm(name, single="abc", hung=False, passes=2, outlived=(), action="deferred", reason="PLE wait-sync"):
    requests = []
    for phase in ("before", "after"):
        for round_ in ("first", "steady"):
            requests += [req(phase, round_, 1, "single", single), req(phase, round_, 2, "left", "de"),
                         req(phase, round_, 2, "right", "fg")]
    if hung:
        requests = [req("before", "first", 1, "single", "", hung=True)]
    rec = {"arm": name, "requests": requests, "hung": int(hung), "ready_s": 30.0, "stopped_by": "SIGINT",
           "outlived": list(outlived),
           "shims": [asdict(status_record.Status(True, name, True, "ok", passes=[
               status_record.CapturePass(i, "GraphRunner._capture_graphs",
                                         [status_record.GraphRecord(g, f"bs={2 - g}", [], action, reason, 0.1)
                                          for g in range(2)], True) for i in range(passes)], pid=12))]}
    if not hung:
        rec["rebuild"] = {"status": "ok"}
    return record_files.build(records.ServeRun, rec, "run")


def record(*arms, expects_wait=True):
    case = records.ServeCase("synthetic", "320 layers", [], 512, 8, 1, expects_wait, {a.arm: a for a in arms},
                             records.Environment("GPU", "1", "2", "today"))
    return case, serve.judge(case)


def test_verdicts():
    good = record(arm("upstream"), arm("auto"), arm("skip", hung=True))
    assert all(p == [] for p in good[1].problems.values())
    text = serve.render(*good)
    assert "safety: every protected arm answered every request" in text and "pair same" in text
    assert "every negative control hung" in text
    assert "every negative control" not in serve.render(*record(arm("upstream"), arm("auto")))  # none ran
    case, bad = record(arm("upstream"), arm("auto", single="xyz"), arm("warm", passes=1), arm("skip"),
                       arm("deferred", outlived=[4242]))
    assert bad.problems["auto"] == ["the single request's text differs from upstream's"]
    assert "expected capture passes 0 and 1 from the scheduler process" in bad.problems["warm"][0]
    assert bad.problems["skip"] == ["the negative control never hung at this size: it could not have failed"]
    assert bad.problems["deferred"] == ["processes outlived the arm: [4242]"]
    straggler = arm("auto")
    straggler.stragglers = [77]
    assert serve.problems_of(straggler, None)[0] == ("processes outlived the arm: [77] (killed once the server had "
                                                     "exited)")
    _, hung = record(arm("upstream"), arm("auto", hung=True))
    assert "0 of 12 requests answered" in hung.problems["auto"]
    assert "FAILED" in serve.render(case, bad)


def test_one_lost_request_or_a_refused_rebuild_fails_a_protected_arm():
    lost = arm("auto")
    last = lost.requests[-1]
    last.hung, last.chunks, last.text = True, 0, ""
    assert serve.problems_of(lost, None) == ["11 of 12 requests answered"]
    refused = arm("auto")
    refused.rebuild = {"status": "rejected", "error": "needs 9 GiB"}
    assert serve.problems_of(refused, None) == ["rebuild: {'status': 'rejected', 'error': 'needs 9 GiB'}"]


def test_pair_is_compared_with_itself():
    rec = arm("auto")
    assert serve.pair_stable(rec) is True
    rec.requests[-1].text = "other"
    assert serve.pair_stable(rec) is False


def set_text(rec, phase, round_, name, text):
    for r in rec.requests:
        if (r.phase, r.round, r.name) == (phase, round_, name):
            r.text = text


def test_a_cached_prefix_may_change_the_steady_round_but_not_the_rebuild():
    """The steady round's prompt is served from the radix cache the first round filled, and may give
    other greedy tokens on random weights (as the synthetic model did on the H200); the rebuild
    empties the cache, so each round is held to one text on both sides of it, in every arm."""
    up, auto = arm("upstream"), arm("auto")
    for rec in (up, auto):
        for phase in ("before", "after"):
            set_text(rec, phase, "steady", "single", "cached")
            set_text(rec, phase, "steady", "left", "cached pair")
    assert serve.problems_of(auto, up) == [] and serve.pair_stable(auto) is True
    set_text(auto, "after", "steady", "single", "other")
    assert serve.problems_of(auto, up) == [
        "the single request's text changed across the rebuild (same round, before and after)",
        "the single request's text differs from upstream's"]
    up2, auto2 = arm("upstream"), arm("auto")
    for phase in ("before", "after"):
        set_text(auto2, phase, "steady", "single", "other")
    assert serve.problems_of(auto2, up2) == ["the single request's text differs from upstream's"]


def test_without_a_wait_skip_must_answer_like_every_arm():
    """On a model whose graphs hold no host-released WAIT (the shim's passes say no-op), skip is no
    negative control: it answers, and a hang would be a failure like any other arm's."""
    no_op = dict(action="no-op", reason="no host-released WAIT")
    rec = record(arm("upstream", passes=0), arm("auto", **no_op), arm("skip", **no_op), expects_wait=True)
    assert not rec[1].wait_case and all(p == [] for p in rec[1].problems.values())
    assert "every arm must answer" in serve.render(*rec) and "negative control" not in serve.render(*rec)
    _, hung = record(arm("upstream", passes=0), arm("auto", **no_op), arm("skip", hung=True, **no_op))
    assert "0 of 12 requests answered" in hung.problems["skip"]
