"""``patch check|apply|revert``: the upstream-ready series in ``patches/`` on a FreeToken checkout or install.

The series is written against FreeToken's repository layout (``python/freetoken/...``); an installed
package is the same tree one level down (``freetoken/...``). Every operation first runs the whole
series on scratch copies of the files it touches (``git apply``), and only then writes the results
back: all or nothing. A tree is "applied" when the series reverses cleanly on it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import PatchError

SITE_NOTE = ("pip's RECORD hashes for the patched files are now stale (pip check and hash-verifying "
             "tools will report them), and reinstalling or upgrading FreeToken drops the patch")


@dataclass(frozen=True)
class Target:
    root: Path  # the directory the patched paths resolve in
    strip: int  # git apply -p: 1 for a checkout (python/freetoken/...), 2 for an install (freetoken/...)
    label: str


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


def repo_target(path: str | os.PathLike) -> Target:
    root = Path(path).resolve()
    if not (root / "python" / "freetoken").is_dir():
        raise PatchError(f"--repo {str(path)!r}: no python/freetoken/ in it; expected a FreeToken checkout")
    return Target(root, 1, f"checkout {root}")


def site_target() -> Target:
    spec = importlib.util.find_spec("freetoken")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("--site: FreeToken is not installed in this environment (no 'freetoken' package)")
    package = Path(next(iter(spec.submodule_search_locations))).resolve()
    return Target(package.parent, 2, f"installed FreeToken at {package}")


def _touched(patches: list[Path], strip: int) -> list[str]:
    paths = []
    for patch in patches:
        for line in patch.read_text().splitlines():
            if line.startswith("+++ ") and not line.endswith("/dev/null"):
                paths.append("/".join(line[4:].split("/")[strip:]))
    return list(dict.fromkeys(paths))


def _git_apply(workdir: Path, patch: Path, strip: int, reverse: bool) -> str | None:
    """Apply one patch in ``workdir``; the error text when it does not fit."""
    if shutil.which("git") is None:
        raise PatchError("git is needed to apply the series (git apply); install git")
    cmd = ["git", "apply", f"-p{strip}", *(["-R"] if reverse else []), str(patch)]
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(workdir.parent)}  # never a repo above the scratch dir
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    errors = [line.removeprefix("error: ") for line in proc.stderr.splitlines() if line.startswith("error:")]
    return "; ".join(errors) or proc.stderr.strip()


def _run(target: Target, reverse: bool) -> tuple[dict[str, bytes] | None, str]:
    """The series (or its reverse) on scratch copies: new contents per file, or why it does not fit."""
    patches = series()
    files = _touched(patches, target.strip)
    with tempfile.TemporaryDirectory(prefix="graphfix-patch-") as tmp:
        scratch = Path(tmp) / "tree"
        for rel in files:
            src = target.root / rel
            if not src.is_file():
                return None, f"{rel}: missing from the {target.label}"
            (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, scratch / rel)
        for patch in (reversed(patches) if reverse else patches):
            error = _git_apply(scratch, patch, target.strip, reverse)
            if error:
                return None, f"{patch.name}: {error}"
        return {rel: (scratch / rel).read_bytes() for rel in files}, ""


def state(target: Target) -> str:
    """``"applied"`` or ``"not applied"``; :class:`PatchError` naming the file and hunk otherwise."""
    forward, why = _run(target, reverse=False)
    if forward is not None:
        return "not applied"
    if _run(target, reverse=True)[0] is not None:
        return "applied"
    raise PatchError(f"the {target.label} matches neither the original nor the patched sources: {why}; "
                     "nothing was changed")


def _write(target: Target, contents: dict[str, bytes]) -> None:
    for rel, data in contents.items():
        (target.root / rel).write_bytes(data)


def apply(target: Target) -> str:
    return _move(target, reverse=False)


def revert(target: Target) -> str:
    return _move(target, reverse=True)


def _move(target: Target, reverse: bool) -> str:
    if state(target) == ("not applied" if reverse else "applied"):
        return (f"the series is not applied to the {target.label}; nothing to revert" if reverse
                else f"the series is already applied to the {target.label}; nothing to do")
    contents, _ = _run(target, reverse)
    _write(target, contents)
    verb, preposition = ("reverted", "from") if reverse else ("applied", "to")
    return f"{verb} {len(series())} patches {preposition} the {target.label}"


def describe_installed() -> str:
    """One line for doctor: the series' state on the installed FreeToken."""
    try:
        return f"{state(site_target())} ({len(series())} patches in {patch_dir()})"
    except PatchError as exc:
        return str(exc)
