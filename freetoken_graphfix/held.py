"""Folders held open by descriptor, and files read only once opened and checked: no check-then-use by name.

A path is checked once, when :meth:`Folder.open` opens it (``O_DIRECTORY|O_NOFOLLOW``, then ``fstat`` of
the descriptor: a directory, its owner, its mode). Every file in it is then created, read, renamed and
removed relative to that descriptor (``dir_fd=``, ``O_NOFOLLOW``, ``O_EXCL`` for new names), so renaming,
replacing or re-linking the folder's path after the check changes nothing the package writes or reads.
:func:`read_file` opens a file first and ``fstat``s what it opened: a regular file of at most the cap,
read with a bound, never a FIFO that would hang or a device that would never end.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from typing import NamedTuple

from .errors import UnsafePathError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
PRIVATE = "accepted values: a directory this user owns that no one else can write (made 0700 when missing)"
SHARED = "accepted values: a directory this user owns, or a shared one with its sticky bit set (as /tmp)"


class Policy(NamedTuple):
    """Who may own the folder and who else may write into it."""

    accepted: str  # the accepted values, as a refusal names them
    private: bool  # owned by this user and writable by no one else; else a folder others can write needs the sticky bit


PRIVATE_FOLDER = Policy(PRIVATE, private=True)
OUTPUT_FOLDER = Policy(SHARED, private=False)


class Folder:
    """One folder, held by its descriptor from the check on: close it (or use ``with``) when done."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path  # for messages only: nothing is ever opened by it again

    @classmethod
    def open(cls, path: str, what: str, policy: Policy = PRIVATE_FOLDER, make: bool = False) -> Folder:
        """``path`` opened and checked under ``policy``; with ``make``, created ``0700`` (parents too) where missing.
        :class:`UnsafePathError` in one line naming ``what`` and the accepted values otherwise."""
        if not path:
            raise UnsafePathError(f"{what} {path!r}: an empty path; {policy.accepted}")
        if make:
            try:
                os.makedirs(path, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise UnsafePathError(f"{what} {path!r}: cannot be made ({exc.strerror or exc}); "
                                      f"{policy.accepted}") from None
        try:
            fd = os.open(path, _DIR_FLAGS)
        except OSError as exc:
            raise UnsafePathError(f"{what} {path!r}: {_why(exc, path)}; {policy.accepted}") from None
        try:
            _check(os.fstat(fd), path, what, policy)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, path)

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Let the folder go; safe to call again."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def subfolder(self, name: str, what: str, make: bool = True) -> Folder:
        """The folder ``name`` inside this one (made ``0700`` where missing), held the same way; never through a
        link. Its checks are this folder's: owned by this user, writable by no one else."""
        _plain(name, what)
        if make:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=self.fd)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            raise UnsafePathError(f"{what} {self.join(name)!r}: {_why(exc, name, self.fd)}; {PRIVATE}") from None
        try:
            _check(os.fstat(fd), self.join(name), what, PRIVATE_FOLDER)
        except BaseException:
            os.close(fd)
            raise
        return Folder(fd, self.join(name))

    def join(self, name: str) -> str:
        """The path a message names a file in this folder by."""
        return os.path.join(self.path, name)

    def create(self, name: str, mode: int = 0o600) -> int:
        """A new file ``name``, opened for writing: refused where any entry of that name exists (``O_EXCL``), so
        nothing planted there is ever written through."""
        _plain(name, "a file name")
        return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                       dir_fd=self.fd)

    def write(self, name: str, data: bytes, mode: int = 0o600) -> None:
        """``data`` as the file ``name``, whole or not at all: written under a fresh random name, then renamed over
        ``name`` (a link there is replaced, never followed). ``mode``: the file's permissions."""
        _plain(name, "a file name")
        staged = f".{name}.{secrets.token_hex(8)}.tmp"
        fd = self.create(staged, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fh.fileno(), mode)
                fh.write(data)
            os.replace(staged, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(staged, dir_fd=self.fd)
            raise

    def read(self, name: str, cap: int, what: str) -> bytes:
        """The file ``name`` in this folder, read as :func:`read_file` reads a path, never through a link."""
        _plain(name, what)
        return _read_opened(lambda: os.open(name, _READ_FLAGS | os.O_NOFOLLOW, dir_fd=self.fd), self.join(name),
                            cap, what)

    def names(self) -> list[str]:
        """The entries of the folder, sorted."""
        return sorted(os.listdir(self.fd))

    def remove(self, name: str) -> None:
        """Remove the entry ``name`` (a file, or a link: never what it points to); gone already is fine."""
        _plain(name, "a file name")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)


_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: opening a FIFO never waits for a writer


def read_file(path: str, cap: int, what: str) -> bytes:
    """The bytes of ``path``: opened first, then checked by ``fstat`` on what was opened (a regular file of at
    most ``cap`` bytes) and read with that bound, since a size can lie (``/proc``). :class:`UnsafePathError` in
    one line naming ``what`` otherwise: a FIFO, a device, a folder, a file too large."""
    return _read_opened(lambda: os.open(path, _READ_FLAGS), path, cap, what)


def _read_opened(opener: Callable[[], int], path: str, cap: int, what: str) -> bytes:
    """Open with ``opener``, then check and read what was opened (``path`` names it in messages)."""
    try:
        fd = opener()
    except OSError as exc:
        raise UnsafePathError(f"{what} {path!r}: cannot be read ({_why(exc, path)})") from None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise UnsafePathError(f"{what} {path!r}: {_kind(found.st_mode)}, not a regular file")
        if found.st_size > cap:
            raise UnsafePathError(f"{what} {path!r}: {found.st_size:,} bytes, over the {cap:,}-byte limit")
        os.set_blocking(fd, True)
        chunks, left = [], cap + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > cap:
        raise UnsafePathError(f"{what} {path!r}: over the {cap:,}-byte limit")
    return data


def _check(found: os.stat_result, path: str, what: str, policy: Policy) -> None:
    """Refuse what ``fstat`` found where ``policy`` does not accept it."""
    if not stat.S_ISDIR(found.st_mode):
        raise UnsafePathError(f"{what} {path!r}: not a directory; {policy.accepted}")
    others_write = found.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if policy.private:
        if found.st_uid != os.geteuid():
            raise UnsafePathError(f"{what} {path!r}: owned by uid {found.st_uid}, not this user; {policy.accepted}")
        if others_write:
            raise UnsafePathError(f"{what} {path!r}: writable by others (mode {stat.S_IMODE(found.st_mode):o}); "
                                  f"{policy.accepted}")
    elif others_write and not found.st_mode & stat.S_ISVTX and found.st_uid != os.geteuid():
        raise UnsafePathError(f"{what} {path!r}: another user's folder that others can write, without the sticky "
                              f"bit (mode {stat.S_IMODE(found.st_mode):o}); {policy.accepted}")


def _why(exc: OSError, name: str, dir_fd: int | None = None) -> str:
    """Why an open failed, in words: ``O_NOFOLLOW`` on a link says ``ELOOP``, or ``ENOTDIR`` with ``O_DIRECTORY``."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode):
                return "a symbolic link"
        return "not a directory" if exc.errno == errno.ENOTDIR else "a symbolic link"
    return exc.strerror or str(exc)


def _plain(name: str, what: str) -> None:
    """A name inside a held folder: one component, never ``..`` or a path."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UnsafePathError(f"{what} {name!r}: not a plain file name")


def _kind(mode: int) -> str:
    """What a non-regular file is, in a word or two."""
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file")


@contextlib.contextmanager
def held(path: str, what: str, policy: Policy = PRIVATE_FOLDER, make: bool = False) -> Iterator[Folder]:
    """:meth:`Folder.open` as a ``with`` block."""
    folder = Folder.open(path, what, policy, make)
    try:
        yield folder
    finally:
        folder.close()
