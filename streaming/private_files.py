"""Local files written whole and secrets read only from files of their own:
the one way ``streaming/`` writes a file that a reader must never see half
written, and a file that only its owner may read.

- ``write_atomically``: the data goes to a temporary file beside ``path``,
  is synced, and the file is renamed over ``path`` (``os.replace``): a
  reader sees the old file or the new one, whole.
- ``write_private``: the same, created readable and writable by its owner
  alone (0600; a file already there is replaced, never widened), its
  directory created 0700 if missing.
- ``read_private``: a file that must be a regular file owned by this
  process's user that no one else may read or write; otherwise a
  ``ConfigError`` that names the file, what is wrong and how to fix it.
- ``replace_into``: a file built beside its place (a jar, a binary) synced
  and renamed into it.

Local files only: the object store's files are written through its
filesystem (``streaming.adapters.objects``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TypeAlias

from streaming.errors import ConfigError

__all__ = ["read_private", "replace_into", "write_atomically", "write_private"]

# a path as callers hold it: a Path or a str
_StrPath: TypeAlias = str | os.PathLike[str]


def write_atomically(path: _StrPath, data: bytes | str, *, mode: int | None = None) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` whole: to a temporary file
    in the same directory, synced, then renamed over ``path``.  ``mode``: the
    file's mode, set before the rename (else a new file's default, as
    ``open`` makes it).  Raises ``OSError``; the temporary file is removed."""
    path = Path(path)
    data = data.encode() if isinstance(data, str) else data
    temporary = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
    # with a mode asked for, no one else can open the file before it has that mode
    descriptor = os.open(
        temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666 if mode is None else 0o600
    )
    try:
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
            out.flush()
            if mode is not None:
                os.fchmod(out.fileno(), mode)
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _sync_directory(path.parent)


def write_private(path: _StrPath, data: bytes | str) -> None:
    """Write ``path`` readable by its owner alone, atomically: created 0600
    (a file already there is replaced, never widened), its directory created
    0700 if missing."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a directory already there is left as it is
    write_atomically(path, data, mode=0o600)


def read_private(path: _StrPath, what: str) -> str:
    """The text of ``path``, a regular file owned by this process's user that
    no one else may read or write; otherwise a ``ConfigError`` that begins
    with ``what`` (``"the job secret file"``) and the path and says how to
    fix it.  The checks are of the file that is read (``fstat`` of the open file)."""
    path = Path(path)
    try:
        # O_NONBLOCK: a FIFO named here is refused below, not waited on
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    try:
        _check_private(os.fstat(descriptor), path, what)
    except BaseException:
        os.close(descriptor)
        raise
    with os.fdopen(descriptor, "rb") as file:
        try:
            return file.read().decode()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{what} {path} cannot be read: {exc}") from None


def _check_private(info: os.stat_result, path: Path, what: str) -> None:
    """A ``ConfigError`` unless ``info`` is of a regular file of this user's
    that no one else may read or write."""
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{what} {path} is not a regular file")
    user = os.geteuid()
    if info.st_uid != user:
        raise ConfigError(
            f"{what} {path} belongs to uid {info.st_uid}, not to this user (uid {user}): "
            f"make it this user's (`chown {user} {path}`, as root, or write it anew as this user), "
            f"then `chmod 600 {path}`"
        )
    if info.st_mode & 0o077:
        raise ConfigError(
            f"{what} {path} can be read by others (mode {stat.S_IMODE(info.st_mode):o}): "
            f"`chmod 600 {path}`, and choose a new secret if others could read it"
        )


def replace_into(built: _StrPath, target: _StrPath) -> None:
    """Move the finished file ``built`` to ``target`` (the same file system:
    build beside it), its data synced first, so that ``target`` is never a
    file half written, even after a crash.  Raises ``OSError``."""
    with open(built, "rb") as file:
        os.fsync(file.fileno())
    os.replace(built, target)
    _sync_directory(Path(target).parent)


def _sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable; where a directory cannot be
    synced (some file systems), the rename stands as it is."""
    try:
        descriptor = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
