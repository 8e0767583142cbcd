"""Writing the files of a tree all or nothing, never through a link: what ``patch apply`` and ``patch revert``
do once the series has been applied in memory."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .. import safe_files
from ..errors import PatchError


def write_all(root: Path, label: str, contents: dict[str, bytes | None]) -> None:
    """Every file written, or none: stage each result beside its target, then replace them all,
    putting back what was replaced if a replace fails; folders made for new files go again."""
    for rel in contents:
        _refuse_links(root, label, rel)
    staged: list[tuple[Path, Path | None]] = []  # (target file, staged copy; None: delete it)
    made: list[Path] = []  # folders created for new files
    rel = ""
    try:
        for rel, data in contents.items():
            dest = root / rel
            if data is None:
                staged.append((dest, None))
                continue
            missing = [p for p in (dest.parent, *dest.parent.parents) if p.is_relative_to(root)
                       and not p.exists()]
            dest.parent.mkdir(parents=True, exist_ok=True)
            made += missing
            fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".graphfix-staged")
            tmp = Path(name)  # a fresh name (O_EXCL): a link planted at a fixed one is never written through
            staged.append((dest, tmp))
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            if dest.exists():
                shutil.copymode(dest, tmp)
            else:
                os.chmod(tmp, safe_files.default_mode())  # mkstemp's 0600 is for staging, not for the file
        before = {dest: dest.read_bytes() if dest.exists() else None for dest, _ in staged}
    except OSError as exc:
        _discard(staged, made)
        raise PatchError(f"cannot write {rel}: {exc.strerror or exc}; nothing was changed") from None
    done: list[Path] = []
    try:
        for dest, tmp in staged:
            if tmp is None:
                dest.unlink()
                _prune(dest.parent, root)
            else:
                os.replace(tmp, dest)
            done.append(dest)
    except OSError as exc:
        failed = dest.relative_to(root)
        for path in done:
            _restore(path, before[path])
        _discard(staged, made)
        raise PatchError(f"cannot replace {failed}: {exc.strerror or exc}; the {len(done)} file(s) already replaced "
                         "were put back, nothing was changed") from None


def _refuse_links(root: Path, label: str, rel: str) -> None:
    """A file the series writes must be a regular file (or a new one) inside the tree, reached through no
    symbolic link: a link in a shared checkout would have it write outside the tree."""
    dest = root / rel
    inside = [p for p in (dest, *dest.parents) if p.is_relative_to(root) and p != root]
    link = next((p for p in inside if p.is_symlink()), None)
    if link is not None:
        raise PatchError(f"{link.relative_to(root)} is a symbolic link; the series writes only regular files "
                         f"inside the {label}, never through a link; nothing was changed")


def _discard(staged: list[tuple[Path, Path | None]], made: list[Path]) -> None:
    """Remove the staged copies and the folders made for them (when empty)."""
    for _, tmp in staged:
        if tmp is not None and tmp.exists():
            tmp.unlink()
    for folder in sorted(made, key=lambda p: len(p.parts), reverse=True):  # deepest first
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def _restore(path: Path, data: bytes | None) -> None:
    """Put a file back as it was (``None``: it did not exist)."""
    if data is None:
        path.unlink(missing_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _prune(folder: Path, root: Path) -> None:
    """Remove the folders a reverted new file leaves empty, up to the tree's root."""
    while folder != root and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
