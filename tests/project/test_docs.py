"""The docs match the code: the README's first screen turns the shim on, every link and anchor in the
docs resolves, every command they show parses, and the package keeps the shape a reader relies on
(no module over 400 lines, a docstring on every function)."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from freetoken_graphfix.tools import cli as main_cli
from freetoken_graphfix_bench import cli as bench_cli
from freetoken_graphfix_bench import options as bench_options

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "freetoken_graphfix"
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)
FIRST_SCREEN = 60  # lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped,
    spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def test_the_readmes_first_screen_turns_the_shim_on_in_each_of_three_ways():
    readme = (ROOT / "README.md").read_text().splitlines()
    first = "\n".join(readme[:FIRST_SCREEN])
    blocks = [body for _, body in FENCE.findall(first)]
    for line in ("export FT_GRAPH_UPLOAD=auto", "freetoken-graphfix run -- ft serve", "import freetoken_graphfix"):
        assert any(line in body for body in blocks), f"{line!r} is not in a code block of the README's first screen"
    assert len(readme) <= 160, "the details belong in docs/"


def test_the_readme_holds_the_set_up_and_the_tests_ci_runs():
    """The two commands that set the project up and pass its tests: the install CI does and the checks it runs
    (.ci/run), as a reader pastes them; and no install from an index the package is not on."""
    blocks = "\n".join(body for _, body in FENCE.findall((ROOT / "README.md").read_text()))
    ci = (ROOT / ".ci" / "run").read_text()
    assert "-e '.[test]'" in ci and "pip install -e '.[test]'" in blocks
    for check in ("ruff check .", "python -m pytest -q"):
        assert check in ci and check in blocks, check
    assert "pip install freetoken-graphfix" not in blocks


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(page):
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: {target}: no such file"
        if anchor:
            assert anchor in anchors(dest), f"{page.name}: {target}: no such heading in {dest.name}"


def shown_commands(prefixes: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """Every command line the docs' code blocks show that starts with one of ``prefixes`` (backslash
    continuations joined), as (page, argv after the prefix)."""
    found = []
    for page in PAGES:
        for lang, body in FENCE.findall(page.read_text()):
            if lang not in ("", "bash", "sh"):
                continue
            for line in body.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip()
                if line.startswith(("FREETOKEN_PIN_BUDGET_GB=", "GRAPHFIX_RECORDS=")):
                    line = line.split(" ", 1)[1]
                for prefix in prefixes:
                    if line.startswith(prefix + " "):
                        found.append((page.name, shlex.split(line[len(prefix):])))
    return found


BENCH = shown_commands(("freetoken-graphfix bench", "python -m freetoken_graphfix bench"))
TOOLS = shown_commands(("freetoken-graphfix", "python -m freetoken_graphfix"))


def test_the_docs_show_the_commands_this_test_reads():
    assert len(BENCH) > 40 and {argv[0] for _, argv in BENCH} >= set(bench_cli.visible()) - {"deadlock"}


@pytest.mark.parametrize("page, argv", BENCH, ids=[f"{p}:{' '.join(a)[:60]}" for p, a in BENCH])
def test_every_bench_command_the_docs_show_parses(page, argv):
    ours, _ = bench_options.split_freetoken_args(argv)
    bench_cli.parser().parse_args(ours)  # SystemExit (argparse's error) fails the test


@pytest.mark.parametrize("page, argv", [(p, a) for p, a in TOOLS if a[0] != "bench"],
                         ids=[f"{p}:{' '.join(a)[:60]}" for p, a in TOOLS if a[0] != "bench"])
def test_every_other_command_the_docs_show_parses(page, argv):
    ap, _ = main_cli.parser("freetoken-graphfix")
    ap.parse_args(argv)


MODULES = sorted(p for package in ("freetoken_graphfix", "freetoken_graphfix_bench")
                 for p in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_over_400_lines(module):
    assert len(module.read_text().splitlines()) <= 400


def undocumented(tree: ast.AST) -> list[str]:
    """Module-level functions and methods (not nested helpers, not dunders) without a docstring."""
    missing = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                dunder = child.name.startswith("__") and child.name.endswith("__")
                if not nested and not dunder and not ast.get_docstring(child):
                    missing.append(f"{child.name} (line {child.lineno})")
                visit(child, True)
            else:
                visit(child, nested)

    visit(tree, False)
    return missing


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_function_says_why_it_exists(module):
    tree = ast.parse(module.read_text())
    assert ast.get_docstring(tree), "no module docstring"
    assert undocumented(tree) == []


def test_the_docstring_rule_sees_a_missing_one():
    tree = ast.parse("def f():\n    return 1\n\nclass C:\n    def m(self):\n        '''Why.'''\n"
                     "    def n(self): ...\n")
    assert undocumented(tree) == ["f (line 1)", "n (line 7)"]
