"""One writer at a time per store and per saved state, and no store replaced while it is read.

Both locks are ``fcntl.flock`` locks: the kernel drops them when their holder ends, however it ends
(exit, Ctrl-C, a crash, kill -9), so a lock is never held by a process that is gone, and taking a
lock someone left behind is the same atomic call as taking a free one.  (O_CREAT|O_EXCL lock files
need a pid check to find stale ones, and two processes that both find one stale race to replace
it.)  flock is exact on local file systems; Linux's NFS client passes it to the server as a POSIX
lock, so it holds across the machines of a cluster too.  (POSIX systems: Linux, macOS.)

* **The writer lock** of a store or a state at PATH is the file ``PATH.lock`` beside it (beside,
  not inside: it stays in place while ``--overwrite`` replaces the directory).  Every command that
  writes a store or a state holds it exclusively from its first read to its last write: ``append``,
  ``variants --add``, ``convert`` and ``synth`` (``creating``: readers keep away until the store is
  whole), ``eval --state``, ``update``, ``suite --state``, ``suite-update``.  The file holds the
  holder's pid, host, command and start time, for the message that names it, and is removed when
  the lock is released.  A second writer waits up to ``WAIT`` seconds (``$STREAMEVAL_LOCK_WAIT``),
  then is refused (:class:`LockError`, exit 3) in one line naming the holder.  A lock file whose flock nobody holds
  was left by a process that ended: taken over, with a note on stderr when it names that process.
  One naming a process still running on this host, or one on another host (a file system may not
  pass flock between machines), counts as held: the message says to remove it if that is wrong.
* **The reader lock**: a store opened for reading (``store.open_store``) holds a shared flock on
  its directory while the opened Store lives.  Replacing a store (``--overwrite``) takes it
  exclusively first, so a store is never deleted or rewritten under a reader (refused instead),
  and a reader never opens a store that is being created or replaced (it waits, then is refused):
  a reader sees one store, whole, never a mix of two.  Appends do not need it: they write rows
  past the committed count and commit last, which readers already ignore.

Imports nothing heavy (the CLI's ``--help`` stays instant).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
import weakref

from .errors import OptionError, StoreError

WAIT = 5.0  # seconds a second writer (or a reader of a store being created) waits before it is refused
WAIT_VARIABLE = "STREAMEVAL_LOCK_WAIT"  # overrides WAIT: a script that would rather wait longer, or not at all
POLL = 0.05
SUFFIX = ".lock"
UNWRITABLE = (errno.EROFS, errno.ENOSPC, errno.EDQUOT)  # no writer can write there: no lock is needed


class LockError(StoreError):
    """A store or state is being written (or read, for a replacement) by another process."""


def wait_seconds() -> float:
    """How long to wait for a lock: ``$STREAMEVAL_LOCK_WAIT`` seconds, else ``WAIT``."""
    text = os.environ.get(WAIT_VARIABLE)
    if text is None:
        return WAIT
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < 1e6:  # NaN fails too
        raise OptionError(f"{WAIT_VARIABLE}={text!r:.40}: expected the seconds to wait for a lock, from 0 to 999999")
    return seconds


def lock_path(path) -> str:
    """Where the writer lock of the store or state at ``path`` lives: beside it, by its real path
    (two names of one store share one lock)."""
    return os.path.realpath(os.fspath(path)) + SUFFIX


# --------------------------------------------------------------------------------------- the writer lock

_held: dict[str, tuple[int, int]] = {}  # lock file -> (fd, thread) of this process's hold (re-entered by that thread)
_registry = threading.Lock()


@contextlib.contextmanager
def writing(path, creating: bool = False):
    """Hold the writer lock of the store or state at ``path`` (a local path) for the block.

    ``creating``: the block creates or replaces the store at ``path``; readers stay away until it
    ends.  Re-entrant within a thread (append_gallery calls append_batches, convert writes paths).
    Nothing to lock for None (no state), a URL or a zarr store object: the lock is for local stores
    and states."""
    if not isinstance(path, (str, os.PathLike)) or "://" in os.fspath(path):
        yield
        return
    where = lock_path(path)
    with _registry:
        own = _held.get(where)
    if own is not None and own[1] == threading.get_ident():
        yield  # re-entered: the outer block releases it
        return
    fd = _acquire(where, os.fspath(path), creating)
    if fd is None:
        yield
        return
    with _registry:
        _held[where] = (fd, threading.get_ident())
    try:
        yield
    finally:
        with _registry:
            del _held[where]
        with contextlib.suppress(OSError):
            os.unlink(where)  # while still holding it: a waiter then finds the file gone and opens the next one
        os.close(fd)


def _acquire(where: str, path: str, creating: bool) -> int | None:
    """The descriptor of the lock file ``where``, locked; None where no lock file can be made because
    nothing can be written there (a read-only or full file system: the write fails on its own)."""
    deadline = time.monotonic() + wait_seconds()
    while True:
        fd = _open_lock_file(where, path)
        if fd is None:
            return None
        try:
            if _try_acquire(fd, where, path, creating):
                return fd
        except BaseException:
            os.close(fd)
            raise
        if time.monotonic() >= deadline:
            raise LockError(_busy(path, _peek(where), where))
        time.sleep(POLL)


def _try_acquire(fd: int, where: str, path: str, creating: bool) -> bool:
    """Take the lock through ``fd`` (closed when it is not taken)."""
    if _flock(fd, fcntl.LOCK_EX) and _is_linked(fd, where):
        left = _record(fd)
        if _still_running(left) is None:
            _claim(fd, creating)
            if left:
                print(f"note: took over the lock of '{path}' left by {_describe(left)}, which is no longer running",
                      file=sys.stderr)
            return True
    os.close(fd)
    return False


def _peek(where: str, if_held: bool = False) -> dict | None:
    """The record in the lock file ``where`` (``_record``); None without the file or, ``if_held``,
    when nobody holds its flock."""
    try:
        fd = os.open(where, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return None if if_held and _flock(fd, fcntl.LOCK_SH) else _record(fd)
    finally:
        os.close(fd)


def _open_lock_file(where: str, path: str) -> int | None:
    try:
        return os.open(where, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno in UNWRITABLE:
            return None
        raise LockError(f"cannot lock '{path}' for writing: cannot create its lock file '{where}' "
                        f"({exc.strerror or exc}); streameval writes a store or a state only under its lock") from None


def _flock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


def _dir_flock(fd: int, kind: int) -> bool | None:
    """``_flock`` on a directory; None where the file system locks no directories (NFS passes
    flock on as a POSIX lock, whose exclusive kind needs a file open for writing): there the reader
    lock protects nothing, and is not asked for."""
    try:
        return _flock(fd, kind)
    except OSError as exc:
        if exc.errno in (errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise


def _is_linked(fd: int, where: str) -> bool:
    """Whether the file locked is still the lock file (its holder unlinks it on release: a waiter
    may have locked the unlinked one)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(where))
    except FileNotFoundError:
        return False


def _record(fd: int) -> dict:
    """The holder's record in a lock file ({} when empty or unreadable: being written, or garbled)."""
    try:
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        record = json.loads(text) if text.strip() else {}
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}


def _claim(fd: int, creating: bool) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": _command(),
              "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "creating": creating}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except OSError:  # a full disk: the flock is the lock, the record only names its holder
        pass


def _command() -> str:
    """This process's command line as typed, shortened: 'streameval append s.zarr a.npz' for the
    console script, 'python -m streameval.cli ...' or 'python script.py ...' otherwise."""
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable or "python", *sys.argv])
    if len(argv) > 1 and not argv[1].startswith("-"):  # a script: the interpreter says nothing
        argv = argv[1:]
    text = " ".join([os.path.basename(argv[0]), *argv[1:]])
    text = " ".join(text.split())  # python -c code spans lines
    return text if len(text) <= 200 else text[:197] + "..."


def _still_running(record: dict) -> dict | None:
    """The record of a lock file nobody flocks, if its process may still be writing: running on this
    host (a file system whose flock does nothing) or on another host (whose flock may not reach us)."""
    pid, host = record.get("pid"), record.get("host")
    if not isinstance(pid, int) or pid == os.getpid():
        return None
    if host != socket.gethostname():
        return record
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # another user's process: running
        pass
    return record


def _describe(record: dict) -> str:
    command = f", '{record['command']}'" if record.get("command") else ""
    since = f", since {record['since']}" if record.get("since") else ""
    return f"pid {record.get('pid', '?')} on host {record.get('host', '?')}{command}{since}"


def _busy(path: str, holder: dict | None, where: str) -> str:
    if not holder:
        return f"'{path}' is being written by another process (its lock file '{where}' is held); try again when it ends"
    return (f"'{path}' is being written by {_describe(holder)}; try again when it ends (if that process is gone, "
            f"remove '{where}')")


def _creator(path: str) -> dict | None:
    """The record of another process's writer lock on ``path`` that is creating or replacing it."""
    where = lock_path(path)
    with _registry:
        if where in _held:  # this process creates it: its own reads are part of that
            return None
    record = _peek(where, if_held=True)
    return record if record is not None and record.get("creating", True) else None  # one being written: assume so


# --------------------------------------------------------------------------------------- the reader lock

_readers: dict[tuple, "weakref.WeakSet[Reading]"] = {}  # (device, inode) -> this process's reader locks


class Reading:
    """A shared flock on a store's directory, held while this object lives (an opened Store keeps
    it).  A copy in another process (Dask workers) holds nothing: its parent's lock covers it."""

    def __init__(self, fd: int, key: tuple):
        self.fd, self.key = fd, key

    def release(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self):
        self.release()

    def __reduce__(self):
        return (type(None), ())  # unpickled as None


def reading(path) -> Reading | None:
    """A reader lock on the store directory at ``path``; None when it cannot be opened (open_store
    reports that) or its file system locks no directories.  Waits up to ``WAIT`` seconds while the
    store is being created or replaced, then LockError naming who does it."""
    path = os.fspath(path)
    deadline = time.monotonic() + wait_seconds()
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        taken = _dir_flock(fd, fcntl.LOCK_SH)
        if taken is None:
            os.close(fd)
            return None
        creator = _creator(path)
        if taken and _is_linked(fd, path) and creator is None:
            stat = os.fstat(fd)
            lock = Reading(fd, (stat.st_dev, stat.st_ino))
            with _registry:
                _readers.setdefault(lock.key, weakref.WeakSet()).add(lock)
            return lock
        os.close(fd)
        if time.monotonic() >= deadline:
            doing = f"by {_describe(creator)}" if creator else "by another process"
            raise LockError(f"'{path}' is being created or replaced {doing}; read it when that has finished")
        time.sleep(POLL)


@contextlib.contextmanager
def replacing(path):
    """An exclusive hold on the existing store directory at ``path`` while it is deleted (inside
    ``writing(path, creating=True)``): LockError when another process reads it.  This process's own
    reader locks on it are released first: it replaces the store knowingly.  (Where the file system
    locks no directories, nothing is held.)"""
    path = os.fspath(path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        stat = os.fstat(fd)
        with _registry:
            own = list(_readers.pop((stat.st_dev, stat.st_ino), ()))
        for lock in own:
            lock.release()
        deadline = time.monotonic() + wait_seconds()
        while _dir_flock(fd, fcntl.LOCK_EX) is False:
            if time.monotonic() >= deadline:
                raise LockError(f"'{path}' is being read by another process (an evaluation?); it is replaced only "
                                "when nobody reads it: try again when that has finished")
            time.sleep(POLL)
        yield
    finally:
        os.close(fd)
