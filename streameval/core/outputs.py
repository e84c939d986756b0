"""Where results go: output paths checked before any work starts, and files written so that nothing
is lost.

One policy for every output (``--json``, ``--state``, plot files, new stores):

* the folder it goes into must exist and be writable — streameval never creates folders on its own,
  so a typo in a path is reported at once instead of making a tree somewhere;
* an existing file is replaced only with ``--overwrite`` (or a yes at the terminal prompt), and a
  directory never stands where a file is to be written;
* a file is written beside its final name (with the modes the umask gives any new file) and renamed
  into place (``replace_file``, for every output file: JSON, pages, plots, images), so a failure (a
  full disk) leaves the previous file as it was, and a symbolic link in its place is replaced, never
  written through to its target; if the result cannot be written at all, it goes to a fallback file
  whose path the error names (the evaluation is never lost).

Imports nothing heavy: the CLI checks its outputs before loading the engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import shutil
import tempfile
import time
import uuid

from .errors import OptionError, StreamevalError


class OutputError(StreamevalError):
    """A result could not be written where asked (it was saved elsewhere, see the message)."""

    exit_code = 3


def is_url(path) -> bool:
    return "://" in os.fspath(path)


def check_folder(path, what: str) -> None:
    """The folder that will hold ``path`` exists and is writable (URLs are not checked here)."""
    if is_url(path):
        return
    folder = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(folder):
        raise OptionError(f"the folder of the {what} '{os.fspath(path)}' does not exist ({folder}); create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OptionError(f"cannot write the {what} '{os.fspath(path)}': the folder {folder} is not writable")


def check_file(path, overwrite: bool, what: str = "output file") -> None:
    """Before any work: ``path`` can be written as a file ('-' is standard output)."""
    if path is None or os.fspath(path) == "-":
        return
    check_folder(path, what)
    if os.path.isdir(path):
        raise OptionError(f"the {what} '{os.fspath(path)}' is a directory; name a file")
    if os.path.exists(path) and not overwrite and not _confirmed(path):
        raise OptionError(f"'{os.fspath(path)}' exists; pass --overwrite to replace it")


def check_directory(path, overwrite: bool, what: str) -> None:
    """Before any work: a directory output (a store) may be created at ``path``."""
    if path is None or is_url(path):
        return
    check_folder(path, what)
    if os.path.exists(path) and not os.path.isdir(path):
        raise OptionError(f"the {what} '{os.fspath(path)}' is an existing file, not a directory")
    if os.path.exists(path) and not overwrite and not _confirmed(path):
        raise OptionError(f"'{os.fspath(path)}' already exists; pass --overwrite to replace it")


def not_ours(path, attribute: str) -> str | None:
    """What is at ``path`` if ``--overwrite`` must not delete it, in a few words; None when it is a
    zarr group streameval wrote (its zarr.json has the attribute ``attribute``: a store's
    streameval_schema, a ranked-lists group's streameval_ranked), an empty folder, or a link (the
    link is replaced, never its target).  --overwrite replaces only what streameval wrote."""
    path = os.fspath(path)
    if os.path.islink(path):
        return None
    if not os.path.isdir(path):
        return "it is a file"
    names = sorted(os.listdir(path))
    if not names or _zarr_attribute(path, attribute) is not None:
        return None
    return "it holds " + ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _zarr_attribute(path: str, attribute: str):
    """The attribute ``attribute`` of the zarr group at ``path`` (its zarr.json read as JSON, no
    zarr needed), or None."""
    try:
        with open(os.path.join(path, "zarr.json"), encoding="utf-8") as fh:
            attrs = json.load(fh).get("attributes", {})
        return attrs.get(attribute) if isinstance(attrs, dict) else None
    except (OSError, ValueError, AttributeError):
        return None


def refuse_foreign(path, attribute: str, what: str) -> None:
    """OptionError when ``--overwrite`` would delete something at ``path`` streameval did not write."""
    foreign = os.path.lexists(path) and not_ours(path, attribute)
    if foreign:
        raise OptionError(f"'{os.fspath(path)}' is not a streameval {what} ({foreign}); --overwrite replaces only "
                          f"a {what} streameval wrote: choose another path, or move that away yourself")


def _confirmed(path) -> bool:
    """Ask at a terminal; never in scripts (there the answer is no)."""
    if not sys.stdin.isatty():
        return False
    import click

    return click.confirm(f"'{os.fspath(path)}' exists. Overwrite it?", default=False)


def write_text(path, text: str, what: str = "result") -> None:
    """Write ``text`` to ``path`` without ever leaving a partial file in its place.

    On failure the text goes to a fallback file in the temporary folder (else the current or home
    folder, else standard output) and :class:`OutputError` names where.
    """
    path = os.fspath(path)
    try:
        _replace_with(path, text)
        return
    except OSError as exc:
        reason = exc.strerror or str(exc)
    fallback = _fallback(text, what)
    if fallback is None:  # last resort: the terminal or whatever captures standard output
        sys.stdout.write(text)
        sys.stdout.flush()
        raise OutputError(f"cannot write '{path}' ({reason}), nor a fallback file; the {what} was printed on standard output")
    raise OutputError(f"cannot write '{path}' ({reason}); the {what} was saved to '{fallback}' instead")


def _replace_with(path: str, text: str) -> None:
    if os.path.exists(path) and not os.path.isfile(path):  # a device or pipe: write in place
        with open(path, "w") as fh:
            fh.write(text)
        return

    def write(tmp: str) -> None:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())

    replace_file(path, write)


def replace_file(path, write) -> None:
    """The one way an output file is written: ``write(tmp)`` fills a new file beside ``path`` (of
    the same suffix, so that a writer that picks the format by it, as matplotlib does, picks the
    same), which is then renamed onto ``path``.  So a symbolic link at ``path`` is replaced, never
    written through to its target, and a failure leaves what was at ``path`` as it was."""
    path = os.fspath(path)
    tmp = create_beside(path, os.path.splitext(path)[1] or ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def create_beside(path: str, suffix: str, directory: bool = False) -> str:
    """A new, uniquely named file (or directory) in the folder of ``path``, to be renamed onto it.

    Created with the ordinary modes (0o666 for a file, 0o777 for a directory) so that the kernel
    applies the umask, as for any file a program writes: tempfile's private 0o600 / 0o700 would
    stay on the output once it is renamed into place.
    """
    import secrets

    folder = os.path.dirname(os.path.abspath(path))
    while True:
        candidate = os.path.join(folder, f".streameval-{secrets.token_hex(6)}{suffix}")
        try:
            if directory:
                os.mkdir(candidate, 0o777)
            else:
                os.close(os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return candidate
        except FileExistsError:  # another writer drew the same name: draw again
            continue


def _fallback(text: str, what: str) -> str | None:
    prefix = f"streameval-{what.replace(' ', '-')}-{time.strftime('%Y%m%d-%H%M%S')}-"
    for folder in (tempfile.gettempdir(), os.getcwd(), os.path.expanduser("~")):
        try:
            fd, candidate = tempfile.mkstemp(prefix=prefix, suffix=".json", dir=folder)
        except OSError:
            continue
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            return candidate
        except OSError:  # that folder is full too: leave no partial copy behind
            os.unlink(candidate)
    return None


REMOVAL_WAIT_S = 10.0  # how long removing a temporary folder waits for writes still landing in it


@contextlib.contextmanager
def temporary_folder():
    """A new private folder in the temporary directory ($TMPDIR), removed however the block ends.

    Its name is chosen before it exists, so an interruption at any moment finds it named."""
    folder = os.path.join(tempfile.gettempdir(), f"streameval-{uuid.uuid4().hex}")
    try:
        os.mkdir(folder, 0o700)
        yield folder
    finally:
        _remove_folder(folder)


def _remove_folder(folder: str) -> None:
    """Remove ``folder``, retried until it is gone: an interrupted zarr write leaves its I/O thread
    finishing the chunk writes the call had started, which can land after a first ``rmtree``.  A
    Ctrl-C meanwhile (the run was over, or a second one) waits for the removal, then is raised."""
    deadline, stopped = time.monotonic() + REMOVAL_WAIT_S, None
    while True:
        try:
            shutil.rmtree(folder, ignore_errors=True)
            if not os.path.lexists(folder) or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        except KeyboardInterrupt as exc:
            stopped = exc
    if stopped is not None:
        raise stopped
