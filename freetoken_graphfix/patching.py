"""``patch check|apply|revert``: the upstream-ready series in ``patches/`` on a FreeToken checkout or install.

The series is written against FreeToken's repository layout (``python/freetoken/...`` and
``tests/...``) for one release (``series`` names it); an installed package is the same tree one
level down (``freetoken/...``) and gets the package files only. Every operation runs the whole
series on scratch copies first (``git apply``), then stages every result beside its target and only
then replaces the targets: all or nothing, and a replace that fails puts back what it replaced. A
tree is "applied" when the series reverses cleanly on it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import PatchError

SITE_NOTE = ("pip's RECORD hashes for the patched files no longer match them (pip check does not look; "
             "`pip install --force-reinstall --no-deps freetoken==VERSION` brings the shipped files back), "
             "and reinstalling or upgrading FreeToken drops the patch")
PACKAGE = "python/freetoken/"  # the package inside FreeToken's repository


@dataclass(frozen=True)
class Target:
    root: Path  # the directory the patched paths resolve in
    strip: int  # git apply -p: 1 for a checkout (python/freetoken/...), 2 for an install (freetoken/...)
    label: str
    package_only: bool = False  # an install has no tests/ to patch: the package's files only


@dataclass(frozen=True)
class File:
    rel: str  # path under the target's root
    new: bool  # created by the series (absent from the original tree)


def patch_dir() -> Path:
    """The series: inside the installed wheel, or ``patches/`` beside the source tree."""
    for candidate in (Path(__file__).parent / "_patches", Path(__file__).resolve().parents[1] / "patches"):
        if (candidate / "series").is_file():
            return candidate
    raise PatchError("the patch series is missing from this installation (no patches/series)")


def series() -> list[Path]:
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
    if not str(path).strip():
        raise PatchError("--repo '': empty path; pass a FreeToken checkout (the folder holding python/freetoken/), "
                         "or --site for the installed FreeToken")
    root = Path(path).resolve()
    if not root.is_dir():
        raise PatchError(f"--repo {str(path)!r}: no such directory")
    if not (root / PACKAGE).is_dir():
        raise PatchError(f"--repo {str(path)!r}: no python/freetoken/ in it; expected a FreeToken checkout")
    return Target(root, 1, f"checkout {root}")


def site_target() -> Target:
    spec = importlib.util.find_spec("freetoken")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("--site: FreeToken is not installed in this environment (no 'freetoken' package)")
    package = Path(next(iter(spec.submodule_search_locations))).resolve()
    return Target(package.parent, 2, f"installed FreeToken at {package}", package_only=True)


def tree_version(target: Target) -> str | None:
    """The release the tree holds, from its ``freetoken/version.py``."""
    version = target.root / ("python/freetoken" if target.strip == 1 else "freetoken") / "version.py"
    try:
        found = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", version.read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def check_release(target: Target) -> None:
    """Refuse, in one line, a tree of another release than the series is written for."""
    want, have = series_target(), tree_version(target)
    if have != want:
        raise PatchError(f"the {target.label} is FreeToken {have or 'of unknown version'}; the patch series targets "
                         f"FreeToken {want} only (its first-launch fill builds on {want}'s ple_disk.py fill worker). "
                         f"On {have or 'that release'}, protect the graphs with the shim instead: "
                         "FT_GRAPH_UPLOAD=auto (see python -m freetoken_graphfix doctor)")


def _files(target: Target) -> list[File]:
    out: dict[str, File] = {}
    for patch in series():
        old = None
        for line in patch.read_text().splitlines():
            if line.startswith("--- "):
                old = line[4:]
            elif line.startswith("+++ ") and not line.endswith("/dev/null"):
                path = line[6:] if line.startswith("+++ b/") else line[4:]
                if target.package_only and not path.startswith(PACKAGE):
                    continue
                rel = "/".join(path.split("/")[target.strip - 1:])
                out.setdefault(rel, File(rel, old == "/dev/null"))
    return list(out.values())


def _git_apply(workdir: Path, patch: Path, target: Target, reverse: bool, only: str | None = None) -> str | None:
    """Apply one patch in ``workdir``; the error text when it does not fit."""
    if shutil.which("git") is None:
        raise PatchError("git is needed to apply the series (git apply); install git")
    include = only or ("freetoken/*" if target.package_only else None)
    cmd = ["git", "apply", f"-p{target.strip}", *(["-R"] if reverse else []),
           *([f"--include={include}"] if include else []), str(patch)]
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(workdir.parent)}  # never a repo above the scratch dir
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    errors = [line.removeprefix("error: ") for line in proc.stderr.splitlines() if line.startswith("error:")]
    return "; ".join(errors) or proc.stderr.strip()


def _scratch(target: Target, files: list[File], reverse: bool, tmp: Path) -> Path | str:
    """A scratch tree holding the target's copies of ``files``; or why it cannot be made."""
    scratch = tmp / "tree"
    for f in files:
        src = target.root / f.rel
        if src.is_file():
            (scratch / f.rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, scratch / f.rel)
        elif not f.new or reverse:
            return f"{f.rel}: missing from the {target.label}"
    scratch.mkdir(parents=True, exist_ok=True)
    return scratch


def _run(target: Target, reverse: bool) -> tuple[dict[str, bytes | None] | None, str]:
    """The series (or its reverse) on scratch copies: new contents per file (``None``: delete), or
    why it does not fit."""
    patches, files = series(), _files(target)
    with tempfile.TemporaryDirectory(prefix="graphfix-patch-") as tmp:
        scratch = _scratch(target, files, reverse, Path(tmp))
        if isinstance(scratch, str):
            return None, scratch
        for patch in (reversed(patches) if reverse else patches):
            error = _git_apply(scratch, patch, target, reverse)
            if error:
                return None, f"{patch.name}: {error}"
        return {f.rel: (scratch / f.rel).read_bytes() if (scratch / f.rel).is_file() else None for f in files}, ""


def _fits(target: Target, f: File, reverse: bool) -> str | None:
    """Whether the series' hunks for one file fit it in one direction; the error when not."""
    with tempfile.TemporaryDirectory(prefix="graphfix-patch-") as tmp:
        scratch = _scratch(target, [f], reverse, Path(tmp))
        if isinstance(scratch, str):
            return scratch
        only = "/".join(f.rel.split("/"))
        for patch in (reversed(series()) if reverse else series()):
            error = _git_apply(scratch, patch, target, reverse, only=only)
            if error:
                return f"{patch.name}: {error}"
    return None


def _diagnose(target: Target) -> str:
    """Which file stops the series, in which direction: per file, original or patched or neither."""
    original, patched = [], []
    for f in _files(target):
        forward, backward = _fits(target, f, False), _fits(target, f, True)
        if forward is None:
            original.append(f.rel)
        elif backward is None:
            patched.append(f.rel)
        else:
            return (f"{f.rel} matches neither the original nor the patched sources (applying: {forward}; "
                    f"reverting: {backward})")
    return (f"partly patched: {', '.join(patched)} patched, {', '.join(original)} original; restore those "
            "files from the release (or a clean checkout) and run the command again")


def state(target: Target) -> str:
    """``"applied"`` or ``"not applied"``; :class:`PatchError` naming the file and hunk otherwise."""
    check_release(target)
    if _run(target, reverse=False)[0] is not None:
        return "not applied"
    if _run(target, reverse=True)[0] is not None:
        return "applied"
    raise PatchError(f"the {target.label} does not fit the series: {_diagnose(target)}; nothing was changed")


def apply(target: Target) -> tuple[bool, str]:
    """Apply the series; ``(whether files changed, what happened)``."""
    return _move(target, reverse=False)


def revert(target: Target) -> tuple[bool, str]:
    """Revert the series to the release's exact bytes; ``(whether files changed, what happened)``."""
    return _move(target, reverse=True)


def _move(target: Target, reverse: bool) -> tuple[bool, str]:
    if state(target) == ("not applied" if reverse else "applied"):
        return False, (f"the series is not applied to the {target.label}; nothing to revert" if reverse
                       else f"the series is already applied to the {target.label}; nothing to do")
    contents, _ = _run(target, reverse)
    _write_all(target, contents)
    verb, preposition = ("reverted", "from") if reverse else ("applied", "to")
    return True, f"{verb} {len(series())} patches {preposition} the {target.label}"


def _write_all(target: Target, contents: dict[str, bytes | None]) -> None:
    """Every file written, or none: stage each result beside its target, then replace them all,
    putting back what was replaced if a replace fails."""
    staged: list[tuple[Path, Path | None]] = []  # (target file, staged copy; None: delete it)
    try:
        for rel, data in contents.items():
            dest = target.root / rel
            if data is None:
                staged.append((dest, None))
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.graphfix-staged")
            tmp.write_bytes(data)
            if dest.exists():
                shutil.copymode(dest, tmp)
            staged.append((dest, tmp))
    except OSError as exc:
        _discard(staged)
        raise PatchError(f"cannot write {rel}: {exc.strerror}; nothing was changed") from None
    before = {dest: dest.read_bytes() if dest.exists() else None for dest, _ in staged}
    done: list[Path] = []
    try:
        for dest, tmp in staged:
            if tmp is None:
                dest.unlink()
                _prune(dest.parent, target.root)
            else:
                os.replace(tmp, dest)
            done.append(dest)
    except OSError as exc:
        failed = dest.relative_to(target.root)
        _discard(staged)
        for path in done:
            _restore(path, before[path])
        raise PatchError(f"cannot replace {failed}: {exc.strerror}; the {len(done)} file(s) already replaced were "
                         "put back, nothing was changed") from None


def _discard(staged: list[tuple[Path, Path | None]]) -> None:
    for _, tmp in staged:
        if tmp is not None and tmp.exists():
            tmp.unlink()


def _restore(path: Path, data: bytes | None) -> None:
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


def patched_copy(dest: Path) -> Path:
    """A copy of the installed FreeToken with the series applied, under ``dest`` (``dest/freetoken``):
    put ``dest`` first on ``PYTHONPATH`` to run the patched release beside the installed one."""
    site = site_target()
    copy = Target(dest, 2, f"patched copy of FreeToken at {dest}", package_only=True)
    if not (dest / "freetoken").is_dir():
        shutil.copytree(site.root / "freetoken", dest / "freetoken", ignore=shutil.ignore_patterns("__pycache__"))
    if state(copy) == "not applied":
        apply(copy)
    return dest


def describe_installed() -> str:
    """One line for doctor: which series, and its state on the installed FreeToken."""
    try:
        target = site_target()
        where = f"{len(series())} patches for FreeToken {series_target()} in {patch_dir()}"
        return f"{state(target)} ({where})"
    except PatchError as exc:
        return str(exc)
