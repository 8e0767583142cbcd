#!/usr/bin/env python3
"""The GPU acceptance run: every GPU claim a user and a maintainer rely on, in one process, against this
package's wheel installed into the site as a user installs it.

    python3 scripts/gpu_acceptance.py --out DIR --freetoken-wheel WHL --freetoken-tests DIR \\
        --rebuild-test FILE [--commit SHA] [--budget SECONDS] [--part all|user|series]

Steps run in a scratch folder, never the checkout, with PYTHONPATH unset, so that only the installed
package can answer: ``doctor`` with its short check; ``run -- python script.py`` on FreeToken's ``LLM``
over the synthetic qwen4_exp; ``bench rig`` (short), ``launch`` and ``engine``, and ``bench report`` on
each record; the patch series on a 0.2.1 tree with FreeToken's qwen4_exp tests; FreeToken's own rebuild
gate (``tests/e2e/test_cache_rebuild.py``, one line added so it can pass server options) with the
series, on the 320-layer synthetic qwen4_exp in wait-sync and on a dummy-weight llama. One line per
step (PASS or FAIL, its time), a table last; every log in ``DIR/acceptance.log``, the table in
``DIR/acceptance.json``. Exits 1 when a step failed. Needs the standard library alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
CLI = ["freetoken-graphfix"]
QWEN_SERVER_ARGS = ("--attention-backend qsa_sparse --moe-strategy fused --ple-backend disk --cuda-graph-max-bs 2 "
                    "--max-running-requests 2 --max-prefill-length 1024 --cache-type radix --text-model-only")
LLAMA_SERVER_ARGS = "--dummy-weight --attention-backend triton"
# The rebuild gate boots its server with FreeToken's default options, which neither model here runs on;
# this one line, after the server's own options, lets it pass theirs (the cover letter states it).
HOOK_ANCHOR = '"--num-pages", str(BOOT_PAGES),\n'
HOOK_LINE = '*__import__("shlex").split(os.environ.get("FREETOKEN_REBUILD_SERVER_ARGS", "")),\n'
RUN_SCRIPT = '''\
import json, sys
from freetoken.core import SamplingParams
from freetoken.llm import LLM
from freetoken.server.args import parse_args
import dataclasses
from freetoken.scheduler.config import SchedulerConfig
import freetoken_graphfix

args, _ = parse_args(["--model", sys.argv[1], *sys.argv[2].split()])
own = ("model_path", "tp_info", "dtype", "offline_mode", "_unique_suffix")
llm = LLM(sys.argv[1], dtype=args.dtype, **{f.name: getattr(args, f.name) for f in dataclasses.fields(SchedulerConfig)
                                            if f.init and f.name not in own})
params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
outs = llm.generate([[5, 6, 7, 8], [9, 10, 11]], params) + llm.generate([[12, 13, 14]], params)
print(json.dumps({"tokens": [o["token_ids"] for o in outs], "status": freetoken_graphfix.status()}))
'''


@dataclass
class Result:
    """One step: PASS or FAIL, why, and how long it took."""

    step: str
    passed: bool
    seconds: float
    detail: str


@dataclass
class Run:
    """Where the run writes, what it has left of its budget, and the results so far."""

    out: Path
    work: Path
    deadline: float
    results: list[Result] = field(default_factory=list)

    def log(self, text: str) -> None:
        """Append to the one log that comes back whole."""
        with open(self.out / "acceptance.log", "a", encoding="utf-8") as fh:
            fh.write(text if text.endswith("\n") else text + "\n")

    def command(self, argv: list[str], timeout: float, env: dict[str, str] | None = None,
                cwd: Path | None = None) -> subprocess.CompletedProcess:
        """``argv`` in the scratch folder, with the installed package only; its output in the log."""
        left = self.deadline - time.monotonic()
        base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FT_GRAPH_UPLOAD")}
        self.log(f"$ {' '.join(argv)}  (env {env or {}}, cwd {cwd or self.work})")
        try:
            proc = subprocess.run(argv, cwd=cwd or self.work, env={**base, **(env or {})}, capture_output=True,
                                  text=True, timeout=max(1.0, min(timeout, left)))
        except subprocess.TimeoutExpired as exc:
            self.log(f"{_text(exc.stdout)}{_text(exc.stderr)}TIMED OUT after {exc.timeout:.0f} s")
            return subprocess.CompletedProcess(argv, 124, _text(exc.stdout), _text(exc.stderr))
        self.log(f"{proc.stdout}{proc.stderr}rc {proc.returncode}")
        return proc

    def step(self, name: str, body: Callable[[], str]) -> None:
        """Run one step: ``body`` returns what it found, or raises ``StepFailed`` saying why not."""
        self.log(f"\n===== {name}")
        t0 = time.monotonic()
        if time.monotonic() >= self.deadline:
            passed, detail = False, "not run: the budget was spent"
        else:
            try:
                passed, detail = True, body()
            except StepFailed as exc:
                passed, detail = False, str(exc)
        result = Result(name, passed, round(time.monotonic() - t0, 1), detail)
        self.results.append(result)
        self.log(f"----- {'PASS' if passed else 'FAIL'} {name}: {detail}")
        print(f"{'PASS' if passed else 'FAIL'} {name} ({result.seconds:.0f} s): {detail}", flush=True)


class StepFailed(Exception):
    """A step's check did not hold; the message says which."""


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def require(ok: bool, why: str) -> None:
    """Fail the step with ``why`` unless ``ok``."""
    if not ok:
        raise StepFailed(why)


def ran(proc: subprocess.CompletedProcess, what: str) -> str:
    """``proc``'s stdout, or the step's failure with its exit code and last line."""
    last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
    require(proc.returncode == 0, f"{what} exited {proc.returncode}: {last[:200]}")
    return proc.stdout


def installed_here(found: dict[str, str]) -> str:
    """The package answering is an installed wheel with its ``.pth``, not this checkout."""
    where = Path(found["package"]).resolve()
    require(CHECKOUT not in where.parents, f"freetoken_graphfix came from the checkout ({where}), not the site")
    require(bool(found["pth"]), "the bootstrap .pth is not in the site: new processes would not get the shim")
    return f"freetoken-graphfix {found['version']} from {where.parent}; FreeToken {found['freetoken']}"


def doctor_lines(stdout: str) -> str:
    """doctor's short check: the protected first launch not blocked, the unprotected one blocked."""
    lines = dict(line.strip().split(": ", 1) for line in stdout.splitlines() if ": " in line)
    protected, control = lines.get("protected launch", ""), lines.get("unprotected control", "")
    require(bool(protected), "doctor printed no short check")
    require("not blocked" in protected, f"protected launch: {protected}")
    require("BLOCKED" in control, f"unprotected control: {control or 'missing'}")
    return f"protected: {protected.split(',')[0]}, {protected.split(', ')[1]}; control: {control.split(' on ')[0]}"


def every_graph_deferred(stdout: str) -> str:
    """The script's status: every captured graph deferred (a PLE wait-sync WAIT), and tokens generated."""
    found = json.loads(stdout.strip().splitlines()[-1])
    graphs = [g for p in found["status"]["passes"] for g in p["graphs"]]
    require(bool(graphs), f"no graph captured: {found['status']['reason']}")
    actions = sorted({g["action"] for g in graphs})
    require(actions == ["deferred"], f"graph actions {actions}, not all deferred")
    require(all(len(t) > 0 for t in found["tokens"]), "a request generated no token")
    return f"{len(graphs)} graphs deferred, {sum(map(len, found['tokens']))} tokens generated"


def same_report(run_stdout: str, report_stdout: str) -> str:
    """``bench report`` on a run's record prints the run's own report."""
    require(bool(report_stdout.strip()) and report_stdout.strip() in run_stdout,
            "bench report printed other figures than the run")
    return f"{len(report_stdout.strip().splitlines())} lines, the same as the run's"


def pytest_counts(stdout: str) -> str:
    """pytest's closing counts (``3 passed, 1 skipped``)."""
    found = re.findall(r"(\d+) (passed|failed|skipped|error|errors)", stdout.strip().splitlines()[-1]
                       if stdout.strip() else "")
    return ", ".join(f"{n} {what}" for n, what in found) or "no counts"


def with_hook(source: str) -> str:
    """FreeToken's rebuild gate with the one line that passes ``FREETOKEN_REBUILD_SERVER_ARGS`` to its server."""
    require(source.count(HOOK_ANCHOR) == 1, "the rebuild gate's server command is not where the hook expects it")
    indent = source.split(HOOK_ANCHOR)[0].rsplit("\n", 1)[1]
    return source.replace(HOOK_ANCHOR, f"{HOOK_ANCHOR}{indent}{HOOK_LINE}")


def freetoken_tree(run: Run, wheel: Path, tests: Path, gate: Path) -> Path:
    """FreeToken's layout at 0.2.1: the wheel's ``freetoken/`` as ``python/freetoken``, its tests beside it
    (the gate with its hook), as one git commit."""
    tree = run.work / "FreeToken"
    shutil.rmtree(tree, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(run.work / "wheel")
    shutil.move(str(run.work / "wheel" / "freetoken"), tree / "python" / "freetoken")
    shutil.copytree(tests, tree / "tests")
    (tree / "tests" / "e2e").mkdir(exist_ok=True)
    (tree / "tests" / "e2e" / "test_cache_rebuild.py").write_text(with_hook(gate.read_text()))
    commit = ["-c", "user.name=a", "-c", "user.email=a@a", "commit", "-qm", "0.2.1"]
    for argv in (["init", "-q"], ["add", "-A"], commit):
        subprocess.run(["git", *argv], cwd=tree, check=True, capture_output=True)
    return tree


def user_steps(run: Run, opts: argparse.Namespace) -> None:
    """The user's steps, in the order a user meets them."""
    py = sys.executable
    models = {"q48": ["--layers", "48"], "q320": ["--layers", "320"], "llama": ["--family", "llama"]}
    probe = ("import json, freetoken_graphfix as g, freetoken; from freetoken_graphfix import bootstrap; "
             "print(json.dumps({'package': g.__file__, 'version': g.__version__, 'pth': str(bootstrap.installed_pth() "
             "or ''), 'freetoken': freetoken.__version__}))")
    run.step("installed", lambda: installed_here(json.loads(ran(run.command([py, "-c", probe], 60), "python"))))
    run.step("doctor", lambda: doctor_lines(ran(run.command([*CLI, "doctor"], 240, {"FT_GRAPH_UPLOAD": "auto"}),
                                                "doctor")))

    def write_models() -> str:
        for name, argv in models.items():
            shutil.rmtree(run.work / name, ignore_errors=True)
            ran(run.command([*CLI, "bench", "write-model", str(run.work / name), *argv], 120), f"write-model {name}")
        return ", ".join(models)

    run.step("write models", write_models)
    (run.work / "script.py").write_text(RUN_SCRIPT)
    run.step("run -- python script.py", lambda: every_graph_deferred(ran(run.command(
        [*CLI, "run", "--", py, "script.py", str(run.work / "q48"), QWEN_SERVER_ARGS + " --num-tokens 8192"], 300,
        {"FREETOKEN_PLE_SYNC": "wait"}), "run")))
    benches = {
        "rig": ["rig", "--instances", "4", "--reps", "60", "--profile-reps", "3"],  # 3: the CUPTI child runs
        "engine": ["engine", "--layers", "48", "--arms", "upstream", "auto", "--rounds", "1", "--copies", "2",
                   "--decode-steps", "64", "--trace-steps", "0", "--replays", "10", "--no-warmup",
                   "--logs", str(run.work / "engine-logs")],
    }
    for name, argv in benches.items():
        record = opts.out / f"{name}.json"

        def bench(argv: list[str] = argv, record: Path = record, name: str = name) -> str:
            record.unlink(missing_ok=True)
            out = ran(run.command([*CLI, "bench", *argv, "--json", str(record)], 420), f"bench {name}")
            again = ran(run.command([*CLI, "bench", "report", str(record)], 60), "bench report")
            return f"rc 0; bench report: {same_report(out, again)}"

        run.step(f"bench {name} + report", bench)
    run.step("bench launch", lambda: ran(run.command([*CLI, "bench", "launch", "--launches", "50"], 120),
                                         "bench launch").strip().splitlines()[-1][:160])


def series_steps(run: Run, opts: argparse.Namespace) -> None:
    """The series on a 0.2.1 tree: FreeToken's qwen4_exp tests before and after ``patch apply --repo``, then
    FreeToken's rebuild gate on both models with the series."""
    py = sys.executable
    tree: list[Path] = []
    tests = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/models/qwen4_exp"]
    env = {"PYTHONPATH": "python"}

    def build() -> str:
        tree.append(freetoken_tree(run, opts.freetoken_wheel, opts.freetoken_tests, opts.rebuild_test))
        proc = run.command([py, *tests], 180, env, tree[0])
        return f"0.2.1 as released: {pytest_counts(proc.stdout)} (rc {proc.returncode})"

    run.step("FreeToken's qwen4_exp tests, 0.2.1", build)

    def apply() -> str:
        require(bool(tree), "no tree")
        said = ran(run.command([*CLI, "patch", "apply", "--repo", str(tree[0])], 60), "patch apply").strip()
        proc = run.command([py, *tests, "tests/engine/test_graph_capture_upload.py"], 180, env, tree[0])  # 2/2's
        ran(proc, "FreeToken's qwen4_exp tests with the series")
        return f"{said.splitlines()[-1][:80]}; {pytest_counts(proc.stdout)}"

    run.step("patch apply --repo + qwen4_exp tests", apply)
    gates = {"rebuild gate, qwen4_exp 320 layers, wait-sync": ("q320", QWEN_SERVER_ARGS,
                                                                {"FREETOKEN_PLE_SYNC": "wait"}),
             "rebuild gate, llama, dummy weights": ("llama", LLAMA_SERVER_ARGS, {})}
    for name, (model, server_args, extra) in gates.items():
        def gate(model: str = model, server_args: str = server_args, extra: dict[str, str] = extra) -> str:
            require(bool(tree), "no tree")
            basetemp = run.work / f"gate-{model}"
            proc = run.command([py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--basetemp={basetemp}",
                                "tests/e2e/test_cache_rebuild.py"], 420,
                               {**env, **extra, "FREETOKEN_REBUILD_TEST_MODEL": str(run.work / model),
                                "FREETOKEN_REBUILD_SERVER_ARGS": server_args}, tree[0])
            for log in sorted(basetemp.rglob("serve.log")):
                run.log(f"--- {log}\n{log.read_text(errors='replace')[-20000:]}")
            counts = pytest_counts(proc.stdout)
            require(proc.returncode == 0 and counts == "1 passed", f"rc {proc.returncode}: {counts}")
            return counts

        run.step(name, gate)


PARTS: dict[str, tuple[Callable[[Run, argparse.Namespace], None], ...]] = {
    "all": (user_steps, series_steps), "user": (user_steps,), "series": (series_steps,)}


def table(results: list[Result]) -> str:
    """The closing table: a row per step."""
    width = max(len(r.step) for r in results)
    rows = [f"{'step':<{width}}  result  seconds", f"{'-' * width}  ------  -------"]
    rows += [f"{r.step:<{width}}  {'PASS' if r.passed else 'FAIL':<6}  {r.seconds:7.0f}" for r in results]
    passed = sum(r.passed for r in results)
    return "\n".join([*rows, f"{passed} passed, {len(results) - passed} failed"])


def main(argv: list[str] | None = None) -> int:
    """Parse, run every step within the budget, print the table, write the summary."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="where the log, the summary and the records go")
    ap.add_argument("--work", type=Path, default=Path("/tmp/graphfix-acceptance"), help="scratch folder")
    ap.add_argument("--freetoken-wheel", type=Path, required=True, help="FreeToken 0.2.1's wheel")
    ap.add_argument("--freetoken-tests", type=Path, required=True,
                    help="FreeToken's tests/ (models/qwen4_exp with its common.py) for a 0.2.1 tree")
    ap.add_argument("--rebuild-test", type=Path, required=True, help="FreeToken's tests/e2e/test_cache_rebuild.py")
    ap.add_argument("--commit", default="", help="the commit under test, for the summary")
    ap.add_argument("--budget", type=float, default=570.0, help="seconds for every step together (default 570)")
    ap.add_argument("--part", choices=sorted(PARTS), default="all",
                    help="the user's steps, the series' steps, or both (default): a split run's two halves")
    opts = ap.parse_args(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    opts.work.mkdir(parents=True, exist_ok=True)
    run = Run(opts.out.resolve(), opts.work.resolve(), time.monotonic() + opts.budget)
    for part in PARTS[opts.part]:
        part(run, opts)
    print(table(run.results))
    summary = {"commit": opts.commit, "part": opts.part, "date": time.strftime("%Y-%m-%d"),
               "results": [asdict(r) for r in run.results]}
    (opts.out / "acceptance.json").write_text(json.dumps(summary, indent=1))
    return 0 if all(r.passed for r in run.results) else 1


if __name__ == "__main__":
    sys.exit(main())
