"""``child.run``, the one way this package runs a child process, against real child processes: the
answer read back, every failure one line naming why with the child's last stderr line, nothing the
child printed lost from its log."""

from __future__ import annotations

import json
import sys

import pytest

from freetoken_graphfix.tools import child


def python(code: str) -> list[str]:
    return [sys.executable, "-c", "import json, sys\nfrom freetoken_graphfix.tools import child\n" + code]


def test_the_answer_is_the_last_tagged_line_and_the_rest_goes_to_the_log(tmp_path):
    log = str(tmp_path / "c.log")
    code = ("print('INFO a library writes to stdout')\nchild.answer({'n': 1})\n"
            "print('warming up', file=sys.stderr)\nchild.answer({'n': 2})")
    assert child.run(python(code), log=log, timeout=60) == {"n": 2}
    text = open(log).read()
    assert text.startswith("$ ") and "warming up" in text and "INFO a library writes to stdout" in text
    assert child.RESULT_TAG not in text


def test_the_spec_is_a_json_file_beside_the_log_given_as_the_last_argument(tmp_path):
    code = "spec = json.load(open(sys.argv[-1]))\nchild.answer({'got': spec, 'path': sys.argv[-1]})"
    found = child.run(python(code), log=str(tmp_path / "arm.log"), timeout=60, spec={"steps": 3})
    assert found == {"got": {"steps": 3}, "path": str(tmp_path / "arm.spec.json")}


@pytest.mark.parametrize(("code", "why"), [
    ("print('INFO after', flush=True)\nraise RuntimeError('CUDA error: out of memory')",
     r"^exited 1: RuntimeError: CUDA error: out of memory$"),
    ("print('no tag here')", r"^exited 0 without an answer: no output$"),
    ("print(child.RESULT_TAG + '{not json')", r"^its answer is not JSON \("),
    ("print(child.RESULT_TAG + '[1, 2]')", r"^its answer is not a JSON object: \[1, 2\]$"),
    ("child.answer({'early': 1})\nsys.exit(3)", r"^exited 3: no output$"),
])
def test_a_child_that_does_not_answer_is_one_line_naming_why(tmp_path, code, why):
    with pytest.raises(child.ChildError, match=why) as err:
        child.run(python(code), log=str(tmp_path / "c.log"), timeout=60)
    assert "\n" not in str(err.value)


def test_a_hung_child_is_killed_at_its_timeout_with_its_last_words(tmp_path):
    code = "print('stuck in the first launch', file=sys.stderr, flush=True)\nimport time\ntime.sleep(60)"
    with pytest.raises(child.ChildError, match=r"^killed after 3 s: stuck in the first launch$"):
        child.run(python(code), log=str(tmp_path / "c.log"), timeout=3)


def test_tail_joins_the_last_lines_of_stderr(tmp_path):
    code = "for i in range(5): print(f'line {i}', file=sys.stderr)\nsys.exit(1)"
    with pytest.raises(child.ChildError, match=r"^exited 1: line 2 \| line 3 \| line 4$"):
        child.run(python(code), log=str(tmp_path / "c.log"), timeout=60, tail=3)


def test_the_engine_child_answers_with_the_same_tag():
    """The engine child must not import the package (the .pth alone brings the shim), so it holds
    the tag itself."""
    from freetoken_graphfix_bench.engine import run

    text = run.CHILD.read_text()
    assert f"RESULT_TAG = {json.dumps(child.RESULT_TAG)}" in text
