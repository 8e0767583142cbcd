"""Held folders and checked reads: a path is checked once, on the descriptor that was opened, and everything after
goes through that descriptor. The attacker swaps the folder's path after the check, plants links and special files;
nothing written or read follows them."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from freetoken_graphfix import held
from freetoken_graphfix.errors import UnsafePathError


def test_a_swapped_folder_path_changes_nothing_written(tmp_path):
    """The folder is renamed away and a link to the victim's folder put at its path after the check: the write
    lands in the folder that was checked, never in the victim's."""
    mine, victim = tmp_path / "logs", tmp_path / "victim"
    mine.mkdir(mode=0o700)
    victim.mkdir()
    with held.held(str(mine), "--logs") as folder:
        mine.rename(tmp_path / "moved")
        mine.symlink_to(victim, target_is_directory=True)
        folder.write("engine.log", b"data")
        fd = folder.create("other.log")
        os.close(fd)
        assert folder.names() == ["engine.log", "other.log"]
    assert os.listdir(victim) == [] and sorted(os.listdir(tmp_path / "moved")) == ["engine.log", "other.log"]


@pytest.mark.parametrize("policy", [held.PRIVATE_FOLDER, held.OUTPUT_FOLDER])
def test_a_link_to_a_folder_is_refused(tmp_path, policy):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    with pytest.raises(UnsafePathError, match="a symbolic link; accepted values"):
        held.Folder.open(str(tmp_path / "link"), "--logs", policy)


def test_private_refuses_a_shared_folder_and_output_takes_a_sticky_one(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(UnsafePathError, match=r"writable by others \(mode 1777\)"):
        held.Folder.open(str(shared), "FT_GRAPHFIX_STATUS_DIR")
    with held.held(str(shared), "--json", held.OUTPUT_FOLDER) as folder:
        folder.write("r.json", b"{}", mode=0o644)
    assert stat.S_IMODE(os.stat(shared / "r.json").st_mode) == 0o644


def test_make_creates_a_private_folder_and_refuses_a_file(tmp_path):
    with held.held(str(tmp_path / "a" / "b"), "status", make=True) as folder:
        assert folder.names() == []
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "b").st_mode) == 0o700
    (tmp_path / "file").write_text("x")
    with pytest.raises(UnsafePathError, match="'status' is not|not a directory"):
        held.Folder.open(str(tmp_path / "file"), "status")
    with pytest.raises(UnsafePathError, match="an empty path"):
        held.Folder.open("", "status")


def test_a_link_planted_at_the_final_name_is_replaced_and_create_refuses_any_entry(tmp_path):
    target = tmp_path / "precious"
    target.write_text("precious")
    (tmp_path / "f").mkdir(mode=0o700)
    (tmp_path / "f" / "out.json").symlink_to(target)
    (tmp_path / "f" / "new.log").symlink_to(tmp_path / "nowhere")
    with held.held(str(tmp_path / "f"), "out") as folder:
        folder.write("out.json", b"fresh")
        with pytest.raises(FileExistsError):
            folder.create("new.log")
        folder.remove("new.log")
        folder.remove("new.log")  # gone already is fine
        with pytest.raises(UnsafePathError, match="not a plain file name"):
            folder.write("../escape", b"x")
    assert target.read_text() == "precious" and (tmp_path / "f" / "out.json").read_bytes() == b"fresh"
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "escape").exists()


def test_a_subfolder_is_never_reached_through_a_link(tmp_path):
    (tmp_path / "f").mkdir(mode=0o700)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "f" / "copy").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with held.held(str(tmp_path / "f"), "--logs") as folder:
        with pytest.raises(UnsafePathError, match="a symbolic link"):
            folder.subfolder("copy", "the patched copy")
        with folder.subfolder("fresh", "the patched copy") as sub:
            sub.write("x.py", b"")
    assert (tmp_path / "f" / "fresh" / "x.py").exists()


def test_reads_refuse_what_is_not_a_bounded_regular_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = threading.Event()

    def read_fifo():
        with pytest.raises(UnsafePathError, match="a FIFO, not a regular file"):
            held.read_file(str(fifo), 100, "RECORD")
        done.set()

    reader = threading.Thread(target=read_fifo, daemon=True)
    reader.start()
    reader.join(10)
    assert done.is_set(), "reading a FIFO hung"
    with pytest.raises(UnsafePathError, match="'/dev/zero': a device"):
        held.read_file("/dev/zero", 100, "RECORD")
    with pytest.raises(UnsafePathError, match="a directory, not a regular file"):
        held.read_file(str(tmp_path), 100, "RECORD")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(UnsafePathError, match="101 bytes, over the 100-byte limit"):
        held.read_file(str(big), 100, "RECORD")
    assert held.read_file(str(big), 101, "RECORD") == b"x" * 101
    with pytest.raises(UnsafePathError, match="cannot be read"):
        held.read_file(str(tmp_path / "missing"), 100, "RECORD")


def test_a_size_that_lies_is_still_bounded():
    """``/proc`` files report size 0: the read itself is bounded."""
    with pytest.raises(UnsafePathError, match="over the 10-byte limit"):
        held.read_file("/proc/self/status", 10, "RECORD")


def test_the_read_takes_at_most_the_cap_and_one_byte(tmp_path, monkeypatch):
    """A size that lies (0, as ``/proc`` reports) on a file far over the cap: the read stops at the cap and one
    byte, it never takes the whole file into memory first."""
    big = tmp_path / "big"
    big.write_bytes(b"x" * 50_000)
    real_fstat, real_read, taken = os.fstat, os.read, []
    monkeypatch.setattr(held.os, "fstat", lambda fd: os.stat_result((*real_fstat(fd)[:6], 0, *real_fstat(fd)[7:])))
    monkeypatch.setattr(held.os, "read", lambda fd, n: taken.append(n) or real_read(fd, n))
    with pytest.raises(UnsafePathError, match="over the 1,000-byte limit"):
        held.read_file(str(big), 1000, "RECORD")
    assert sum(taken) <= 1001
