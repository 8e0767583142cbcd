"""The compatibility check's cheap readings agree with the slow ones they replace: a version compared as PEP 440
compares it (``packaging`` is the oracle), and DiskRowTable's methods cut from the text exactly as parsing the whole
file finds them, on every release that has the table, and with the patch series applied."""

from __future__ import annotations

import pytest
from packaging.version import InvalidVersion, Version

from freetoken_graphfix import compat
from tests.tools.test_patches import checkout

VERSIONS = ["0.2.1", "v0.2.1", "0.2.1.0", "0.2", "0.2.0", "0.1.3", "0.1.2", "0.2.1.post1", "0.2.1+local", "0.2.1rc1",
            "0.2.1.dev3", "1!0.2.1", "0.2.1-dirty-tree", "unknown", "", "0.2.1 ", "0.3.0", "0.2.10", "00.2.1",
            "0.2.\u00b9"]


def pep440_tested(version: str) -> bool:
    try:
        return Version(version) in {Version(v) for v in compat.TESTED}
    except InvalidVersion:
        return False


@pytest.mark.parametrize("version", VERSIONS)
def test_a_tested_release_is_what_pep_440_says(version):
    assert compat.is_tested(version) == pep440_tested(version)


def test_the_oracle_tells_the_cases_apart():
    assert [v for v in VERSIONS if pep440_tested(v)] == ["0.2.1", "v0.2.1", "0.2.1.0", "0.2", "0.2.0", "0.1.3", "0.1.2",
                                                         "0.2.1 ", "00.2.1"]
    assert not compat.is_tested(None)


def ple_text(tree) -> str:
    return (tree / "freetoken" / "models" / "qwen4_exp" / "ple_disk.py").read_text(encoding="utf-8")


@pytest.mark.parametrize("version", ["0.1.3", "0.2.0", "0.2.1"])
def test_the_methods_cut_are_the_methods_parsed(freetoken_tree, version):
    text = ple_text(freetoken_tree(version))
    cut = compat.methods_cut(text, "DiskRowTable", compat.PLE_METHODS)
    assert cut is not None and all(cut.values())
    assert cut == compat.methods_parsed(text, "DiskRowTable", compat.PLE_METHODS)


def test_the_methods_cut_from_the_patched_table_are_the_methods_parsed(freetoken_tree, tmp_path):
    from freetoken_graphfix.tools import series

    repo = checkout(freetoken_tree("0.2.1"), tmp_path / "FreeToken", git=False)
    series.apply(series.repo_target(str(repo)))
    text = (repo / "python" / "freetoken" / "models" / "qwen4_exp" / "ple_disk.py").read_text(encoding="utf-8")
    assert compat.SERIES_MARKER in text
    assert compat.methods_cut(text, "DiskRowTable", compat.PLE_METHODS) == \
        compat.methods_parsed(text, "DiskRowTable", compat.PLE_METHODS)


TABLE = '''\
import os


class DiskRowTable(Base):
    """A table."""

    def lookup(
        self, ids,
    ) -> None:
        self._flag.wait()
        # the end of lookup

    @property
    def host_fill_batch(self):
        return _complete
    # a comment between methods: self._flag

    def other(self):
        def forward_host_ctx():  # nested: not the method
            pass


def after():
    pass
'''


def test_a_cut_ends_where_the_parsed_method_ends():
    """A signature closed at the body's indent, a decorator, a trailing comment, a nested function of the same name."""
    cut = compat.methods_cut(TABLE, "DiskRowTable", compat.PLE_METHODS)
    assert cut == compat.methods_parsed(TABLE, "DiskRowTable", compat.PLE_METHODS)
    assert cut["forward_host_ctx"] == "" and "self._flag" not in cut["host_fill_batch"]


def test_a_text_the_cut_cannot_read_is_left_to_the_parser():
    """A string running back to the body's indent ends a cut early: it does not parse, so the file is parsed."""
    note = '        """A note\n    written here"""\n'
    odd = TABLE.replace("        self._flag.wait()\n", note + "        self._flag.wait()\n")
    assert compat.methods_cut(odd, "DiskRowTable", compat.PLE_METHODS) is None
    assert "self._flag" in compat.methods_parsed(odd, "DiskRowTable", compat.PLE_METHODS)["lookup"]
    assert compat.methods_cut("class Other:\n    pass\n", "DiskRowTable", compat.PLE_METHODS) is None
