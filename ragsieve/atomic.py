"""Write folders and files atomically, and clean up after builds that were killed.

Every artefact ragsieve writes (an index, a cached model, a trained reranker, an
adapter) is built in a hidden temporary sibling and renamed into place only when
complete, so a reader never sees half of one. The temporary name carries the builder's
pid and host (``.NAME.<pid>@<host>.<token>.building``): the next build of the same
target removes siblings whose process is gone, so a ``kill -9`` does not leave
gigabytes behind forever. Modes follow the user's umask (``tempfile.mkdtemp`` would
make the folder 0700 and ``mkstemp`` files 0600, unreadable to the rest of a shared
deployment).

A resumable build (``fit``, ``prefs build``) works in :func:`resumable_directory` instead:
its hidden sibling ``.NAME.partial`` has a fixed name and survives a kill, so running the
same command again continues it; it too is renamed into place only when finished.

The rule every command that writes a folder follows: an existing (finished) output is
refused unless the user asked to ``--overwrite`` it, and the new one appears in one rename.

Example::

    with atomic_directory("indexes/nq", overwrite=True) as tmp:
        write_everything_into(tmp)
    # indexes/nq now holds exactly what was written, or the old content if this failed

    with resumable_directory("sieves/mine") as work:    # .mine.partial, kept if this is killed
        fit_into(work)                                  # skips what an earlier run finished
"""

from __future__ import annotations

import fcntl
import glob
import os
import re
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ragsieve.errors import RagsieveError

__all__ = ["atomic_directory", "atomic_file", "current_umask", "partial_path", "remove_stale_siblings",
           "resumable_directory", "write_json_atomic"]

#: leftovers of the temp-dir code this module replaced (no pid in the name): removed once
#: they are this old, since no build runs that long
LEGACY_MAX_AGE_S = 24 * 3600


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (``/proc``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc: the classic set-and-restore (racy only against other threads)
    os.umask(mask)
    return mask


def _host() -> str:
    # dots would make the name ambiguous to parse; keep it short and filesystem-safe
    return re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:32] or "host"


def _temp_name(target: Path, suffix: str) -> Path:
    token = secrets.token_hex(4)
    return target.with_name(f".{target.name}.{os.getpid()}@{_host()}.{token}.{suffix}")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _is_stale(entry: Path, target: Path) -> bool:
    """Whether ``entry`` is a temporary sibling of ``target`` left by a build that is gone."""
    prefix = f".{target.name}."
    rest = entry.name[len(prefix) :]
    ours = re.fullmatch(r"(\d+)@([A-Za-z0-9_-]+)\.[0-9a-f]{8}\.(building|old|tmp)", rest)
    if ours:
        pid, host = int(ours.group(1)), ours.group(2)
        # another host's pid means nothing here: leave its builds alone
        return host == _host() and not _pid_alive(pid)
    # mkdtemp/uuid names written by older ragsieve versions: no owner to ask, so go by age
    legacy = re.fullmatch(r"[a-z0-9_]{8}(\.building|\.tmp)?|old-[0-9a-f]{8}|tmp", rest)
    if legacy:
        try:
            return time.time() - entry.lstat().st_mtime > LEGACY_MAX_AGE_S
        except OSError:
            return False
    return False


def remove_stale_siblings(target: str | os.PathLike[str]) -> list[Path]:
    """Delete temporary siblings of ``target`` whose builder process is gone; returns them."""
    target = Path(target)
    removed = []
    try:
        entries = list(target.parent.glob(f".{glob.escape(target.name)}.*"))  # names may hold [ or *
    except OSError:
        return removed
    for entry in entries:
        if _is_stale(entry, target):
            _remove(entry)
            removed.append(entry)
    return removed


def _remove(path: Path) -> None:
    """Best effort: a leftover we may not delete (another user's) must not stop this build."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


@contextmanager
def _writable(target: Path) -> Iterator[None]:
    """A folder we may not create (permissions, a file in the way, a read-only disk) is one line."""
    try:
        yield
    except OSError as exc:
        raise RagsieveError(f"{target}: cannot write here ({exc.strerror or exc})") from None


@contextmanager
def atomic_directory(
    target: str | os.PathLike[str], *, overwrite: bool = False, exists_hint: str = "pick another folder"
) -> Iterator[Path]:
    """Yield an empty temporary folder; on success it replaces ``target`` in one rename.

    An existing ``target`` is refused unless ``overwrite`` (``exists_hint`` says how to
    overwrite from where the user stands, e.g. "pass --overwrite"). On any error,
    KeyboardInterrupt included, the temporary folder is removed and ``target`` is left
    as it was. Stale temporary siblings of killed builds are removed first.
    """
    target = Path(target)
    if target.exists() and not overwrite:
        raise RagsieveError(f"{target} already exists; {exists_hint}")
    tmp = _temp_name(target, "building")
    with _writable(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_siblings(target)
        tmp.mkdir(mode=0o777)  # the kernel applies the umask, unlike tempfile.mkdtemp's 0700
    try:
        yield tmp
        _move_into_place(tmp, target, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def partial_path(target: str | os.PathLike[str]) -> Path:
    """The work folder of a resumable build of ``target``: ``.NAME.partial`` beside it."""
    target = Path(target)
    return target.with_name(f".{target.name}.partial")


@contextmanager
def resumable_directory(
    target: str | os.PathLike[str], *, overwrite: bool = False, exists_hint: str = "pass --overwrite"
) -> Iterator[Path]:
    """Yield the work folder of a resumable build; on success it replaces ``target`` in one rename.

    The work folder (:func:`partial_path`) is created if missing and kept when the build
    fails or is killed, so the same build run again continues from what it holds. A
    finished ``target`` is refused unless ``overwrite``. One build per target at a time: a
    second one is refused while the first holds the lock (``.NAME.partial.lock``).
    """
    target = Path(target)
    if target.exists() and not overwrite:
        raise RagsieveError(f"{target} already exists; {exists_hint}")
    work = partial_path(target)
    lock_path = work.with_name(work.name + ".lock")
    with _writable(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_siblings(target)
        lock = open(lock_path, "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise RagsieveError(f"{target} is being built by another process (lock {lock_path})") from None
    try:
        with _writable(target):
            work.mkdir(mode=0o777, exist_ok=True)
        yield work
        _move_into_place(work, target, overwrite)
    finally:
        _remove(lock_path)  # while still holding it: a waiting build then locks a fresh file
        lock.close()


def _move_into_place(tmp: Path, target: Path, overwrite: bool) -> None:
    """Rename ``tmp`` to ``target``; an existing ``target`` is moved aside first, then deleted."""
    if not target.exists() and not target.is_symlink():
        os.rename(tmp, target)
        return
    if not overwrite:  # appeared while we were building
        raise RagsieveError(f"{target} was created by someone else during this build; nothing was replaced")
    old = _temp_name(target, "old")
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)  # put the previous version back
        raise
    _remove(old)


@contextmanager
def atomic_file(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success it replaces ``target``.

    The caller writes the temporary path (any library that takes a file name works). The
    file gets the mode a plain ``open()`` would give it under the current umask.
    """
    target = Path(target)
    with _writable(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_siblings(target)
    tmp = _temp_name(target, "tmp")
    try:
        yield tmp
        if tmp.is_file():
            os.chmod(tmp, stat.S_IMODE(0o666 & ~current_umask()))
        os.replace(tmp, target)
    except BaseException:
        _remove(tmp)
        raise


def write_json_atomic(path: str | os.PathLike[str], data: Any, indent: int = 1) -> None:
    """``data`` as JSON in ``path``, atomically: a reader (or a rerun after a kill) never sees half a file."""
    import json

    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(data, indent=indent) + "\n")
