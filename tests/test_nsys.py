"""``bench --from-nsys``: #775's table from a CSV in the shape ``nsys stats --report cuda_gpu_trace
--format csv`` writes, held to a trace whose step time and gaps are known."""

from __future__ import annotations

import pytest

from freetoken_graphfix.bench import cli, nsys

HEADER = ("Start (ns),Duration (ns),CorrId,GrdX,GrdY,GrdZ,BlkX,BlkY,BlkZ,Reg/Trd,StcSMem (MB),DymSMem (MB),"
          "Bytes (MB),Throughput (MBps),SrcMemKd,DstMemKd,Device,Ctx,GreenCtx,Strm,Name")


def trace(tmp_path, steps: int = 6, step_ns: int = 20_000_000, gap_ns: int = 500, starts=None,
          first_gap_ns: int | None = None) -> str:
    """A decode loop: each step one graph launch (one CorrId) of 5 kernels of 1 µs on stream 7, 0.5 µs
    apart (the first launch ``first_gap_ns`` apart), and 3 on a side stream 13 with 2 µs between; an H2D
    copy node first; a prefill pause before step 4, or the launches at ``starts`` (ms)."""
    rows, corr = [HEADER], 100
    for k in range(steps):
        t = 1_000_000_000 + (int(starts[k] * 1e6) if starts else k * step_ns + (300_000_000 if k >= 4 else 0))
        copy = "[CUDA memcpy Host-to-Device]"
        rows.append(f"{t - 5000},800,{corr},,,,,,,,,,0.5,625,Pinned,Device,0 (NVIDIA),1,,7,{copy}")  # a graph node
        gap = first_gap_ns if k == 0 and first_gap_ns is not None else gap_ns
        for i in range(5):
            rows.append(f"{t + i * (1000 + gap)},1000,{corr},1,1,1,128,1,1,32,0,0,,,,,0 (NVIDIA),1,,7,kernel_a")
        for i in range(3):
            rows.append(f"{t + 100 + i * 3000},1000,{corr},1,1,1,128,1,1,32,0,0,,,,,0 (NVIDIA),1,,13,kernel_b")
        corr += 10
    path = tmp_path / "ft-upstream_cuda_gpu_trace.csv"
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_the_step_time_and_the_gap_per_stream_come_out_of_the_trace(tmp_path):
    path = trace(tmp_path)
    assert len(nsys.kernels(path)) == 6 * 8  # the copies are no kernels
    f = nsys.figures(path)
    assert f["launches"] == 6
    assert f["ms_per_step"] == pytest.approx(20.0)  # the 320 ms pause before step 4 is left out
    assert f["gap_us"] == pytest.approx({"s1": 0.5, "s2": 2.0})


def test_a_step_is_the_median_of_the_decode_loops_intervals_without_the_pauses(tmp_path):
    """Steps of 18-22 ms with two pauses of 300 ms between: 20 ms a step, the pauses left out (with them
    the median would be 21)."""
    starts = [0, 18, 37, 57, 357, 378, 400, 700]
    assert nsys.figures(trace(tmp_path, steps=8, starts=starts))["ms_per_step"] == pytest.approx(20.0)


def test_a_graphs_first_launch_is_left_out_of_the_gaps(tmp_path):
    """The first launch (uploading a never-uploaded graph) runs its kernels 9.5 µs apart, every later one
    0.5 µs: the steady figure is 0.5."""
    f = nsys.figures(trace(tmp_path, steps=2, first_gap_ns=9500))
    assert f["gap_us"]["s1"] == pytest.approx(0.5)


def test_the_table_has_a_row_per_trace(tmp_path, capsys):
    path = trace(tmp_path)
    assert cli.main(["--from-nsys", path, path]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| build (trace) | graph launches | ms per decode step |")
    assert out[2] == f"| {path} | 6 | 20.000 | s1 0.50, s2 2.00 |" and out[3] == out[2]


@pytest.mark.parametrize("text, why", [
    ("Start (ns),Duration (ns)\n1,2\n", "has no column 'CorrId', 'Strm'"),
    ("", "has no column"),
    (HEADER + "\n1,1000,5,,,,,,,,,,,,,,0,1,,7,k\n", "0 graph launch(es) in the trace"),  # no node trace
])
def test_a_file_that_is_no_such_trace_is_refused_in_one_line(tmp_path, capsys, text, why):
    path = tmp_path / "x.csv"
    path.write_text(text)
    assert cli.main(["--from-nsys", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err and "cuda_gpu_trace" in err, err


def test_a_missing_file_is_named(tmp_path, capsys):
    assert cli.main(["--from-nsys", str(tmp_path / "none.csv")]) == 1
    assert "--from-nsys" in capsys.readouterr().err


def test_json_is_refused_with_from_nsys(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--from-nsys", trace(tmp_path), "--json", str(tmp_path / "o.json")])
    assert capsys.readouterr().err.endswith("error: --json is written by the rig, --engine, --serve, --startup, "
                                            "--deadlock, --from-json, not by --from-nsys\n")
