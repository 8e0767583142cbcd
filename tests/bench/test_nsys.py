"""``bench nsys``: per trace and per graph, Nsight Systems' kernel trace with the stall at the PLE WAIT
on its own, held to traces whose figures are known, in the layouts ``nsys stats --report
cuda_gpu_trace --format csv`` writes (its --output file, its stdout, with and without GreenCtx)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from freetoken_graphfix_bench import cli, nsys

COLUMNS = ["Start (ns)", "Duration (ns)", "CorrId", "GrdX", "GrdY", "GrdZ", "BlkX", "BlkY", "BlkZ", "Reg/Trd",
           "StcSMem (MB)", "DymSMem (MB)", "Bytes (MB)", "Throughput (MBps)", "SrcMemKd", "DstMemKd", "Device", "Ctx",
           "GreenCtx", "Strm", "Name"]
PREAMBLE = ["NOTICE: Existing SQLite export found: ft-auto.sqlite",
            "        It is assumed file was previously exported from: ft-auto.nsys-rep",
            "        Consider using --force-export=true if needed.", "",
            "Processing [ft-auto.sqlite] with [/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/reports/"
            "cuda_gpu_trace.py]... ", "", " ** CUDA GPU Trace (cuda_gpu_trace):", ""]
# a decode graph's launch on stream 7: kernels of 1 µs with these gaps (µs) after each, the stall third;
# and two kernels on a side stream 13, one before the stall and one after it
GAPS = [0.5, 0.5, None, 1.5, 1.5]
NAME = '"void flashlib::attention<128, 64>(float const*, int, bool)"'  # a quoted name holding commas


def launch_rows(t0: int, corr: int, stall_ns: int, extra: int, green: bool, quoted: bool) -> list[str]:
    """One graph launch at ``t0`` ns: ``len(GAPS) + 1 + extra`` kernels on stream 7, the stall after the
    third; a memcpy node first (not a kernel)."""
    rows, t = [], t0

    def row(start: int, dur: int, stream: int, name: str) -> str:
        cells = [str(start), str(dur), str(corr), "1", "1", "1", "128", "1", "1", "32", "0.000", "0.000", "", "", "",
                 "", "NVIDIA H200 (0)", "1", *(["0"] if green else []), str(stream), name]
        return ",".join(f'"{c}"' if quoted and not c.startswith('"') else c for c in cells)

    rows.append(row(t - 5000, 800, 7, "[CUDA memcpy Host-to-Device]"))
    gaps = GAPS + [0.5] * extra
    rows.append(row(t + 200, 1000, 13, "side_kernel"))
    for gap in gaps:
        rows.append(row(t, 1000, 7, NAME))
        t += 1000 + (stall_ns if gap is None else int(gap * 1000))
    rows.append(row(t, 1000, 7, NAME))
    rows.append(row(t + 300, 1000, 13, "side_kernel"))
    return rows


def trace(tmp_path, name: str, stall_ns: int, *, green: bool = True, quoted: bool = True, stdout: bool = False,
          first_stall_ns: int | None = None) -> str:
    """Two graphs, as ``bench engine``'s workload launches them: four launches of the larger (bs 2: two
    more kernels), then four of the smaller (bs 1), 20 ms apart, the first launch of each slower."""
    header = [c for c in COLUMNS if green or c != "GreenCtx"]
    rows = (PREAMBLE if stdout else []) + [",".join(f'"{c}"' if quoted else c for c in header)]
    corr = 100
    for k in range(8):
        first = k in (0, 4) and first_stall_ns is not None
        rows += launch_rows(1_000_000_000 + 20_000_000 * k, corr, first_stall_ns if first else stall_ns,
                            2 if k < 4 else 0, green, quoted)
        corr += 10
    path = tmp_path / f"{name}_cuda_gpu_trace.csv"
    path.write_text("\n".join(rows) + ("\n\n" if stdout else "\n"))
    return str(path)


def test_each_graph_gets_its_own_figures_with_the_stall_at_the_wait_apart(tmp_path):
    got = nsys.read(trace(tmp_path, "ft-auto", 2_170_000))
    assert [g.kernels for g in got.graphs] == [10, 8]  # in order of first launch: never pooled
    big, small = got.graphs
    assert (big.launches, small.launches) == (4, 4)
    assert big.stall == nsys.Stall(3, 2170.0, 2170.0, 2170.0)  # after the third kernel of stream 7
    assert small.stall.after == 3 and small.stall.median_us == pytest.approx(2170.0)
    # the stall left out of the gaps: 0.5, 0.5, 1.5, 1.5 (+ 0.5, 0.5 in the larger graph)
    assert small.gap_us["s1"] == pytest.approx(1.0) and big.gap_us["s1"] == pytest.approx(0.5)
    # the span without the stall: five kernels and four gaps on stream 7 (9 µs), then its last kernel
    # and the side stream's, which ends 1.3 µs after that last kernel starts; busy: the union
    assert small.span_us == pytest.approx(10.3) and small.busy_us == pytest.approx(6 + 0.2 + 0.3)
    assert big.span_us == pytest.approx(13.3) and big.busy_us == pytest.approx(8 + 0.2 + 0.3)


def test_the_side_streams_gap_loses_the_time_it_overlaps_the_stall(tmp_path):
    small = nsys.read(trace(tmp_path, "ft-auto", 2_170_000)).graphs[1]
    # stream 13's two kernels: the first ends at 1.2 µs, the second starts 0.3 µs after stream 7's last
    # kernel, which starts at 9 µs plus the stall: the gap is 8.1 µs once the stall is left out
    assert small.gap_us["s2"] == pytest.approx(9.3 - 1.2)


def test_a_graphs_first_launch_is_its_own_figure(tmp_path):
    """The first launch (the implicit upload of a never-uploaded graph) stalls 9 ms; later ones 0.26 ms."""
    got = nsys.read(trace(tmp_path, "ft-upstream", 260_000, first_stall_ns=9_000_000))
    assert all(g.stall.median_us == pytest.approx(260.0) and g.stall.high_us == pytest.approx(260.0)
               for g in got.graphs)


@pytest.mark.parametrize("green, quoted, stdout", [(True, True, False), (False, True, False), (True, False, False),
                                                   (True, True, True), (False, True, True)])
def test_nsys_output_is_read_as_it_comes(tmp_path, green, quoted, stdout):
    """The --output file and the stdout with its "Processing [...]" and NOTICE lines, with and without the
    GreenCtx column, quoted or not, kernel names holding commas: the same figures."""
    got = nsys.read(trace(tmp_path, "ft-auto", 2_170_000, green=green, quoted=quoted, stdout=stdout))
    assert [(g.kernels, g.launches, round(g.stall.median_us)) for g in got.graphs] == [(10, 4, 2170), (8, 4, 2170)]


def test_the_report_compares_builds_on_what_the_profiler_leaves_comparable(tmp_path, capsys):
    """The same kernels under both builds, the WAIT held 0.26 ms in one trace and 2.17 ms in the other:
    busy time, span and gaps agree, and nothing reads the stall as a cost of auto."""
    up, auto = trace(tmp_path, "ft-upstream", 260_000), trace(tmp_path, "ft-auto", 2_170_000)
    assert cli.main(["nsys", up, auto]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "graph 1 (10 kernels a launch; bs 2 under bench engine's workload):"
    assert f"| {up} | 4 | 8.5 | 13.3 | after kernel 3, 0.260 | s1 0.50, s2 11.10 |" in lines
    assert f"| {auto} | 4 | 8.5 | 13.3 | after kernel 3, 2.170 | s1 0.50, s2 11.10 |" in lines
    assert f"- {auto} vs {up} (comparable under the profiler): busy +0.00%, span without the stall +0.00%, " \
           "s1 gap 0.50 vs 0.50 µs" in lines
    said = [ln for ln in lines if "the profiler's own launch time" in ln]
    assert len(said) == 4 and all("not a cost of this build" in ln for ln in said)  # each trace, each graph
    assert "ms per decode step" not in out and "COSTS" not in out and "+48" not in out
    assert lines[-1].startswith("The decode step and the upload's cost come from an unprofiled run (bench engine")


def test_a_short_stall_is_not_called_the_profilers(tmp_path):
    """Unprofiled-like: the WAIT passed 20 µs after the kernels reached it; no profiler line."""
    got = nsys.read(trace(tmp_path, "ft-auto", 20_000))
    assert got.graphs[0].stall.median_us == pytest.approx(20.0) and nsys.profiler_lines(got) == []


def test_a_graph_without_a_stall_has_none(tmp_path, monkeypatch):
    monkeypatch.setattr(nsys, "STALL_US", 10_000.0)  # nothing long enough: the gaps are all gaps
    got = nsys.read(trace(tmp_path, "ft-auto", 2_170_000))
    assert got.graphs[0].stall is None and got.graphs[0].gap_us["s1"] == pytest.approx(0.5)


@pytest.mark.parametrize("text, why", [
    ('"Start (ns)","Duration (ns)"\n"1","2"\n', "row 1: no column 'CorrId', 'Strm', 'Name'"),
    ("", "no header row"),
    ("Processing [x.sqlite] with [cuda_gpu_trace.py]...\n\n", "no header row"),
    (",".join(COLUMNS) + "\n", "a header and no kernel row"),
    (",".join(COLUMNS) + "\n1,1000,5,,,,,,,,,,,,,,0,1,,7,k\n", "no graph launch in the trace"),  # no node tracing
    (",".join(COLUMNS) + "\n1,1000,5,,,,,,,,,,,,,,0,1,,7,k\n" + ",".join(COLUMNS) + "\n",
     "row 3: a second header (two traces in one file?)"),
    (",".join(COLUMNS) + "\nStart,1000,5,,,,,,,,,,,,,,0,1,,7,k\n", "row 2: 'Start' / '1000' is no start and duration"),
    (",".join(COLUMNS) + "\n1,1000,5,7,k\n", "row 2: 5 fields for the header's 21"),
    (",".join(COLUMNS) + "\nnan,1000,5,,,,,,,,,,,,,,0,1,,7,k\n", "row 2: 'nan' / '1000' is no start and duration"),
    (",".join(COLUMNS) + "\n1,inf,5,,,,,,,,,,,,,,0,1,,7,k\n", "row 2: '1' / 'inf' is no start and duration"),
    (",".join(COLUMNS) + "\n1,-3,5,,,,,,,,,,,,,,0,1,,7,k\n", "row 2: '1' / '-3' is no start and duration"),
    (",".join(COLUMNS) + '\n1,1000,5,,,,,,,,,,,,,,0,1,,7,"' + "k" * 200_000 + '"\n',
     "row 2: field larger than field limit (131072) (nothing in a trace is that long)"),
])
def test_a_file_that_is_no_such_trace_is_refused_in_one_line_naming_it(tmp_path, capsys, text, why):
    path = tmp_path / "x.csv"
    path.write_text(text)
    assert cli.main(["nsys", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err and str(path) in err and "cuda_gpu_trace" in err, err


def test_a_missing_file_is_named(tmp_path, capsys):
    assert cli.main(["nsys", str(tmp_path / "none.csv")]) == 1
    assert str(tmp_path / "none.csv") in capsys.readouterr().err


def test_options_nsys_does_not_read_are_refused(tmp_path, capsys):
    code = cli.main(["nsys", trace(tmp_path, "ft-auto", 2_170_000), "--json", str(tmp_path / "o.json")])
    assert code == 2 and "unrecognized arguments: --json" in capsys.readouterr().err


# ---- real traces: nsys 2025.3.1 on the H200, the 48-layer synthetic qwen4_exp, 4,096-token context ----
# (bench engine --arms upstream|auto --rounds 1 --copies 0 --trace-steps 0 --replays 1 --no-warmup under
# nsys profile --trace=cuda --cuda-graph-trace=node; kept: the first four launches of each graph)
TRACES = Path(__file__).resolve().parents[1] / "traces"


def real_trace(tmp_path, build: str, preamble: bool = False) -> str:
    path = tmp_path / f"ft-{build}_cuda_gpu_trace.csv"
    with gzip.open(TRACES / f"ft-{build}_cuda_gpu_trace.csv.gz", "rt") as fh:
        path.write_text(("\n".join(PREAMBLE) + "\n" if preamble else "") + fh.read())
    return str(path)


def test_the_shipped_gzipped_traces_read_as_they_are(tmp_path):
    """A ``.gz`` trace is read gunzipped on the fly, to the same figures as the plain file."""
    assert nsys.read(str(TRACES / "ft-auto_cuda_gpu_trace.csv.gz")).graphs == nsys.read(
        real_trace(tmp_path, "auto")).graphs


def test_a_large_trace_is_read_as_a_stream(tmp_path, monkeypatch):
    """The file is never read whole: the reader gets an object that gives lines one at a time and nothing else."""
    class LinesOnly:
        def __init__(self, fh):
            self.fh = fh

        def __iter__(self):
            return iter(self.fh)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    opened = nsys._opened
    monkeypatch.setattr(nsys, "_opened", lambda path: LinesOnly(opened(path)))
    assert nsys.read(real_trace(tmp_path, "upstream")).graphs[0].kernels == 1768


@pytest.mark.parametrize("build", ["upstream", "auto"])
def test_a_real_trace_keeps_each_graph_and_its_stall_apart(tmp_path, build):
    """Two graphs (bs 2's 1,768 kernels, bs 1's 1,684), never pooled; each stalls milliseconds at the PLE
    WAIT (after kernel 78 or 77, its PLE lookup) while its kernels run back to back: the span without
    the stall is the busy time plus gaps under a microsecond, not the stall's milliseconds."""
    got = nsys.read(real_trace(tmp_path, build))
    assert [(g.kernels, g.launches) for g in got.graphs] == [(1768, 4), (1684, 4)]
    for g, after in zip(got.graphs, (78, 77), strict=True):
        assert g.stall.after == after and 3000 < g.stall.median_us < 6000
        assert 2700 < g.busy_us < 3100 and g.busy_us < g.span_us < 1.25 * g.busy_us
        assert 0.2 < g.gap_us["s1"] < 0.4


def test_nsys_stdout_with_its_preamble_reads_as_its_output_file(tmp_path):
    (tmp_path / "file").mkdir()
    (tmp_path / "out").mkdir()
    plain = nsys.read(real_trace(tmp_path / "file", "auto"))
    assert nsys.read(real_trace(tmp_path / "out", "auto", preamble=True)).graphs == plain.graphs


def test_a_real_trace_read_without_the_stall_apart_fails_its_check(tmp_path, monkeypatch):
    """The check above can fail: with no stall found, the span carries the profiler's milliseconds."""
    monkeypatch.setattr(nsys, "STALL_US", 1e9)
    g = nsys.read(real_trace(tmp_path, "auto")).graphs[0]
    assert g.stall is None and g.span_us > 1.25 * g.busy_us


def test_on_a_real_pair_the_builds_read_alike_and_the_stall_is_the_profilers(tmp_path, capsys):
    """upstream and auto as the H200 traced them: the kernels' busy time and span within 1% and the
    same gaps; the stall, milliseconds in both, said to be the profiler's, and no step time printed."""
    up, auto = real_trace(tmp_path, "upstream"), real_trace(tmp_path, "auto")
    for a, b in zip(nsys.read(up).graphs, nsys.read(auto).graphs, strict=True):
        assert abs(b.busy_us / a.busy_us - 1) < 0.01 and abs(b.span_us / a.span_us - 1) < 0.01
        assert abs(b.gap_us["s1"] - a.gap_us["s1"]) < 0.05
    assert cli.main(["nsys", up, auto]) == 0
    out = capsys.readouterr().out
    assert sum("the profiler's own launch time" in line for line in out.splitlines()) == 4
    assert "ms per decode step" not in out and "COSTS" not in out
