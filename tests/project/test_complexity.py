"""Radon's cyclomatic complexity at most 20 for every function of the repository: past that, a function does more
than one job. Ruff's mccabe check counts branches only; radon also counts the boolean operators and comprehensions a
long expression hides, which is where a figure with six rules in one ``return`` hid its complexity."""

from __future__ import annotations

from pathlib import Path

from radon.complexity import cc_visit

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 20
FOLDERS = ("freetoken_graphfix", "freetoken_graphfix_bench", "scripts", "tests")


def too_complex(source: str, where: str) -> list[str]:
    """``where:line name (score)`` for each function or method of ``source`` over the limit."""
    return [f"{where}:{block.lineno} {block.fullname} ({block.complexity})" for block in cc_visit(source)
            if block.complexity > LIMIT]


def test_no_function_is_more_complex_than_the_limit():
    files = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 100  # the walk found the code
    assert [line for p in files for line in too_complex(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))] \
        == []


def test_the_check_counts_what_an_expression_hides():
    """One ``return`` of 21 boolean operators scores 22: red, though it has no branch."""
    terms = " or ".join(f"x == {i}" for i in range(22))
    assert too_complex(f"def judged(x):\n    return {terms}\n", "t.py") == ["t.py:1 judged (22)"]
