"""No write of the package follows a link another local user planted: the status folder, the bench's
outputs and logs. The attacker here plants links at every name a write could use, as a user sharing
the machine could in a world-writable folder."""

from __future__ import annotations

import json
import os
import stat

import pytest

from freetoken_graphfix import safe_files, status_record
from freetoken_graphfix.errors import UnsafePathError
from freetoken_graphfix_bench import outputs, record_files, registry


def victim(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious\n")
    return target


def test_the_status_folder_must_be_private(tmp_path):
    """A shared (world-writable, sticky) folder, a link to a folder and another user's folder are refused in one line;
    a missing one is made 0700."""
    status = status_record.unavailable("x")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(UnsafePathError, match="writable by others"):
        status_record.write(status, str(shared))
    (tmp_path / "link").symlink_to(tmp_path / "private-elsewhere", target_is_directory=True)
    (tmp_path / "private-elsewhere").mkdir(mode=0o700)
    with pytest.raises(UnsafePathError, match="a symbolic link"):
        status_record.write(status, str(tmp_path / "link"))
    made = tmp_path / "new" / "status"
    path = status_record.write(status, str(made))
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [s.pid for s in status_record.read_all(str(made))] == [os.getpid()]


def test_a_link_planted_at_the_status_files_name_is_replaced_not_followed(tmp_path):
    folder = tmp_path / "status"
    folder.mkdir(mode=0o700)
    target = victim(tmp_path)
    status = status_record.unavailable("x")
    final = folder / f"freetoken_graphfix-{status.pid}.json"
    final.symlink_to(target)
    for pid in range(os.getpid(), os.getpid() + 50):  # the staging names the old code used
        (folder / f"freetoken_graphfix-{status.pid}.json.{pid}.tmp").symlink_to(target)
    status_record.write(status, str(folder))
    assert target.read_text() == "precious\n"
    assert not final.is_symlink() and json.loads(final.read_text())["pid"] == status.pid


def test_a_damaged_status_file_is_one_line_naming_it(tmp_path):
    folder = tmp_path / "status"
    folder.mkdir(mode=0o700)
    (folder / "freetoken_graphfix-1.json").write_text(json.dumps({"installed": True}))
    with pytest.raises(status_record.StatusFileError, match=r"freetoken_graphfix-1.json: not a status .*KeyError"):
        status_record.read_all(str(folder))


def test_outputs_replace_a_link_at_their_name_and_refuse_one_up_front(tmp_path):
    target = victim(tmp_path)
    link = tmp_path / "out.json"
    link.symlink_to(target)
    assert "a symbolic link" in outputs.check_writable(str(link), "--json")
    safe_files.write_text(str(link), "{}\n")  # past the check (a race): still never through the link
    assert target.read_text() == "precious\n" and not link.is_symlink() and link.read_text() == "{}\n"


def test_a_record_is_written_through_a_fresh_file(tmp_path, monkeypatch):
    """``--json`` goes through ``safe_files``: no file of a predictable name is opened for writing."""
    opened: list[str] = []
    real_open = open

    def watching(path, mode="r", *args, **kwargs):
        if "w" in mode or "a" in mode:
            opened.append(os.path.basename(str(path)))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", watching)
    record = registry.read(str(next(p for p in sorted((records_dir()).glob("*.json")))))
    record_files.write(str(tmp_path / "r.json"), record)
    assert opened and all(name.startswith(".r.json.") and name.endswith(".tmp.json") for name in opened)
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def records_dir():
    from pathlib import Path

    return Path(__file__).resolve().parents[1] / "records"


def test_a_failed_write_leaves_neither_the_output_nor_a_stray_file(tmp_path):
    with pytest.raises(RuntimeError), safe_files.staged(str(tmp_path / "x.png")) as temporary:
        open(temporary, "w").write("half")
        raise RuntimeError("the plot failed")
    assert list(tmp_path.iterdir()) == []


def test_the_logs_folder_is_made_private_or_refused(tmp_path):
    assert outputs.logs_unusable(str(tmp_path / "logs")) is None
    assert stat.S_IMODE(os.stat(tmp_path / "logs").st_mode) == 0o700
    os.chmod(tmp_path / "logs", 0o777)
    assert "writable by others (mode 777)" in outputs.logs_unusable(str(tmp_path / "logs"))
