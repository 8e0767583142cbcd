"""The patch series on the real FreeToken 0.2.1 sources (PyPI wheel), as a checkout and as an install:
check, apply, double apply, revert byte for byte, hand edits, all or nothing, another release refused;
``git am`` and ``patch -p1``; the series' own tests; then the patched 0.2.1 on the fake device."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from freetoken_graphfix.errors import PatchError
from freetoken_graphfix.tools import diffs, series
from tests.helpers import freetoken_common

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FILES = {"engine/graph.py", "models/qwen4_exp/ple_disk.py"}
HUNK_LINES = {  # a line inside one of the series' hunks, in the original and the patched file alike
    "engine/graph.py": "                    self.buffer.logits[:bs] = model.forward()",
    "models/qwen4_exp/ple_disk.py": "        # no try/finally: a failed launch leaves no WAIT pending",
}
FIRST_LAUNCH_TEST = "tests/models/qwen4_exp/test_ple_first_launch.py"  # 0001's
NEW_TESTS = {FIRST_LAUNCH_TEST, "tests/engine/test_graph_capture_upload.py"}  # 0002's: the capture loop, no upload
EDITED_TESTS = {"tests/models/qwen4_exp/test_ple_disk.py"}  # FreeToken's own, which the series changes
SERIES = 2


def digest(tree: Path) -> dict[str, str]:
    return {str(p.relative_to(tree)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(tree.rglob("*")) if p.is_file()}


def freetoken_tests(at: Path) -> None:
    """What the series needs of FreeToken's tests/, which the wheel does not ship: the qwen4_exp test
    package, its ``common.py`` (``freetoken_common``'s stand-in) and, of each test file the series
    edits, the lines its hunks read (not a runnable test: the series' own tests run alone here)."""
    folder = at / "tests" / "models" / "qwen4_exp"
    folder.mkdir(parents=True)
    for package in (folder.parent, folder):
        (package / "__init__.py").write_text("")
    (folder / "common.py").write_text(freetoken_common.source())
    for patch in series.series():
        for diff in diffs.parse(patch.read_text()):
            if diff.path in EDITED_TESTS:
                lines: list[str] = []
                for h in diff.hunks:  # at their own line numbers: git am and patch -p1 find them there
                    lines += ["\n"] * (h.old_start - 1 - len(lines)) + h.old
                (at / diff.path).write_text("".join(lines))


def checkout(tree: Path, at: Path, git: bool = True) -> Path:
    """FreeToken's repository layout (python/freetoken/..., tests/...), as a git checkout of the release."""
    (at / "python").mkdir(parents=True)
    shutil.move(str(tree / "freetoken"), at / "python" / "freetoken")
    freetoken_tests(at)
    if git:
        for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
            subprocess.run(["git", *cmd], cwd=at, check=True)
    return at


@pytest.fixture(params=["repo", "site"])
def target(request, freetoken_tree, tmp_path):
    tree = freetoken_tree("0.2.1")
    if request.param == "repo":
        co = checkout(tree, tmp_path / "FreeToken")
        return series.repo_target(co), co
    return series.installed_target(tree / "freetoken"), tree


def test_series_file_lists_every_patch_and_its_target():
    names = [p.name for p in series.series()]
    assert names == sorted(p.name for p in (ROOT / "patches").glob("*.patch") if not p.name.startswith("0000"))
    assert series.series_target() == "0.2.1" and len(names) == SERIES
    cover = (ROOT / "patches" / "0000-cover-letter.patch").read_text()
    assert "*** " not in cover  # git format-patch's blurb placeholders are written over


def appendix_script(cover: str, name: str) -> str:
    return cover.split(f"--- {name}\n", 1)[1].split("\n---\n", 1)[0]


def check_imports(script: str, allowed: set[str]) -> None:
    """Every import of ``script`` from the standard library, ``allowed`` or FreeToken, and every name
    it takes from a FreeToken module there in the installed 0.2.1."""
    import ast
    import importlib

    for node in ast.walk(ast.parse(script)):
        if isinstance(node, ast.ImportFrom):
            assert node.module.split(".")[0] == "freetoken", node.module
            module = importlib.import_module(node.module)
            assert all(hasattr(module, alias.name) for alias in node.names), node.module
        elif isinstance(node, ast.Import):
            assert all(alias.name in sys.stdlib_module_names | allowed for alias in node.names)


def test_the_cover_letter_is_short_and_its_scripts_need_freetoken_alone():
    """The letter a maintainer reads: under 600 words before its appendix; the reporter's check and
    the design's benchmark import nothing but the standard library, torch and FreeToken's own modules,
    each there in 0.2.1 (names they take from them included)."""
    import inspect

    cover = (ROOT / "patches" / "0000-cover-letter.patch").read_text()
    letter = cover.split("\n\n", 1)[1].split("\nAppendix A:", 1)[0]
    assert len(letter.split()) < 600
    check_imports(appendix_script(cover, "decode_check.py"), {"torch"})
    script = appendix_script(cover, "first_launch_bench.py")
    check_imports(script, set())
    from freetoken.models.qwen4_exp.ple_disk import DiskRowTable

    shipped = inspect.getsource(DiskRowTable)  # the table's own names the script reads, in 0.2.1...
    assert all(name in script and name in shipped for name in ("_wait_sync", "host_fill_batch", "padded_size"))
    first = (ROOT / "patches" / series.series()[0].name).read_text()  # ...and the series' own
    assert "_unlaunched_bs" in script and "+        self._unlaunched_bs: set[int] = set()" in first


def test_the_series_is_dated_in_its_order():
    """One branch, formatted once: each patch no earlier than the one before, the letter last."""
    import email.utils

    def date(path: Path):
        return email.utils.parsedate_to_datetime(re.search(r"^Date: (.*)$", path.read_text(), re.M).group(1))

    dates = [date(p) for p in series.series()]
    assert dates == sorted(dates) and date(ROOT / "patches" / "0000-cover-letter.patch") >= dates[-1]


def test_the_appendix_writes_the_models_the_bench_writes(tmp_path):
    """The letter's make_models.py (FreeToken and its requirements alone) writes what this package's
    ``bench write-model`` writes, which ran on the H200: the same config.json, the same tensors by
    name, shape and dtype in the FTW checkpoint and in the disk PLE table; for the llama, the config."""
    import ast

    from safetensors import safe_open

    from freetoken_graphfix_bench import model

    cover = (ROOT / "patches" / "0000-cover-letter.patch").read_text()
    script = appendix_script(cover, "make_models.py")
    ours = {node.module.split(".")[0] if isinstance(node, ast.ImportFrom) else alias.name
            for node in ast.walk(ast.parse(script)) if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names}
    assert ours <= {"json", "math", "os", "sys", "torch", "safetensors", "tokenizers", "freetoken"}, ours
    (tmp_path / "make_models.py").write_text(script)
    for name, args in (("qwen4_exp", ["8"]), ("llama", ["llama"])):
        subprocess.run([sys.executable, str(tmp_path / "make_models.py"), str(tmp_path / f"letter-{name}"), *args],
                       check=True, capture_output=True, timeout=600)
        model.write_model(str(tmp_path / f"bench-{name}"), name, 8 if name == "qwen4_exp" else None)
    for name in ("qwen4_exp", "llama"):
        letter, bench = (json.loads((tmp_path / f"{who}-{name}" / "config.json").read_text())
                         for who in ("letter", "bench"))
        assert letter == bench, name

    def tensors(folder):
        from freetoken.checkpoint.ftw import FTWReader

        ftw = {e["name"]: (tuple(e["shape"]), e["dtype"]) for e in FTWReader(str(folder)).entries()}
        with safe_open(str(folder / model.PLE_FILE), "pt") as fh:
            ple = {k: (tuple(fh.get_tensor(k).shape), str(fh.get_tensor(k).dtype)) for k in fh.keys()}
        return ftw, ple

    assert tensors(tmp_path / "letter-qwen4_exp") == tensors(tmp_path / "bench-qwen4_exp")


def test_commits_follow_freetokens_conventions():
    """FreeToken's history: ``type(scope): subject`` (lower case, no final period), a prose body, no
    Debian fields; authored as this project, at a real address; tests under the subsystem they
    protect (qwen4_exp's in tests/models/qwen4_exp/, with its common.py)."""
    import email

    for patch in series.series():
        msg = email.message_from_string(patch.read_text())
        subject = " ".join(msg["Subject"].split()).split("] ", 1)[1]
        assert re.fullmatch(r"(feat|fix|perf|docs|chore|build|ci|test|refactor)\([a-z0-9_]+\): [a-z].*[^.]", subject)
        assert msg["From"] == "freetoken-graphfix <freetoken-graphfix@users.noreply.github.com>"
        body = msg.get_payload().split("\n---\n", 1)[0]
        assert len(body.split()) > 40
        assert not re.search(r"^(Description|Origin|Bug|Forwarded|Last-Update):", body, re.M)
    for path in NEW_TESTS | EDITED_TESTS:  # beside the tests of the subsystem each protects (tests/README.md)
        folder, name = path.rsplit("/", 1)
        assert folder in ("tests/models/qwen4_exp", "tests/engine") and name.startswith("test_")


def test_apply_double_apply_revert(target):
    tgt, tree = target
    original = digest(tree)
    assert series.state(tgt)[1] == "not applied"
    changed, message = series.apply(tgt)
    assert changed and message.startswith(f"applied {SERIES} patches")
    patched = digest(tree)
    assert series.state(tgt)[1] == "applied"
    prefix = "python/freetoken/" if tgt.strip == 1 else "freetoken/"
    touched = {k for k in original if original[k] != patched.get(k)} | (patched.keys() - original.keys())
    expected = {prefix + f for f in PACKAGE_FILES} | (NEW_TESTS | EDITED_TESTS if tgt.strip == 1 else set())
    assert touched == expected
    assert series.apply(tgt) == (False, f"the series is already applied to the {tgt.label}; nothing to do")
    assert digest(tree) == patched
    changed, message = series.revert(tgt)
    assert changed and message.startswith(f"reverted {SERIES} patches")
    assert digest(tree) == original  # byte for byte, the new test files gone
    assert series.revert(tgt)[0] is False


@pytest.mark.parametrize("edited", sorted(PACKAGE_FILES))
def test_a_hand_edit_is_named_in_either_state(target, edited):
    """A local change in one file: refused naming that file, on the original tree and on an applied
    one (both directions tried), and nothing changes."""
    tgt, tree = target
    path = tree / ("python/freetoken" if tgt.strip == 1 else "freetoken") / edited

    def edit():
        text = path.read_text()
        anchor = HUNK_LINES[edited]
        assert text.count(anchor) == 1, (edited, anchor)
        path.write_text(text.replace(anchor, anchor + "  # a local change", 1))

    shipped = path.read_bytes()
    for applied in (False, True):
        if applied:
            path.write_bytes(shipped)
            series.apply(tgt)
        edit()
        before = digest(tree)
        with pytest.raises(PatchError) as err:
            (series.revert if applied else series.apply)(tgt)
        message = str(err.value)
        assert "\n" not in message and message.endswith("nothing was changed")
        assert f"{edited} matches neither the original nor the patched sources" in message
        reinstall = "pip install --force-reinstall --no-deps freetoken==0.2.1"
        assert message.endswith(f"restore {path.relative_to(tgt.root)}: {reinstall}; nothing was changed"
                                if tgt.package_only else "from the release (or a clean checkout); nothing was changed")
        assert digest(tree) == before


def test_a_failed_replace_puts_back_what_it_replaced(target, monkeypatch):
    """All or nothing: the last replace fails (a file that cannot be replaced), the ones already
    replaced are put back, one line says so."""
    tgt, tree = target
    original = digest(tree)
    real_replace, calls = os.replace, []
    files = len(PACKAGE_FILES) + (len(NEW_TESTS | EDITED_TESTS) if tgt.strip == 1 else 0)

    def flaky(src, dst):
        calls.append(dst)
        if len(calls) == files:
            raise PermissionError(13, "Permission denied")
        return real_replace(src, dst)

    monkeypatch.setattr(series.os, "replace", flaky)
    with pytest.raises(PatchError) as err:
        series.apply(tgt)
    assert (f"Permission denied; the {files - 1} file(s) already replaced were put back, nothing was changed"
            in str(err.value))
    monkeypatch.undo()
    assert digest(tree) == original and series.state(tgt)[1] == "not applied"


def file_bound(cmd: list[str]) -> list[str]:
    """``cmd`` run as a user whom file permissions bind (as root: without CAP_DAC_OVERRIDE)."""
    if os.geteuid() == 0:
        assert shutil.which("setpriv"), "setpriv is needed to drop root's file capabilities here"
        return ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", *cmd]
    return cmd


def unprivileged(*args: str) -> subprocess.CompletedProcess:
    """``patch ARGS`` as a user whom file permissions bind."""
    return subprocess.run(file_bound([sys.executable, "-m", "freetoken_graphfix", "patch", *args]),
                          capture_output=True, text=True, timeout=120)


def test_unwritable_folder_changes_nothing(freetoken_tree, tmp_path):
    """A real permission failure, as a user without write access to one folder meets it (as root:
    without CAP_DAC_OVERRIDE): one line, no traceback, nothing written anywhere."""
    co = checkout(freetoken_tree("0.2.1"), tmp_path / "FreeToken")
    locked = co / "python/freetoken/models/qwen4_exp"
    original = digest(co)
    locked.chmod(0o555)
    try:
        out = unprivileged("apply", "--repo", str(co))
    finally:
        locked.chmod(0o755)
    assert out.returncode == 1, out
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith(
        "freetoken-graphfix: error: cannot write python/freetoken/models/qwen4_exp/ple_disk.py")
    assert digest(co) == original


def folders(tree: Path) -> list[str]:
    return sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_dir() and ".git" not in p.parts)


def test_staging_that_fails_midway_leaves_nothing_behind(freetoken_tree, tmp_path):
    """The first files staged, then a folder that cannot be written: the staged copies and the test
    folders made for the new files are gone again, so "nothing was changed" is true."""
    co = checkout(freetoken_tree("0.2.1"), tmp_path / "FreeToken")
    locked = co / "python/freetoken/engine"  # graph.py: staged after ple_disk.py and its new test file
    original, dirs = digest(co), folders(co)
    locked.chmod(0o555)
    try:
        out = unprivileged("apply", "--repo", str(co))
    finally:
        locked.chmod(0o755)
    assert out.returncode == 1 and "cannot write python/freetoken/engine/graph.py" in out.stderr, out.stderr
    assert "nothing was changed" in out.stderr
    assert digest(co) == original and folders(co) == dirs
    assert not [p for p in co.rglob("*graphfix-staged*")]


def test_apply_and_revert_keep_each_files_permissions(freetoken_tree, tmp_path):
    co = checkout(freetoken_tree("0.2.1"), tmp_path / "FreeToken")
    files = [co / "python/freetoken/models/qwen4_exp/ple_disk.py", co / "python/freetoken/engine/graph.py"]
    for f, mode in zip(files, (0o640, 0o755), strict=True):
        f.chmod(mode)
    for action in (series.apply, series.revert):
        action(series.repo_target(co))
        assert [f.stat().st_mode & 0o777 for f in files] == [0o640, 0o755], action.__name__


def test_another_release_is_refused_in_one_line(freetoken_tree, tmp_path):
    co = checkout(freetoken_tree("0.2.0"), tmp_path / "FreeToken")
    original = digest(co)
    for action in (series.state, series.apply, series.revert):
        with pytest.raises(PatchError) as err:
            action(series.repo_target(co))
        assert str(err.value).startswith(f"the checkout {co} is FreeToken 0.2.0; the patch series targets FreeToken "
                                         "0.2.1 only")
        assert "FT_GRAPH_UPLOAD=auto" in str(err.value) and "\n" not in str(err.value)
    assert digest(co) == original


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "freetoken_graphfix", "patch", *args], capture_output=True,
                          text=True, timeout=120)


def test_cli_patch_repo(tmp_path, freetoken_tree):
    co = checkout(freetoken_tree("0.2.1"), tmp_path / "co")
    out = run_cli("check", "--repo", str(co))
    assert out.returncode == 3 and out.stdout.strip().endswith(": not applied")  # a script can tell the states
    out = run_cli("apply", "--repo", str(co))
    assert out.returncode == 0 and out.stdout.strip() == f"applied {SERIES} patches to the checkout {co}"  # no note
    out = run_cli("check", "--repo", str(co))
    assert out.returncode == 0 and out.stdout.strip().endswith(": applied")
    assert run_cli("revert", "--repo", str(co)).returncode == 0
    first = series.series()[0]
    subprocess.run(["git", "apply", str(first)], cwd=co, check=True)
    out = run_cli("check", "--repo", str(co))
    assert out.returncode == 4 and ": partly applied: the first 1 of" in out.stdout
    bad = run_cli("check", "--repo", str(tmp_path))
    assert bad.returncode == 1 and "no python/freetoken/ in it" in bad.stderr
    assert "check's exit codes: 0 applied, 3 not applied, 4 partly applied" in " ".join(
        run_cli("--help").stdout.split())


@pytest.mark.parametrize("value", ["", "  "])
def test_empty_repo_is_an_error_not_the_install(value):
    """A script passing --repo "$FT_DIR" with the variable unset must not patch site-packages."""
    out = run_cli("apply", "--repo", value)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("freetoken-graphfix: error: --repo '': empty path") or "empty path" in out.stderr


def test_site_note_only_after_applying_to_the_install(tmp_path, freetoken_tree, monkeypatch):
    from freetoken_graphfix.tools import cli

    tree = freetoken_tree("0.2.1")
    monkeypatch.setattr(series, "site_target",
                        lambda: series.Target(tree, 2, "installed FreeToken (test copy)", package_only=True))
    printed = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(" ".join(map(str, a))))
    for action, note in (("apply", True), ("apply", False), ("revert", False), ("revert", False)):
        printed.clear()
        assert cli.main(["patch", action, "--site"]) == 0
        assert any(line.startswith("note: pip's RECORD hashes") for line in printed) is note, (action, printed)
        if note:  # the command to run, not a placeholder
            assert any("pip install --force-reinstall --no-deps freetoken==0.2.1`" in line for line in printed)


def test_site_points_at_the_installed_freetoken():
    import freetoken

    tgt = series.site_target()
    assert tgt.root == Path(freetoken.__file__).resolve().parents[1] and tgt.strip == 2 and tgt.package_only


def test_git_am_and_patch_apply_the_series(tmp_path, freetoken_tree):
    """The series is a real format-patch series: git am takes it, patch -p1 takes it, same result."""
    am = checkout(freetoken_tree("0.2.1"), tmp_path / "am")
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "am", "-q",
                    *map(str, series.series())], cwd=am, check=True)
    log = subprocess.run(["git", "log", "--format=%s", f"-{SERIES}"], cwd=am, capture_output=True, text=True).stdout
    assert log.splitlines() == ["perf(graph): stop uploading captured decode graphs",
                                "fix(qwen4_exp): fill first launches of PLE graphs from the worker"]
    plain = checkout(freetoken_tree("0.2.1"), tmp_path / "plain", git=False)
    for patch in series.series():
        subprocess.run(["patch", "-p1", "-s", "-i", str(patch)], cwd=plain, check=True)
    assert {k: v for k, v in digest(am).items() if not k.startswith(".git/")} == digest(plain)


def test_the_series_own_tests_pass_where_they_can_on_cpu(tmp_path, freetoken_tree):
    """FreeToken's tests added by the series, run against the patched sources: the CPU ones pass,
    the GPU ones skip themselves here (they run on the H200)."""
    co = checkout(freetoken_tree("0.2.1"), tmp_path / "FreeToken")
    series.apply(series.repo_target(co))
    env = {k: v for k, v in os.environ.items() if k != "FT_GRAPH_UPLOAD"}
    env["PYTHONPATH"] = str(co / "python")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *sorted(NEW_TESTS)], cwd=co,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:]
    summary = out.stdout.strip().splitlines()[-1]
    assert "failed" not in summary and int(summary.split(" passed")[0].split()[-1]) >= 19, summary


PLE_DISK = "models/qwen4_exp/ple_disk.py"
GRAPH = "engine/graph.py"
CAPTURED = "                    self.buffer.logits[:bs] = model.forward()\n"  # the line before the reset
RESET = "                self._reset_moe_offload_cache()\n"
UPLOAD = "                _upload_graph(graph, self.stream)\n"  # 0.2.1's call, which 0002 removes
GRAPH_MUTANTS = {  # 0002: the capture loop's reset beside the removed upload, and the upload call left in
    "the offload cache is not reset after a capture": (CAPTURED + RESET, CAPTURED),
    "the upload call is left in": (CAPTURED + RESET, CAPTURED + UPLOAD + RESET),
}
MUTANTS = {  # each line of the first-launch fill, undone in the patched sources
    "the worker is HIP's only": ('thread_name_prefix="ple-fill") if self._wait_sync else None',
                                 'thread_name_prefix="ple-fill") if self._wait_sync and torch.version.hip else None'),
    "no first-launch fill": ("        return bs in self._unlaunched_bs or bs not in self._captured_bs\n",
                             "        return False\n"),
    "capture records no size": ("                self._unlaunched_bs.add(rows)", "                pass"),
    "the launch is never forgotten": ("                    self._unlaunched_bs.discard(bs)  # this",
                                      "                    pass  # this"),
    "one size's first launch clears every size's": ("self._unlaunched_bs.discard(bs)", "self._unlaunched_bs.clear()"),
    "the launch forgotten at its unpadded size": ("self._unlaunched_bs.discard(bs)",
                                                  "self._unlaunched_bs.discard(len(reqs))"),
    "the context's branch read from the size (the slip review found)": (
        "if isinstance(staged, Future) or", "if self._fills_from_worker(batch.padded_size) or"),
    "every dispatch, an eager prefill too, counts as its size's launch": (
        "        staged = self.host_fill_batch(batch, use_graph)\n",
        "        staged = self.host_fill_batch(batch, use_graph)\n"
        "        self._unlaunched_bs.discard(batch.padded_size)\n"),
    "the consumed event recorded before the fill is joined": (
        "                try:\n                    self._await_pending()\n                finally:\n"
        "                    # The worker must finish before recording the event it waits on at the next fill.\n"
        "                    if use_graph:\n"
        "                        self._graph_consumed.record(torch.cuda.current_stream(self._device))",
        "                try:\n                    if use_graph:\n"
        "                        self._graph_consumed.record(torch.cuda.current_stream(self._device))\n"
        "                finally:\n                    self._await_pending()"),
    "the readback event recorded before its copy": (
        "                self._token_readback[:bs].copy_(batch.input_ids, non_blocking=True)\n"
        "                self._readback_event.record(torch.cuda.current_stream(self._device))\n",
        "                self._readback_event.record(torch.cuda.current_stream(self._device))\n"
        "                self._token_readback[:bs].copy_(batch.input_ids, non_blocking=True)\n"),
    "a failed first-launch fill fails the table": (
        "if torch.version.hip is not None or not (pending.done() and pending.exception() is exc):", "if True:"),
    "an interrupted join leaves the table usable": (
        "if torch.version.hip is not None or not (pending.done() and pending.exception() is exc):",
        "if torch.version.hip is not None:"),
    "a failed table dispatches again": ("        if self._worker is not None:\n            self._await_pending()",
                                        "        if torch.version.hip is not None:\n            self._await_pending()"),
    "a launch at an uncaptured size goes unprotected": (
        "        return bs in self._unlaunched_bs or bs not in self._captured_bs",
        "        return bs in self._unlaunched_bs"),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS) + sorted(GRAPH_MUTANTS))
def test_the_series_own_cpu_tests_catch_each_fixing_line_undone(tmp_path, freetoken_tree, mutant):
    """What FreeToken would get: the series' own tests, without a GPU, go red when any line of the
    first-launch fill is undone or slips (the worker left to HIP; the first-launch fill, its size
    record or its end gone; the worker's branch read from the batch's size, the slip a review found;
    the readback or consumed events out of order; the failure policy changed; a size unchecked), and when
    0002's capture loop keeps its upload call or loses the offload cache's reset beside it."""
    co = checkout(freetoken_tree("0.2.1"), tmp_path / "FreeToken", git=False)
    old, new = MUTANTS[mutant] if mutant in MUTANTS else GRAPH_MUTANTS[mutant]
    path = co / "python/freetoken" / (PLE_DISK if mutant in MUTANTS else GRAPH)
    series.apply(series.repo_target(co))
    text = path.read_text()
    assert text.count(old) == 1, mutant
    path.write_text(text.replace(old, new))
    env = {k: v for k, v in os.environ.items() if k != "FT_GRAPH_UPLOAD"}
    env["PYTHONPATH"] = str(co / "python")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *sorted(NEW_TESTS)],
                         cwd=co, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 1 and " failed" in out.stdout.strip().splitlines()[-1], out.stdout[-2000:]


def patched_child(tree: Path, shim_mode: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FT_GRAPH_UPLOAD"}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(ROOT)])
    if shim_mode:
        env["FT_GRAPH_UPLOAD"] = shim_mode
    out = subprocess.run([sys.executable, "-m", "tests.children.patched_run"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def patched_021(freetoken_tree):
    tree = freetoken_tree("0.2.1")
    series.apply(series.Target(tree, 2, "test tree", package_only=True))
    return tree


def test_patched_freetoken_fills_first_launches_on_the_fake_device(patched_021):
    """FreeToken 0.2.1 with the series, shim not installed, its own GraphRunner, Engine.forward_batch
    and DiskRowTable: no graph uploaded, every first launch filled from the worker and never
    blocked, later launches on the normal path, rows exact, every flag back at 0, faults included:
    a failed fill leaves the table usable, a failed launch fails it until the engine is recreated."""
    r = patched_child(patched_021, None)
    assert r["freetoken_file"].startswith(str(patched_021)) and r["shim"] is None and not r["upload_function"]
    run = r["run"]
    assert run["uploaded"] == [False, False, False] and run["launched_at_capture"] == [0, 0, 0]
    assert run["worker"]  # created in CUDA wait-sync mode too
    ok = {"fired": False, "ok": True, "flag_after": 0}
    assert [{k: s[k] for k in ok} for s in run["steps"]] == [ok] * 5
    assert [s["worker"] for s in run["steps"]] == [1, 0, 1, 1, 0]  # bs 2, 2, 1, 3 -> 4, 1
    assert run["steps"][3]["padded"] == 4
    assert [s["worker"] for s in run["rebuild"]] == [1, 1] and all(s["ok"] for s in run["rebuild"])
    assert run["fill_raises"] == {"raised": "OSError('disk read failed')", "flag_after": 0}
    assert run["launch_raises"]["raised"] == "RuntimeError('fake cudaGraphLaunch failure')"
    # the failed fill's launch returned: the table stays usable, that size's next launch on CUDA's path
    assert run["after_fill_raised"] == {"fired": False, "ok": True, "flag_after": 0, "worker": 0, "padded": 4}
    # a launch that raised: HIP's policy, the engine is recreated
    assert "PLE disk table failed; recreate the engine" in run["after_launch_raised"]["raised"]
    assert [(s["ok"], s["worker"]) for s in run["recreated"]] == [(True, 1), (True, 0)]


def test_shim_stands_down_on_patched_freetoken(patched_021):
    r = patched_child(patched_021, "auto")
    assert r["shim"]["patched"] is False
    assert "carries the patch series" in r["shim"]["reason"] and "stands down" in r["shim"]["reason"]
    assert r["run"]["uploaded"] == [False, False, False]  # FreeToken's own protection did the work
    assert [s["worker"] for s in r["run"]["steps"]] == [1, 0, 1, 1, 0]


def test_patched_copy_leaves_the_install_alone(tmp_path, freetoken_tree, monkeypatch):
    """What bench engine and bench serve run the patched arms on: a patched copy, never the install."""
    tree = freetoken_tree("0.2.1")
    monkeypatch.setattr(series, "site_target",
                        lambda: series.Target(tree, 2, "installed FreeToken (test copy)", package_only=True))
    installed = digest(tree)
    dest = series.patched_copy(tmp_path / "patched")
    assert digest(tree) == installed
    assert series.state(series.Target(dest, 2, "copy", package_only=True))[1] == "applied"
    assert series.patched_copy(tmp_path / "patched") == dest  # reused, not patched twice


def test_hunks_apply_at_any_offset_and_without_a_final_newline(tmp_path):
    """The tool applies hunks itself (no git needed): exact lines, found where they moved to, and a
    last line without its newline kept so."""
    patch = tmp_path / "p.patch"
    patch.write_text("diff --git a/python/freetoken/x.py b/python/freetoken/x.py\n"
                     "--- a/python/freetoken/x.py\n+++ b/python/freetoken/x.py\n"
                     "@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n")
    target = series.Target(tmp_path, 1, "test")
    (diff,) = series._diffs(patch, target)
    assert diff.path == "python/freetoken/x.py" and not diff.new
    moved = ["header\n", "a\n", "b"]  # two lines above where the hunk says, and no final newline
    assert diffs.apply(moved, diff, reverse=False) == ["header\n", "a\n", "c"]
    assert diffs.apply(["header\n", "a\n", "c"], diff, reverse=True) == moved
    with pytest.raises(diffs.Misfit, match=r"hunk @@ -1,2 \+1,2 @@ does not fit python/freetoken/x.py"):
        diffs.apply(["a\n", "b\n"], diff, reverse=False)  # b with a newline is another line


def test_a_file_the_series_edits_but_the_tree_lacks_is_never_created(tmp_path, monkeypatch):
    """A hunk that only adds lines fits an empty file: were a missing file read as empty, the
    series would create a file it only edits. The tree does not fit, and nothing is written."""
    patch = tmp_path / "p.patch"
    patch.write_text("diff --git a/python/freetoken/x.py b/python/freetoken/x.py\n"
                     "--- a/python/freetoken/x.py\n+++ b/python/freetoken/x.py\n@@ -0,0 +1 @@\n+added\n")
    (tmp_path / "python" / "freetoken").mkdir(parents=True)
    monkeypatch.setattr(series, "series", lambda: [patch])
    monkeypatch.setattr(series, "check_release", lambda target: None)
    target = series.Target(tmp_path, 1, "test tree")
    with pytest.raises(series.PatchError, match="does not fit the series"):
        series.apply(target)
    assert not (tmp_path / "python" / "freetoken" / "x.py").exists()


def _apply_or_revert(root: str, action: str, barrier, results) -> None:
    """One concurrent patch run (in a forked process): wait for the others, then act."""
    target = series.repo_target(root)
    barrier.wait()
    try:
        changed, _ = (series.apply if action == "apply" else series.revert)(target)
        results.put(("ok", action, changed))
    except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on any
        results.put(("error", action, repr(exc)))


@pytest.mark.timeout(600)
def test_concurrent_applies_and_reverts_never_mix_the_tree(tmp_path, freetoken_tree):
    """Two shells, a CI matrix, config management: several runs on one tree at once. Each takes its
    turn (the tree is locked for the whole read-compute-stage-replace): every run succeeds, and after
    each round the tree is exactly the release or exactly the patched tree, nothing staged left."""
    import multiprocessing as mp
    import random

    co = checkout(freetoken_tree("0.2.1"), tmp_path / "FreeToken", git=False)
    original = digest(co)
    series.apply(series.repo_target(co))
    patched = digest(co)
    series.revert(series.repo_target(co))
    ctx, rng = mp.get_context("fork"), random.Random(7)
    for round_ in range(100):
        actions = [rng.choice(("apply", "revert")) for _ in range(3)]
        barrier, results = ctx.Barrier(len(actions)), ctx.Queue()
        procs = [ctx.Process(target=_apply_or_revert, args=(str(co), a, barrier, results)) for a in actions]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        outcomes = [results.get(timeout=5) for _ in procs]
        assert all(kind == "ok" for kind, _, _ in outcomes), (round_, outcomes)
        assert digest(co) in (original, patched), (round_, actions)
        assert not list(co.rglob("*.graphfix-staged")), round_


def test_a_target_file_that_is_not_utf8_is_named(target):
    tgt, tree = target
    package = tree / ("python/freetoken" if tgt.strip == 1 else "freetoken")
    for rel in ("engine/graph.py", "version.py"):
        path = package / rel
        shipped = path.read_bytes()
        path.write_bytes(shipped + b"# \xff\n")
        before = digest(tree)
        for action in (series.state, series.apply, series.revert):
            with pytest.raises(PatchError) as err:
                action(tgt)
            message = str(err.value)
            assert "\n" not in message and message.startswith(f"{'python/' if tgt.strip == 1 else ''}freetoken/{rel} "
                                                              "is not UTF-8 text (byte ")
        assert digest(tree) == before
        path.write_bytes(shipped)


def test_an_unreadable_target_file_is_named(freetoken_tree, tmp_path):
    co = checkout(freetoken_tree("0.2.1"), tmp_path / "FreeToken", git=False)
    locked = co / "python/freetoken/models/qwen4_exp/ple_disk.py"
    locked.chmod(0o000)
    try:
        out = unprivileged("check", "--repo", str(co))
    finally:
        locked.chmod(0o644)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr == ("freetoken-graphfix: error: cannot read python/freetoken/models/qwen4_exp/ple_disk.py: "
                          "Permission denied; nothing was changed\n")


@pytest.mark.parametrize("kind", ["long", "file"])
def test_a_repo_path_that_is_no_checkout_is_one_line(tmp_path, kind):
    path = str(tmp_path / ("x" * 300)) if kind == "long" else str(tmp_path / "somefile")
    if kind == "file":
        Path(path).write_text("")
    out = run_cli("check", "--repo", path)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert ("File name too long" if kind == "long" else "not a directory; pass a FreeToken checkout") in out.stderr
    assert "characters)" in out.stderr or kind == "file"  # a 300-character path is cut in the message


def test_a_tree_holding_the_first_patches_is_named_and_moved_either_way(freetoken_tree, tmp_path):
    """git am stopped after the first patch, or one patch applied by hand: check names how far the
    tree is, apply finishes the series, revert undoes what is there, to the release's bytes."""
    co = checkout(freetoken_tree("0.2.1"), tmp_path / "FreeToken", git=False)
    original = digest(co)
    first = series.series()[0]
    subprocess.run(["patch", "-p1", "-s", "-i", str(first)], cwd=co, check=True)
    tgt = series.repo_target(co)
    assert series.state(tgt)[1] == (f"partly applied: the first 1 of 2 patches ({first.name}); 'patch apply' applies "
                                   "the rest, 'patch revert' undoes them")
    assert series.apply(tgt) == (True, f"applied 1 patch to the {tgt.label}")
    assert series.state(tgt)[1] == "applied"
    series.revert(tgt)
    subprocess.run(["patch", "-p1", "-s", "-i", str(first)], cwd=co, check=True)
    assert series.revert(tgt) == (True, f"reverted 1 patch from the {tgt.label}")
    assert digest(co) == original


def test_a_tree_that_fits_no_state_names_each_file_and_what_brings_it_back(freetoken_tree, tmp_path):
    """The second patch alone (applied by hand, out of order): not a prefix of the series. The error
    names the file patched and the ones original, and says to restore the patched one; nothing changes."""
    co = checkout(freetoken_tree("0.2.1"), tmp_path / "FreeToken", git=False)
    second = series.series()[1]
    subprocess.run(["patch", "-p1", "-s", "-i", str(second)], cwd=co, check=True)
    tgt, before = series.repo_target(co), digest(co)
    with pytest.raises(PatchError) as err:
        series.apply(tgt)
    message = str(err.value)
    assert message.startswith(f"the {tgt.label} does not fit the series: partly patched: "
                              "python/freetoken/engine/graph.py, tests/engine/test_graph_capture_upload.py patched, ")
    assert "python/freetoken/models/qwen4_exp/ple_disk.py" in message.split(" patched, ")[1].split(" original")[0]
    assert "restore python/freetoken/engine/graph.py from the release (or a clean checkout)" in message
    assert "remove tests/engine/test_graph_capture_upload.py (the release has no such file)" in message
    assert digest(co) == before


def test_an_edited_new_test_file_is_to_be_removed_not_restored(freetoken_tree, tmp_path):
    """A test file the series adds, edited after applying: the release never had it, so the fix is to
    remove it, not to restore it from the release."""
    co = checkout(freetoken_tree("0.2.1"), tmp_path / "FreeToken", git=False)
    tgt = series.repo_target(co)
    series.apply(tgt)
    new = FIRST_LAUNCH_TEST
    (co / new).write_text((co / new).read_text() + "# a local change\n")
    with pytest.raises(PatchError) as err:
        series.revert(tgt)
    assert f"{new} matches neither the original nor the patched sources" in str(err.value)
    assert f"remove {new} (the release has no such file)" in str(err.value)
    assert "restore" not in str(err.value)


def test_a_link_planted_at_the_old_staging_name_is_never_written_through(target, tmp_path):
    """The staging file has a fresh name each run: a link at the fixed name the tool once used is left alone,
    and the file it points to is untouched."""
    tgt, tree = target
    package = tree / ("python/freetoken" if tgt.strip == 1 else "freetoken")
    outside = tmp_path / "outside.py"
    outside.write_text("precious\n")
    graph = package / "engine" / "graph.py"
    (graph.parent / ".graph.py.graphfix-staged").symlink_to(outside)
    series.apply(tgt)
    assert outside.read_text() == "precious\n"
    assert not graph.is_symlink() and "_upload_graph" not in graph.read_text()  # 0002 applied to the real file


@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_link_in_the_tree_is_refused_and_nothing_changes(target, tmp_path, where):
    """A file the series writes that is a link, or a folder on its way that is one, would send the write outside
    the tree: refused in one line, nothing changed, the link's target untouched."""
    tgt, tree = target
    package = tree / ("python/freetoken" if tgt.strip == 1 else "freetoken")
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(package / "engine", elsewhere)
    if where == "file":
        (package / "engine" / "graph.py").unlink()
        (package / "engine" / "graph.py").symlink_to(elsewhere / "graph.py")
        link = package / "engine" / "graph.py"
    else:
        shutil.rmtree(package / "engine")
        (package / "engine").symlink_to(elsewhere, target_is_directory=True)
        link = package / "engine"
    before, outside = digest(tree), digest(elsewhere)
    with pytest.raises(PatchError) as err:
        series.apply(tgt)
    assert str(err.value).startswith(f"{link.relative_to(tgt.root)} is a symbolic link;")
    assert str(err.value).endswith("nothing was changed") and "\n" not in str(err.value)
    assert digest(tree) == before and digest(elsewhere) == outside
