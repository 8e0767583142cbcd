"""How the package writes a file: never through a name another local user could have planted.

A file is created under a random name (``mkstemp``: ``O_CREAT|O_EXCL``, which refuses to follow a
link) in the folder it belongs in, then moved into place with ``os.replace``, which replaces a link
at the final name instead of writing through it. A folder the package keeps files in (the status
folder, ``--logs``) must be this user's and writable by no one else; made ``0700`` when missing.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator

from .errors import UnsafePathError

PRIVATE = "accepted values: a directory this user owns that no one else can write (made 0700 when missing)"


def private_dir(path: str, what: str) -> str:
    """``path``, a directory only this user can write to: made ``0700`` when missing, else checked (a real
    directory, not a link; owned by this user; not group- or world-writable). :class:`UnsafePathError`
    in one line naming ``what`` otherwise."""
    try:
        os.makedirs(path, mode=0o700)
        return path
    except FileExistsError:
        pass
    except OSError as exc:
        raise UnsafePathError(f"{what} {path!r}: cannot be made ({exc.strerror}); {PRIVATE}") from None
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(found.st_mode) else "not a directory"
        raise UnsafePathError(f"{what} {path!r}: {kind}; {PRIVATE}")
    if found.st_uid != os.geteuid():
        raise UnsafePathError(f"{what} {path!r}: owned by uid {found.st_uid}, not this user; {PRIVATE}")
    if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePathError(f"{what} {path!r}: writable by others (mode {stat.S_IMODE(found.st_mode):o}); "
                              f"{PRIVATE}")
    return path


def output_refused(path: str, what: str) -> str | None:
    """Why ``path`` cannot take an output, in one line, or ``None``: it must be a new path or a regular file
    (never a link, dangling or not, a FIFO, a device or a directory), in an existing writable folder."""
    accepted = "accepted values: a new path or a regular file, in an existing writable directory"
    folder = os.path.dirname(os.path.abspath(path)) if path else ""
    if not path or not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        return f"{what} {path!r}: cannot be written; {accepted}"
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(found.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(found.st_mode) else "a directory" if stat.S_ISDIR(
            found.st_mode) else "not a regular file"
        return f"{what} {path!r}: {kind}; {accepted}"
    if not os.access(path, os.W_OK):  # replacing it would succeed: a file its owner made read-only stays so
        return f"{what} {path!r}: cannot be written (Permission denied); {accepted}"
    return None


@contextlib.contextmanager
def staged(path: str, mode: int | None = None) -> Iterator[str]:
    """A fresh file of a random name beside ``path`` for the caller to fill; moved onto ``path`` when the
    block ends, removed if it raises. ``mode``: the final permissions (default: what ``open`` would give)."""
    folder = os.path.dirname(os.path.abspath(path))
    _, suffix = os.path.splitext(path)  # a writer that picks a format by the name (a PNG) still can
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=f".tmp{suffix}")
    try:
        os.fchmod(fd, default_mode() if mode is None else mode)
        os.close(fd)
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_text(path: str, text: str, mode: int | None = None) -> None:
    """``text`` as UTF-8 at ``path``, through :func:`staged`."""
    with staged(path, mode) as temporary, open(temporary, "w", encoding="utf-8") as fh:
        fh.write(text)


def default_mode() -> int:
    """``0o666`` less this process's umask: the permissions ``open(path, "w")`` would have given."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask
