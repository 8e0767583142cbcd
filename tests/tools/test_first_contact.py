"""What a new user meets on a CPU machine before anything is measured: FreeToken importable whatever
the shim lacks, one line for each refusal (naming the input and what is accepted), output that
survives a closed pipe, and reports that say only what they can support."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib

from freetoken_graphfix_bench import cli as bench_cli
from tests.helpers.processes import child_env, run_cli
from tests.tools.test_patches import file_bound

ROOT = Path(__file__).resolve().parents[2]


def python(code: str, value: str | None = "auto", **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=child_env(value), capture_output=True, text=True,
                          timeout=120, **kwargs)


@pytest.mark.parametrize("missing", ["wrapt"])  # the shim's one dependency FreeToken does not need itself
def test_freetoken_imports_as_shipped_when_the_shim_lacks_a_dependency(missing):
    """An offline install with --no-deps can leave out wrapt: with the shim armed by the .pth,
    FreeToken's graph module must still import, keep its own upload, and one ERROR line says why."""
    out = python(f"import sys; sys.modules[{missing!r}] = None\n"
                 "import freetoken.engine.graph as g\n"
                 "print(g._upload_graph.__module__, g._upload_graph.__qualname__)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "freetoken.engine.graph _upload_graph"  # FreeToken's own, unwrapped
    errors = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "ERROR" in errors[0] and missing.split(".")[0] in errors[0], out.stderr
    assert "FreeToken keeps its own upload" in errors[0]


def test_the_api_without_wrapt_says_why_and_patches_nothing():
    """status() and install() where wrapt is missing: no ModuleNotFoundError, patched False with the
    reason doctor gives, one ERROR line from install(), FreeToken untouched."""
    out = python("import sys; sys.modules['wrapt'] = None\nimport freetoken_graphfix as g\n"
                 "g.install('auto'); g.uninstall(); s = g.status()\n"
                 "import freetoken.engine.graph as graph\n"
                 "print(s['installed'], s['patched'], s['reason'], graph._upload_graph.__module__)", value=None)
    assert out.returncode == 0, out.stderr
    installed, patched, reason = out.stdout.split(" ", 2)
    assert (installed, patched) == ("False", "False") and "cannot be loaded" in reason and "wrapt" in reason
    assert reason.rstrip().endswith("freetoken.engine.graph")
    errors = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "not installed: cannot be loaded" in errors[0], out.stderr


def test_doctor_and_patch_without_wrapt(tmp_path):
    """doctor names the missing dependency as its problem; patch never needed wrapt at all."""
    code = ("import sys; sys.modules['wrapt'] = None\nfrom freetoken_graphfix.tools.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    doctor = subprocess.run([sys.executable, "-c", code, "doctor", "--no-bench"], env=child_env(None),
                            capture_output=True, text=True, timeout=120)
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr
    lines = dict(line.strip().split(": ", 1) for line in doctor.stdout.splitlines() if ": " in line)
    assert lines["shim"].startswith("PROBLEM: cannot be loaded: ") and "wrapt" in lines["shim"]
    assert lines["shim"].endswith("; fix: pip install wrapt")
    for label in ("freetoken", "patch series", "bootstrap .pth", "shim in new processes", "auto", "off"):
        assert label in lines, label  # the report goes on past the problem
    patch = subprocess.run([sys.executable, "-c", code, "patch", "check", "--repo", str(tmp_path)],
                           env=child_env(None), capture_output=True, text=True, timeout=120)
    assert "Traceback" not in patch.stderr and "wrapt" not in patch.stderr, patch.stderr


def test_the_patch_script_runs_beside_its_own_package_without_wrapt(tmp_path):
    """scripts/freetoken-patch runs this checkout's package, with an interpreter that has neither the
    package installed nor wrapt, from any directory."""
    env = {k: v for k, v in child_env(None).items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-S", "-c",
                          "import runpy, sys; sys.modules['wrapt'] = None; sys.argv = sys.argv[1:];"
                          "runpy.run_path(sys.argv[0], run_name='__main__')",
                          str(ROOT / "scripts" / "freetoken-patch"), "check", "--repo", str(tmp_path)],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr and "No module named" not in out.stderr, out.stderr
    assert out.returncode == 1 and "error:" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_closed_pipe_ends_the_output_quietly():
    """`doctor | head -3`: the reader leaves; no BrokenPipeError traceback, a pipe's exit code."""
    proc = subprocess.Popen([sys.executable, "-m", "freetoken_graphfix", "doctor", "--no-bench"], env=child_env(None),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # before the first line is written
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 128 + signal.SIGPIPE and "Traceback" not in err and "BrokenPipe" not in err, err


def test_doctor_counts_a_blank_variable_as_set_like_the_pth_does():
    """The .pth arms the shim for any non-empty FT_GRAPH_UPLOAD; a blank one means auto."""
    out = run_cli("doctor", "--no-bench", env=child_env(" "))
    line = next(ln for ln in out.stdout.splitlines() if "shim in new processes" in ln)
    assert "installed:" in line and "NOT" not in line and "mode auto" in line, line
    armed = python("import sys; print('freetoken_graphfix' in sys.modules)", value=" ")
    assert armed.stdout.strip() == "True"  # what doctor says, the .pth does


def test_the_console_script_exits_130_on_an_early_ctrl_c(tmp_path):
    """A Ctrl-C while the command line's modules are still importing: no traceback, 130, for the
    console script's entry point as for python -m."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts["freetoken-graphfix"].split(":")
    hook = tmp_path / "early.py"  # the interrupt arrives while freetoken_graphfix.tools.cli is being imported
    hook.write_text("import sys\nclass Interrupt:\n    def find_spec(self, name, path=None, target=None):\n"
                    "        if name == 'freetoken_graphfix.tools.cli':\n            raise KeyboardInterrupt\n"
                    "sys.meta_path.insert(0, Interrupt())\n")
    out = subprocess.run([sys.executable, "-c", f"import runpy; runpy.run_path({str(hook)!r}); import {module}; "
                          f"{module}.{func}()"], env=child_env(None), capture_output=True, text=True, timeout=60)
    assert out.returncode == 130 and out.stderr == "", out.stderr


def test_startup_with_too_few_runs_is_refused_before_it_runs(tmp_path):
    """Fewer than eight runs cannot give a 95% interval: refused up front (one line, exit 2), not run
    for minutes and then left unjudged; eight run, and the JSON is strict (no NaN)."""
    record = tmp_path / "s.json"
    out = run_cli("bench", "startup", "--runs", "3", "--json", str(record))
    assert out.returncode == 2 and out.stdout == "" and not record.exists()
    assert out.stderr.strip().splitlines()[-1].endswith(
        "error: bench startup: argument --runs: '3': accepted values are whole numbers of 8 or more")
    out = run_cli("bench", "startup", "--runs", "8", "--json", str(record))
    assert out.returncode == 0, out.stderr
    assert "nan" not in out.stdout and "target within +5 ms: " in out.stdout and "not judged" not in out.stdout
    import json

    assert "NaN" not in record.read_text() and json.loads(record.read_text())["kind"] == "startup"


@pytest.mark.parametrize("args, message", [
    (["serve", "--markdown", "r.md"], "unrecognized arguments: --markdown r.md"),
    (["deadlock", "--markdown", "r.md"], "unrecognized arguments: --markdown r.md"),
    (["deadlock", "--plot", "p.png"], "unrecognized arguments: --plot p.png"),
    (["startup", "--plot", "p.png"], "unrecognized arguments: --plot p.png"),
])
def test_options_nothing_would_honour_are_refused(tmp_path, capsys, args, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = bench_cli.main(args)
    assert code == 2 and capsys.readouterr().err.strip().splitlines()[-1].endswith(message)
    assert list(tmp_path.iterdir()) == []


def test_an_output_file_that_cannot_be_written_is_refused_before_the_run(tmp_path):
    """A read-only --json, as a user whom its permissions bind meets it: refused in one line up front."""
    ro = tmp_path / "r.json"
    ro.write_text("{}")
    ro.chmod(0o444)
    out = subprocess.run(file_bound([sys.executable, "-m", "freetoken_graphfix", "bench", "startup", "--json",
                                     str(ro)]), env=child_env(None), capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and f"--json {str(ro)!r}: cannot be written (Permission denied)" in out.stderr
    assert ro.read_text() == "{}" and "Traceback" not in out.stderr


def test_write_model_in_a_read_only_folder_is_one_line(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    out = subprocess.run(file_bound([sys.executable, "-m", "freetoken_graphfix", "bench", "write-model",
                                     str(locked / "m"), "--family", "llama"]), env=child_env(None),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"write-model {str(locked / 'm')!r}: cannot write in {str(locked)!r} (Permission denied)" in out.stderr
    assert list(locked.iterdir()) == []


def test_a_written_model_folder_follows_the_umask(tmp_path):
    out = subprocess.run([sys.executable, "-c", "import os, sys; os.umask(0o022); from freetoken_graphfix_bench "
                          "import cli; sys.exit(cli.main(sys.argv[1:]))", "write-model", str(tmp_path / "m"),
                          "--family", "llama"], env=child_env(None), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "m").stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("module, args", [
    ("freetoken", ["engine", "--model", "{llama}", "--", "--dummy-weight"]),
    ("tokenizers", ["write-model", "{new}", "--family", "qwen3"]),
])
def test_bench_without_a_module_it_needs_is_one_line(tmp_path, module, args):
    """Right after `pip install .`, FreeToken or the tokenizer library may be missing: one line naming
    the module and how to install it, exit 1, nothing written."""
    llama = tmp_path / "llama"
    assert run_cli("bench", "write-model", str(llama), "--family", "llama").returncode == 0
    args = [a.format(llama=llama, new=tmp_path / "new") for a in args]
    code = (f"import sys; sys.modules[{module!r}] = None\nfrom freetoken_graphfix_bench import benchmark, cli\n"
            "benchmark.cuda_missing = lambda: None  # as on a GPU machine\nsys.exit(cli.main(sys.argv[1:]))")
    out = subprocess.run([sys.executable, "-c", code, *args], env=child_env(None), capture_output=True, text=True,
                         timeout=120)
    err = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(err) == 1 and "Traceback" not in out.stderr, out.stderr
    assert f"needs the Python module {module!r}, which is not installed here (pip install {module}" in err[0]
    assert not (tmp_path / "new").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["llama"]


def test_no_gpu_is_said_before_freetoken_is_imported(tmp_path):
    """Without a CUDA device the engine bench refuses before importing FreeToken (seconds, not its
    import's ten), and nothing of FreeToken's log is printed."""
    llama = tmp_path / "llama"
    assert run_cli("bench", "write-model", str(llama), "--family", "llama").returncode == 0
    code = ("import sys, torch; torch.cuda.is_available = lambda: False\nfrom freetoken_graphfix_bench import cli\n"
            "code = cli.main(sys.argv[1:]); print(sorted(m for m in sys.modules if m.startswith('freetoken.')))\n"
            "sys.exit(code)")
    out = subprocess.run([sys.executable, "-c", code, "engine", "--model", str(llama), "--", "--dummy-weight"],
                         env=child_env(None), capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stdout.strip() == "[]", out.stdout
    assert out.stderr.strip().splitlines() == [
        "freetoken-graphfix: error: bench engine: no CUDA device; nothing to measure (bench startup, "
        "report, nsys and write-model need none)"]


def test_a_sigterm_to_the_startup_bench_leaves_no_venvs_behind(tmp_path):
    env = {**child_env(None), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "freetoken_graphfix", "bench", "startup", "--runs",
                             "100000"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(tmp_path.glob("graphfix-startup-*/with/bin/python")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.5)  # into the timed runs
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert list(tmp_path.glob("graphfix-startup-*")) == []
