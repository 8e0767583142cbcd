"""``patch check|apply|revert``: the upstream-ready series in ``patches/`` on a FreeToken checkout or install.

The series is written against FreeToken's repository layout (``python/freetoken/...`` and
``tests/...``) for one release (``series`` names it); an installed package is the same tree one
level down (``freetoken/...``) and gets the package files only. Every operation runs the whole
series on copies of the files in memory first (exact hunks, any offset, no fuzz: what ``git apply``
does, without needing git), then stages every result beside its target and only then replaces the
targets: all or nothing, and a replace that fails puts back what it replaced. The tree is locked for
the whole read-compute-stage-replace, so two runs on one tree take turns. A tree holds the first k
patches of the series for some k (0: the release, all: applied; in between: ``git am`` stopped, or a
patch applied by hand), and ``apply`` and ``revert`` move it from there.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import PatchError, shown
from . import diffs, tree_writes


def site_note(target: Target) -> str:
    """What ``apply --site`` leaves behind, and the command that brings the shipped files back."""
    return ("pip's RECORD hashes for the patched files no longer match them (pip check does not look; "
            f"`pip install --force-reinstall --no-deps freetoken=={tree_version(target) or series_target()}` "
            "brings the shipped files back), and reinstalling or upgrading FreeToken drops the patch")
PACKAGE = "python/freetoken/"  # the package inside FreeToken's repository


@dataclass(frozen=True)
class Target:
    root: Path  # the directory the patched paths resolve in
    strip: int  # patch -p: 1 for a checkout (python/freetoken/...), 2 for an install (freetoken/...)
    label: str
    package_only: bool = False  # an install has no tests/ to patch: the package's files only
    restore: str = "restore {files} from the release (or a clean checkout)"  # how to bring a file back


@dataclass(frozen=True)
class File:
    rel: str  # path under the target's root
    new: bool  # created by the series (absent from the original tree)


def patch_dir() -> Path:
    """The series: inside the installed wheel, or ``patches/`` beside the source tree."""
    package = Path(__file__).resolve().parents[1]  # freetoken_graphfix/, this module being in its tools/
    for candidate in (package / "_patches", package.parent / "patches"):
        if (candidate / "series").is_file():
            return candidate
    raise PatchError("the patch series is missing from this installation (no patches/series)")


def series() -> list[Path]:
    """The patches, in the order ``patches/series`` lists them."""
    folder = patch_dir()
    names = [line.strip() for line in (folder / "series").read_text().splitlines()]
    return [folder / name for name in names if name and not name.startswith("#")]


def series_target() -> str:
    """The FreeToken release the series is written for (``# target: freetoken X`` in ``series``)."""
    found = re.search(r"^#\s*target:\s*freetoken\s+(\S+)", (patch_dir() / "series").read_text(), re.M)
    if not found:
        raise PatchError(f"{patch_dir() / 'series'} names no target release ('# target: freetoken X')")
    return found.group(1)


def repo_target(path: str | os.PathLike) -> Target:
    """A FreeToken checkout given by ``--repo``, checked to hold ``python/freetoken/``; an empty path is an error, never
    the install."""
    if not str(path).strip():
        raise PatchError("--repo '': empty path; pass a FreeToken checkout (the folder holding python/freetoken/), "
                         "or --site for the installed FreeToken")
    try:
        root = Path(path).resolve()
        exists, is_dir, has_package = root.exists(), root.is_dir(), (root / PACKAGE).is_dir()
    except OSError as exc:
        raise PatchError(f"--repo {shown(str(path))}: {exc.strerror or exc}") from None
    if not is_dir:
        raise PatchError(f"--repo {shown(str(path))}: {'not a directory' if exists else 'no such directory'}; "
                         "pass a FreeToken checkout (the folder holding python/freetoken/)")
    if not has_package:
        raise PatchError(f"--repo {shown(str(path))}: no python/freetoken/ in it; expected a FreeToken checkout")
    return Target(root, 1, f"checkout {root}")


def site_target() -> Target:
    """The installed FreeToken (``--site``): its package folder, patched without the ``python/`` prefix."""
    spec = importlib.util.find_spec("freetoken")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("--site: FreeToken is not installed in this environment (no 'freetoken' package)")
    return installed_target(Path(next(iter(spec.submodule_search_locations))).resolve())


def installed_target(package: Path) -> Target:
    """An installed FreeToken's ``package`` folder as a target: a file to bring back comes back by reinstalling."""
    return Target(package.parent, 2, f"installed FreeToken at {package}", package_only=True,
                  restore=f"restore {{files}}: pip install --force-reinstall --no-deps freetoken=={series_target()}")


def tree_version(target: Target) -> str | None:
    """The release the tree holds, from its ``freetoken/version.py``."""
    version = target.root / ("python/freetoken" if target.strip == 1 else "freetoken") / "version.py"
    found = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", "".join(_lines(version, target) or []))
    return found.group(1) if found else None


def check_release(target: Target) -> None:
    """Refuse, in one line, a tree of another release than the series is written for."""
    want, have = series_target(), tree_version(target)
    if have != want:
        raise PatchError(f"the {target.label} is FreeToken {have or 'of unknown version'}; the patch series targets "
                         f"FreeToken {want} only (its first-launch fill builds on {want}'s ple_disk.py _fill_decode). "
                         f"On {have or 'that release'}, protect the graphs with the shim instead: "
                         "FT_GRAPH_UPLOAD=auto")


def _diffs(patch: Path, target: Target) -> list[diffs.FileDiff]:
    """The patch's per-file diffs that concern ``target``, their paths under its root."""
    return [d.placed(target.strip) for d in diffs.parse(patch.read_text())
            if not (target.package_only and not d.path.startswith(PACKAGE))]


def _files(target: Target) -> list[File]:
    """Every file the series touches, once, with whether it creates it."""
    out: dict[str, File] = {}
    for patch in series():
        for diff in _diffs(patch, target):
            out.setdefault(diff.path, File(diff.path, diff.new))
    return list(out.values())


def _apply_patches(contents: dict[str, list[str] | None], target: Target, patches: list[Path], reverse: bool,
                   only: str | None = None) -> str | None:
    """Apply ``patches`` in order (or revert them, last first) to ``contents`` in place; the error
    when one does not fit."""
    for patch in (reversed(patches) if reverse else patches):
        for diff in _diffs(patch, target):
            if only is not None and diff.path != only:
                continue
            try:
                contents[diff.path] = diffs.apply(contents.get(diff.path), diff, reverse)
            except diffs.Misfit as exc:
                return f"{patch.name}: {exc}"
    return None


def _lines(path: Path, target: Target) -> list[str] | None:
    """A file's lines (``None``: no such file); a file that cannot be read, or is not UTF-8 text, is
    one :class:`PatchError` naming it."""
    rel = path.relative_to(target.root) if path.is_relative_to(target.root) else path
    try:
        if not path.is_file():
            return None
        return path.read_bytes().decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError as exc:
        raise PatchError(f"{rel} is not UTF-8 text (byte {exc.start}); restore it from the release; nothing was "
                         "changed") from None
    except OSError as exc:
        raise PatchError(f"cannot read {rel}: {exc.strerror or exc}; nothing was changed") from None


def _read(target: Target) -> dict[str, list[str] | None]:
    """The tree's current lines of every file the series touches (``None``: absent)."""
    return {f.rel: _lines(target.root / f.rel, target) for f in _files(target)}


def _fits(target: Target, f: File, reverse: bool) -> str | None:
    """Whether the series' hunks for one file fit it in one direction; the error when not."""
    return _apply_patches({f.rel: _lines(target.root / f.rel, target)}, target, series(), reverse, only=f.rel)


def _diagnose(target: Target) -> str:
    """Which file stops the series, in which direction: per file, original or patched or neither, and
    what brings each file that stops it back to the release."""
    original, patched = [], []
    for f in _files(target):
        forward, backward = _fits(target, f, False), _fits(target, f, True)
        if forward is None:
            original.append(f.rel)
        elif backward is None:
            patched.append(f)
        else:
            return (f"{f.rel} matches neither the original nor the patched sources (applying: {forward}; "
                    f"reverting: {backward}); {_back_to_release([f], target)}")
    states = [f"{', '.join(names)} {word}" for names, word in (([f.rel for f in patched], "patched"),
                                                                (original, "original")) if names]
    return (f"partly patched: {', '.join(states)} (not a prefix of the series); "
            f"{_back_to_release(patched, target)} and run the command again")


def _back_to_release(files: list[File], target: Target) -> str:
    """``remove X (the release has no such file); restore Y from the release (or a clean checkout)``; for an
    installed FreeToken, the reinstall that restores it."""
    new, edited = [f.rel for f in files if f.new], [f.rel for f in files if not f.new]
    steps = ([f"remove {', '.join(new)} (the release has no such file)"] if new else []) + (
        [target.restore.format(files=", ".join(edited))] if edited else [])
    return "; ".join(steps)


@contextlib.contextmanager
def _locked(target: Target, exclusive: bool) -> Iterator[None]:
    """Hold the tree for one read-compute-stage-replace: another patch run on it waits (an advisory
    lock on the tree's root folder, released when this process ends however it ends)."""
    try:
        fd = os.open(target.root, os.O_RDONLY)
    except OSError as exc:
        raise PatchError(f"cannot open the {target.label}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def _position(target: Target) -> tuple[int, dict[str, list[str] | None]]:
    """How many patches of the series, from the first, the tree holds, and its files as read."""
    check_release(target)
    patches, current = series(), _read(target)
    for k in range(len(patches) + 1):
        release = dict(current)
        if (_apply_patches(release, target, patches[:k], reverse=True) is None
                and _apply_patches(release, target, patches, reverse=False) is None):
            return k, current
    raise PatchError(f"the {target.label} does not fit the series: {_diagnose(target)}; nothing was changed")


def _describe(k: int) -> str:
    """A state in words: not applied, applied, or the first ``k`` patches with what to do next."""
    patches = series()
    if k == 0:
        return "not applied"
    if k == len(patches):
        return "applied"
    return (f"partly applied: the first {k} of {len(patches)} patches ({', '.join(p.name for p in patches[:k])}); "
            "'patch apply' applies the rest, 'patch revert' undoes them")


def state(target: Target) -> tuple[int, str]:
    """How many patches of the series, from the first, the tree holds, and that said in words:
    ``"applied"``, ``"not applied"`` or ``"partly applied: ..."``. :class:`PatchError` naming the file
    and hunk when the tree fits no prefix of the series."""
    with _locked(target, exclusive=False):
        k = _position(target)[0]
    return k, _describe(k)


def apply(target: Target) -> tuple[bool, str]:
    """Apply the series (what the tree lacks of it); ``(whether files changed, what happened)``."""
    return _move(target, reverse=False)


def revert(target: Target) -> tuple[bool, str]:
    """Revert the series to the release's exact bytes; ``(whether files changed, what happened)``."""
    return _move(target, reverse=True)


def _move(target: Target, reverse: bool) -> tuple[bool, str]:
    """Apply the rest of the series, or revert what is applied, under the tree's lock: all files or none."""
    with _locked(target, exclusive=True):
        k, current = _position(target)
        patches = series()[:k] if reverse else series()[k:]
        if not patches:
            return False, (f"the series is not applied to the {target.label}; nothing to revert" if reverse
                           else f"the series is already applied to the {target.label}; nothing to do")
        contents = dict(current)
        _apply_patches(contents, target, patches, reverse)  # fits: _position tried it
        changed = {rel: None if lines is None else "".join(lines).encode("utf-8")
                   for rel, lines in contents.items() if lines != current[rel]}
        tree_writes.write_all(target.root, target.label, changed)
    verb, preposition = ("reverted", "from") if reverse else ("applied", "to")
    return True, f"{verb} {_count(patches)} {preposition} the {target.label}"


def patched_copy(dest: Path) -> Path:
    """A copy of the installed FreeToken with the series applied, under ``dest`` (``dest/freetoken``):
    put ``dest`` first on ``PYTHONPATH`` to run the patched release beside the installed one."""
    site = site_target()
    copy = Target(dest, 2, f"patched copy of FreeToken at {dest}", package_only=True)
    if not (dest / "freetoken").is_dir():
        shutil.copytree(site.root / "freetoken", dest / "freetoken", ignore=shutil.ignore_patterns("__pycache__"))
    apply(copy)  # a copy already patched is left as it is
    return dest


def applied_to_site() -> bool:
    """Whether the whole series is applied to the installed FreeToken (``False`` where that cannot be told)."""
    if importlib.util.find_spec("freetoken") is None:
        return False
    try:
        return state(site_target())[0] == len(series())
    except PatchError:
        return False


def describe_installed() -> str:
    """One line for doctor: which series, and its state on the installed FreeToken."""
    if importlib.util.find_spec("freetoken") is None:
        return f"not applicable: FreeToken is not installed (the series is for FreeToken {series_target()})"
    try:
        target = site_target()
        where = f"{_count(series())} for FreeToken {series_target()} in {patch_dir()}"
        return f"{state(target)[1]} ({where})"
    except PatchError as exc:
        return str(exc)


def _count(patches: list[Path]) -> str:
    """``1 patch`` or ``N patches``."""
    return f"{len(patches)} patch{'' if len(patches) == 1 else 'es'}"
