"""``bench --serve`` on CPU: the synthetic model's tokenizer through FreeToken's own loader, option
errors, stopping a server's process group, and the verdicts drawn from serve results. The servers
themselves run on the GPU (tests/test_serve_gpu.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from freetoken_graphfix.bench import model, serve, workload


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
    out = subprocess.run([sys.executable, "-m", "freetoken_graphfix", "bench", "--serve", *args],
                         capture_output=True, text=True)
    assert out.returncode in (1, 2) and message in out.stderr.strip().splitlines()[-1]


def test_bad_arm_is_refused_by_the_parser():
    out = subprocess.run([sys.executable, "-m", "freetoken_graphfix", "bench", "--serve", "--serve-arms", "fast"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "invalid choice: 'fast'" in out.stderr


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
    assert len(serve.group_members(proc.pid)) == 2
    result = serve.stop(proc, grace_s=5.0 if kind == "polite" else 1.0)
    assert result["stopped_by"].startswith(stopped_by) and result["outlived"] == result["stragglers"] == []
    assert serve.group_members(proc.pid) == []


def test_capture_passes_are_read_from_the_server_log(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text("[freetoken_graphfix pid=11] INFO patched (mode auto): freetoken 0.2.1\n"
                   "[freetoken_graphfix pid=12] INFO capture pass 0: 2 graphs: 2 deferred (PLE wait-sync)\n"
                   "noise\n[freetoken_graphfix pid=12] INFO capture pass 1: 2 graphs: 2 deferred (PLE wait-sync)\n")
    assert serve.capture_passes(str(log)) == [(12, "capture pass 0: 2 graphs: 2 deferred (PLE wait-sync)"),
                                              (12, "capture pass 1: 2 graphs: 2 deferred (PLE wait-sync)")]


def req(phase, round_, bs, name, text, hung=False):
    return {"phase": phase, "round": round_, "bs": bs, "name": name, "hung": hung, "text": text,
            "chunks": len(text), "ttft_ms": 20.0, "itl_ms": [10.0, 12.0, 11.0]}


def arm(name, single="abc", hung=False, passes=2, outlived=(), line="2 deferred (PLE wait-sync)"):
    requests = []
    for phase in ("before", "after"):
        for round_ in ("first", "steady"):
            requests += [req(phase, round_, 1, "single", single), req(phase, round_, 2, "left", "de"),
                         req(phase, round_, 2, "right", "fg")]
    if hung:
        requests = [req("before", "first", 1, "single", "", hung=True)]
    rec = {"arm": name, "requests": requests, "hung": int(hung), "ready_s": 30.0, "stopped_by": "SIGINT",
           "outlived": list(outlived), "passes": [(12, f"capture pass {i}: 2 graphs: {line}") for i in range(passes)]}
    if not hung:
        rec["rebuild"] = {"status": "ok"}
    return rec


def record(*arms, expects_wait=True):
    runs = {a["arm"]: a for a in arms}
    wait_case = serve.wait_case_of(runs, expects_wait)
    return {"model": "synthetic", "label": "320 layers", "ft_args": [], "context": 512, "decode_steps": 8, "jobs": 1,
            "runs": runs, "env": {"gpu": "GPU", "driver": "1", "torch": "2", "date": "today"}, "wait_case": wait_case,
            "problems": {n: serve.problems(a, runs.get("upstream"), wait_case) for n, a in runs.items()}}


def test_verdicts():
    good = record(arm("upstream"), arm("auto"), arm("skip", hung=True))
    assert all(p == [] for p in good["problems"].values())
    text = serve.render(good)
    assert "safety: every protected arm answered every request" in text and "pair same" in text
    assert "every negative control hung" in text
    assert "every negative control" not in serve.render(record(arm("upstream"), arm("auto")))  # none ran
    bad = record(arm("upstream"), arm("auto", single="xyz"), arm("warm", passes=1), arm("skip"),
                 arm("deferred", outlived=[4242]))
    assert bad["problems"]["auto"] == ["the single request's text differs from upstream's"]
    assert "expected capture passes 0 and 1 from the scheduler process" in bad["problems"]["warm"][0]
    assert bad["problems"]["skip"] == ["the negative control never hung at this size: it could not have failed"]
    assert bad["problems"]["deferred"] == ["processes outlived the arm: [4242]"]
    straggler = arm("auto")
    straggler["stragglers"] = [77]
    assert serve.problems(straggler, None)[0] == "processes outlived the arm: [77] (killed once the server had exited)"
    hung = record(arm("upstream"), arm("auto", hung=True))
    assert "0 of 12 requests answered" in hung["problems"]["auto"]
    assert "FAILED" in serve.render(bad)


def test_one_lost_request_or_a_refused_rebuild_fails_a_protected_arm():
    lost = arm("auto")
    lost["requests"][-1].update(hung=True, chunks=0, text="")
    assert serve.problems(lost, None) == ["11 of 12 requests answered"]
    refused = arm("auto")
    refused["rebuild"] = {"status": "rejected", "error": "needs 9 GiB"}
    assert serve.problems(refused, None) == ["rebuild: {'status': 'rejected', 'error': 'needs 9 GiB'}"]


def test_pair_is_compared_with_itself():
    rec = arm("auto")
    assert serve.pair_stable(rec) is True
    rec["requests"][-1]["text"] = "other"
    assert serve.pair_stable(rec) is False


def set_text(rec, phase, round_, name, text):
    for r in rec["requests"]:
        if (r["phase"], r["round"], r["name"]) == (phase, round_, name):
            r["text"] = text


def test_a_cached_prefix_may_change_the_steady_round_but_not_the_rebuild():
    """The steady round's prompt is served from the radix cache the first round filled, and may give
    other greedy tokens on random weights (as the synthetic model did on the H200); the rebuild
    empties the cache, so each round is held to one text on both sides of it, in every arm."""
    up, auto = arm("upstream"), arm("auto")
    for rec in (up, auto):
        for phase in ("before", "after"):
            set_text(rec, phase, "steady", "single", "cached")
            set_text(rec, phase, "steady", "left", "cached pair")
    assert serve.problems(auto, up) == [] and serve.pair_stable(auto) is True
    set_text(auto, "after", "steady", "single", "other")
    assert serve.problems(auto, up) == [
        "the single request's text changed across the rebuild (same round, before and after)",
        "the single request's text differs from upstream's"]
    up2, auto2 = arm("upstream"), arm("auto")
    for phase in ("before", "after"):
        set_text(auto2, phase, "steady", "single", "other")
    assert serve.problems(auto2, up2) == ["the single request's text differs from upstream's"]


def test_without_a_wait_skip_must_answer_like_every_arm():
    """On a model whose graphs hold no host-released WAIT (the shim's passes say no-op), skip is no
    negative control: it answers, and a hang would be a failure like any other arm's."""
    no_op = "2 no-op (no host-released WAIT)"
    rec = record(arm("upstream", passes=0), arm("auto", line=no_op), arm("skip", line=no_op), expects_wait=True)
    assert not rec["wait_case"] and all(p == [] for p in rec["problems"].values())
    assert "every arm must answer" in serve.render(rec) and "negative control" not in serve.render(rec)
    hung = record(arm("upstream", passes=0), arm("auto", line=no_op), arm("skip", line=no_op, hung=True))
    assert "0 of 12 requests answered" in hung["problems"]["skip"]
