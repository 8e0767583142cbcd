"""Every command-line error is one line with one prefix, and one exit code: the tool's and the benchmarks' alike.

Each bad invocation below goes through the console script's own entry (``cli.main``), ``bench`` through the entry
point it registers; none may print a usage block, a second line or a traceback, and none may run anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from freetoken_graphfix.tools import cli
from freetoken_graphfix.tools.exits import PREFIX

ROOT = Path(__file__).resolve().parents[2]
RECORD = str(ROOT / "tests" / "records" / "serve.json")
DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)

BAD = [
    ([], 2), (["bogus"], 2), (["--mode", "auto"], 2), (["run"], 2), (["run", "--mode", "sometimes", "--", "true"], 1),
    (["run", "--", "no-such-command-graphfix"], 127), (["patch"], 2), (["patch", "check"], 2),
    (["patch", "check", "--repo", "/nonexistent/FreeToken"], 1), (["doctor", "--bogus"], 2), (["bench"], 2),
    (["bench", "nosuch"], 2), (["bench", "rig", "--kernels", "0"], 2), (["bench", "report"], 2),
    (["bench", "report", "/nonexistent.json"], 1), (["bench", "report", RECORD, "--verbose"], 1),
    (["bench", "nsys", "/nonexistent.csv"], 1), (["bench", "write-model", ""], 2),
    (["bench", "startup", "--runs", "1"], 2), (["bench", "startup", "--", "--port", "1"], 2),
]


@pytest.mark.parametrize("argv, code", BAD, ids=[" ".join(a) or "(nothing)" for a, _ in BAD])
def test_a_bad_invocation_is_one_line_with_the_one_prefix(argv, code, capsys):
    assert cli.main(argv) == code
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(PREFIX), err
    assert "Traceback" not in err and "usage:" not in err


def test_only_the_convention_says_error():
    """No module prints its own ``error:`` line: every refusal is raised and said by ``exits.run``."""
    found = []
    files = [p for package in ("freetoken_graphfix", "freetoken_graphfix_bench")
             for p in (ROOT / package).rglob("*.py")]
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, DOCUMENTED) and ast.get_docstring(n)}
        found += [f"{path.relative_to(ROOT)}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and ": error:" in node.value
                  and id(node) not in docstrings]
    assert found == ["freetoken_graphfix/tools/exits.py: 'freetoken-graphfix: error: '"]
