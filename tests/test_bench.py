"""The benchmark's pure parts: CUPTI gap extraction, statistics, the armed-hook cost probe."""

from __future__ import annotations

import json

import pytest

from freetoken_graphfix import bench


def trace(tmp_path, launches, kernels):
    """``kernels`` per launch: (stream, start offset µs, duration µs); launches 100 µs apart."""
    events = [{"cat": "cpu_op", "ts": 0.0}]
    for i, _ in enumerate(launches):
        events += [{"cat": "kernel", "ts": 100.0 * i + off, "dur": dur, "args": {"stream": s}}
                   for s, off, dur in kernels]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return str(path)


def test_kernel_gaps_per_stream_dropping_each_arms_first_replay(tmp_path):
    kernels = [(7, 0.0, 1.0), (7, 1.5, 1.0), (9, 0.2, 2.0), (7, 3.25, 0.5)]  # stream 7 gaps 0.5, 0.75
    launches = ["a", "b", "a", "b"]
    gaps, note = bench.kernel_gaps(trace(tmp_path, launches, kernels), launches, {"a", "b"})
    assert note == "16 kernel records for 4 launches, 4 per launch"
    assert gaps == {"a": {"7": [0.5, 0.75], "9": []}, "b": {"7": [0.5, 0.75], "9": []}}


def test_kernel_gaps_refuses_a_trace_that_does_not_split(tmp_path):
    launches = ["a", "b", "a"]
    path = trace(tmp_path, launches, [(7, 0.0, 1.0), (7, 2.0, 1.0)])
    gaps, note = bench.kernel_gaps(path, launches + ["b"], set())
    assert gaps == {} and note.endswith("not an equal number per launch, gaps not reported")
    overlapping = trace(tmp_path, launches, [(7, 0.0, 150.0)])
    gaps, note = bench.kernel_gaps(overlapping, launches, set())
    assert gaps == {} and "overlap" in note


def test_summary():
    s = bench.summary([float(v) for v in range(1, 12)])
    assert (s["n"], s["median"], s["p10"], s["p90"]) == (11, 6.0, 2.0, 10.0)
    assert bench.summary([]) == {"n": 0}


def test_armed_hook_cost_leaves_nothing_patched():
    cost = bench.armed_hook_cost(calls=2000)
    assert cost == pytest.approx(cost) and cost < 1000  # a number, in µs per call


def test_bench_without_cuda_says_so(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert bench.main([]) == bench.ERR
    assert "no CUDA device" in capsys.readouterr().err
