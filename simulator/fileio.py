"""Input and output files: inputs checked before they are opened, outputs checked before any
work and written atomically.

Every command that reads or writes goes through here, so one set of rules holds for all of them:

- ``check_input`` runs before every ``open()`` of an input: a FIFO would block in ``open()``
  and a device or socket never ends, so only a regular file is read (or ``/dev/stdin`` where a
  caller takes a stream by design); ``read_bytes`` / ``open_binary`` check and
  then read, and turn an OS error (EIO from ``/proc/self/mem``, EACCES) or bytes that are not
  UTF-8 into one ``InputError`` line naming the file.
- ``check_output`` runs before the work starts: the place must be writable (its nearest existing
  folder takes a probe file: a permission bit is not enough, ``/proc`` or a read-only mount refuse
  even root), a file output must not be an existing folder and a folder output not an existing
  file, and no output, nor any file a folder output declares it will hold, may be one of the
  command's inputs (an atomic rename would replace it).
- ``atomic_output`` writes a temp file beside the target and renames it on success; on any error,
  Ctrl-C or SIGTERM (the CLI turns it into KeyboardInterrupt) the temp file is removed.
- ``folder_output`` stages a folder output (``plan --out DIR``) in a temp folder beside it and
  swaps its files in as one set with SIGINT/SIGTERM deferred: an interrupted run leaves the
  earlier run's folder as it was, never a new file beside an old plot.
- ``output_set`` groups a command's several outputs (``replay --out --plot``, ``plan --out --report``): inside
  it each ``atomic_output`` and ``folder_output`` is staged, and all of them are committed together at its end
  with SIGINT/SIGTERM deferred, so an interrupt leaves every output as it was, never a new table beside an old
  plot.
- A temp file (or folder) is named ``.<target>.<pid>.<random>.tmp``. A run killed outright
  (SIGKILL) leaves one behind; the next write of the same target removes those whose process
  is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from .errors import HisparseError


class OutputError(HisparseError):
    """An output that cannot be written where it was asked for."""


class InputError(HisparseError):
    """An input file that cannot be read (missing, not a regular file, an OS error, not text).

    ``problem`` is the message without the file's name, for readers that name it their way."""

    def __init__(self, name: str, problem: str) -> None:
        self.problem = problem
        super().__init__(f"{name}: {problem}")


def _name(path: str | os.PathLike, option: str | None) -> str:
    return f"{option} {path}" if option else str(path)


# Specials read by design where a caller allows a stream (``special_ok``): they never block in open().
STREAM_INPUTS = frozenset({"/dev/stdin"})


def why_os(exc: OSError) -> str:
    """An OS error as the few words a user needs ("No space left on device")."""
    return exc.strerror or str(exc)


def _kind_of(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def check_input(path: str | os.PathLike, *, option: str | None = None, special_ok: bool = False) -> None:
    """Refuse, without opening it, an input that is not a readable regular file.

    A FIFO blocks in ``open()`` until a writer comes, a device or socket may never end: all are
    refused here from ``stat`` alone (which never blocks). ``special_ok`` lets the stream inputs
    of ``STREAM_INPUTS`` through."""
    name = _name(path, option)
    text = os.fspath(path)
    if isinstance(text, bytes) or "\0" in text:
        raise InputError(repr(name), "a file name cannot hold a NUL byte")
    if text == "":
        raise InputError(option or "input", "empty path")
    try:
        st = os.stat(text)
    except FileNotFoundError:
        raise InputError(name, "no such file") from None
    except (OSError, ValueError) as exc:
        raise InputError(name, f"cannot read ({why_os(exc) if isinstance(exc, OSError) else exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(name, "is a folder; give a file")
    if not stat.S_ISREG(st.st_mode):
        if special_ok and text in STREAM_INPUTS:
            return
        raise InputError(name, f"is {_kind_of(st.st_mode)}, not a regular file; give a file")
    if not os.access(text, os.R_OK):
        raise InputError(name, "cannot read (permission denied)")


def open_binary(path: str | os.PathLike, *, option: str | None = None) -> IO[bytes]:
    """``check_input``, then the file opened for binary reads (an OS error: one line)."""
    check_input(path, option=option)
    try:
        return open(path, "rb")  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        raise InputError(_name(path, option), f"cannot read ({why_os(exc)})") from None


def read_bytes(path: str | os.PathLike, *, option: str | None = None, special_ok: bool = False) -> bytes:
    """A whole input file's bytes, checked first; OS errors become one line naming the file.

    ``/dev/stdin`` (with ``special_ok``) is read from the open descriptor 0, never reopened: a
    pipe whose writer has finished would block a new ``open()`` until another writer comes."""
    check_input(path, option=option, special_ok=special_ok)
    if special_ok and os.fspath(path) in STREAM_INPUTS:
        import sys

        try:
            return sys.stdin.buffer.read()
        except (OSError, AttributeError, ValueError) as exc:
            raise InputError(_name(path, option), f"cannot read ({exc})") from None
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise InputError(_name(path, option), f"cannot read ({why_os(exc)})") from None


def _nearest_existing(path: Path) -> Path:
    for parent in (path, *path.parents):
        if parent.exists() or parent.is_symlink():
            return parent
    return Path(".")


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two existing paths name the same file (links and relative spellings included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist: nothing to overwrite
        return False


def _probe(folder: Path) -> str | None:
    """None if a file can be created in ``folder``, else why not."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".hisparse-probe.", dir=folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def check_output(path: str | os.PathLike, *, option: str = "--out", kind: str = "file",
                 inputs: Iterable[str | os.PathLike] = (), files: Iterable[str] = ()) -> None:
    """Refuse, before any work, an output that cannot be written or that would replace an input.

    ``kind`` is "file" (the path becomes a file) or "dir" (a folder the command fills with
    ``files``, names inside it; one ending in "/" is a sub-folder). Each file the output will
    hold is compared with every input, not only the output's own path: ``plan --model
    OUT/plan.json --out OUT`` would overwrite its model. An OS error while checking (a name too
    long, ENAMETOOLONG) is one line naming the option."""
    name = f"{option} {path}"
    if str(path) == "":
        raise OutputError(f"{option}: empty path")
    if "\0" in str(path):
        raise OutputError(f"{name!r}: a file name cannot hold a NUL byte")
    try:
        _check_output(Path(path), name, kind, [s for s in inputs if s is not None and str(s) != ""], tuple(files))
    except OSError as exc:
        raise OutputError(f"{name}: cannot write ({why_os(exc)})") from None


def _within(inner: str | os.PathLike, folder: Path) -> bool:
    """Whether existing ``inner`` lies inside ``folder``: by its resolved path (symbolic links,
    ``..``) or as a hard link of a file there (the same inode under another name)."""
    try:
        if Path(os.path.realpath(inner)).is_relative_to(os.path.realpath(folder)):
            return True
        st = os.stat(inner)
    except (OSError, ValueError):
        return False
    if not folder.is_dir() or st.st_nlink < 2:  # a file with one name has it outside the folder
        return False
    for root, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                other = os.lstat(os.path.join(root, name))
                if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                    return True
    return False


def _check_output(target: Path, name: str, kind: str, inputs: list, files: tuple[str, ...]) -> None:
    for entry in files:
        held = target / entry.rstrip("/")
        for source in inputs:
            if same_file(held, source) or (entry.endswith("/") and _within(source, held)):
                raise OutputError(f"{name}: would write {held}, an input of this command ({source}); "
                                  "give another folder")
    for source in inputs:
        if same_file(target, source):
            raise OutputError(f"{name}: is an input of this command; writing it would replace the input")
    if kind == "file" and target.is_dir():
        raise OutputError(f"{name}: is a folder; give a file name")
    if kind == "file" and _special(target):  # /dev/stdout, a pipe: written in place
        if not os.access(target, os.W_OK):
            raise OutputError(f"{name}: cannot write (permission denied)")
        return
    if kind == "dir" and target.exists() and not target.is_dir():
        raise OutputError(f"{name}: is a file; give a folder")
    folder = target if kind == "dir" else target.parent
    existing = _nearest_existing(folder)
    if not existing.is_dir():
        raise OutputError(f"{name}: {existing} is a file, not a folder")
    why = _probe(existing)
    if why is not None:
        raise OutputError(f"{name}: cannot write in {existing} ({why})")


_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[^.]+\.tmp$")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def stale_temps(path: str | os.PathLike) -> list[Path]:
    """Temp files of ``path`` left by writers that no longer run (killed with SIGKILL)."""
    target = Path(path)
    found = []
    with contextlib.suppress(OSError):
        for entry in target.parent.iterdir():
            m = _TEMP.match(entry.name)
            if m and m["name"] == target.name and not _alive(int(m["pid"])):
                found.append(entry)
    return found


def temp_beside(path: str | os.PathLike) -> tuple[IO[bytes], str]:
    """An open binary temp file in ``path``'s folder (created if needed), with normal permissions.

    Stale temp files of the same target (their writer was killed) are removed first."""
    target = Path(path)
    try:
        if target.is_dir():
            raise OutputError(f"{_shown(path)}: is a folder; give a file name")
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in stale_temps(target):
            with contextlib.suppress(OSError):
                stale.unlink()
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent)
    except OutputError:
        raise
    except OSError as exc:
        raise OutputError(f"{_shown(path)}: cannot write ({exc.strerror or exc})") from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    return os.fdopen(fd, "wb"), tmp


def replace_into(tmp: str, path: str | os.PathLike) -> None:
    """Rename a finished temp file onto ``path``; an OS failure becomes a one-line error."""
    try:
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutputError(f"{_shown(path)}: cannot write ({exc.strerror or exc})") from None


def _special(path: Path) -> bool:
    """An existing output that is not a regular file or a folder: a device (/dev/stdout) or a pipe."""
    return path.exists() and not path.is_file() and not path.is_dir()


def special_output(path: str | os.PathLike) -> bool:
    """``_special`` for the writers that stage their own temp file (the .hst writer): a device or pipe is written
    in place, never replaced by a renamed file."""
    return _special(Path(path))


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[IO[bytes]]:
    """Yield a binary file; on clean exit it becomes exactly ``path``, on error nothing is left.

    A device or pipe (``/dev/stdout``) is written in place: renaming onto it would replace it."""
    if _special(Path(path)):
        try:
            with open(path, "wb") as handle:
                yield handle
        except OSError as exc:
            raise OutputError(f"{path}: cannot write ({exc.strerror or exc})") from None
        return
    handle, tmp = temp_beside(path)
    try:
        try:
            with handle:
                yield handle
        except OSError as exc:  # disk full, quota: name the file, no traceback
            raise OutputError(f"{_shown(path)}: cannot write ({exc.strerror or exc})") from None
        if _STAGED is not None and not _in_staging(path):  # inside output_set: committed with the set's others
            _STAGED.append((lambda: replace_into(tmp, path), lambda: _unlink(tmp)))
            return
        replace_into(tmp, path)  # (a file of a staged folder goes in now: the folder's own commit is the set's)
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# (commit, discard) of each output staged inside output_set; None: outputs commit as they are written
_STAGED: list[tuple] | None = None
_STAGING: dict[Path, Path] = {}  # folder_output's temp folders open now -> the output folder as the user named it


def _staged_in(path: str | os.PathLike) -> tuple[Path, Path] | None:
    """(temp folder, output folder) of the folder_output temp folder ``path`` lies in, else None."""
    parent = Path(os.path.realpath(Path(path).parent))
    for tmp, shown in _STAGING.items():
        if parent == tmp or tmp in parent.parents:
            return tmp, shown
    return None


def _in_staging(path: str | os.PathLike) -> bool:
    """Whether ``path`` lies in a folder_output temp folder (written, then read back or chmod-ed, before the
    folder's commit)."""
    return _staged_in(path) is not None


def _shown(path: str | os.PathLike) -> str:
    """``path`` as an error names it: a file being written in a folder output's temp folder by its place in the
    output folder (``OUT/throughput.png``), not by the temp folder the user never named (a full disk named
    ``.OUT.<pid>.<random>.tmp/throughput.png``)."""
    staged = _staged_in(path)
    if staged is None:
        return str(path)
    tmp, shown = staged
    inner = Path(os.path.realpath(Path(path).parent)).relative_to(tmp) / Path(path).name
    return str(shown / inner)


@contextlib.contextmanager
def output_set() -> Iterator[None]:
    """Stage every ``atomic_output`` / ``folder_output`` written inside, and commit them together at a clean exit,
    SIGINT / SIGTERM deferred while the renames run: an interrupt (or an error) before that leaves every output
    as it was (an mrc interrupted between its table and its plot left the new table beside the old plot, and a
    plan between its --out folder and its --report). Not for outputs written progressively on purpose (a
    sweep's parts, a recording's checkpoints)."""
    global _STAGED
    if _STAGED is not None:  # nested: the outer set commits
        yield
        return
    _STAGED = staged = []
    try:
        yield
    except BaseException:
        _STAGED = None
        for _, discard in staged:
            discard()
        raise
    _STAGED = None
    try:
        with _signals_deferred():
            for commit, _ in staged:
                commit()
    finally:
        for _, discard in staged:  # what a failed commit left staged
            discard()


# -- folder outputs: replaced as a whole or not at all ------------------------------------------
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait while a commit runs (a few renames: stopping half-way would leave
    a folder holding two runs' files), then take effect. Python runs signal handlers in the main
    thread whichever thread the kernel picked, so holding them here works in a threaded process
    where a signal mask (per thread) would not."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum)) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    for signum in dict.fromkeys(caught):
        handler = previous[signum]
        if callable(handler):
            handler(signum, None)
        elif handler != signal.SIG_IGN:
            signal.raise_signal(signum)


def _stale_folders(target: Path) -> list[Path]:
    return [p for p in stale_temps(target) if p.is_dir() and not p.is_symlink()]


@contextlib.contextmanager
def folder_output(path: str | os.PathLike, files: Iterable[str]) -> Iterator[Path]:
    """Yield a temp folder beside ``path`` to write the output folder's ``files`` into; on a clean
    exit they replace the folder's files as one set, else the folder is left as it was.

    A new folder is the temp folder renamed into place. An existing one keeps every entry that is
    not one of ``files`` (a user's notes, an input of the run): each new file is renamed over its
    old version and a declared file the run did not write is removed (it belonged to the earlier
    run), all with SIGINT/SIGTERM deferred, so an interrupt lands before the commit (the folder
    unchanged, the temp folder removed) or after it. Temp folders of killed writers are removed."""
    target = Path(os.path.realpath(path))
    names = tuple(files)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in _stale_folders(target):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent))
    except OSError as exc:
        raise OutputError(f"{path}: cannot write ({why_os(exc)})") from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    real_tmp = Path(os.path.realpath(tmp))
    _STAGING[real_tmp] = Path(path)
    try:
        if _STAGED is not None:  # inside output_set: swapped in with the set's other outputs
            try:
                yield tmp
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            _STAGED.append((lambda: _commit(tmp, target, names, path),
                            lambda: shutil.rmtree(tmp, ignore_errors=True)))
            return
        try:
            yield tmp
            with _signals_deferred():
                _commit(tmp, target, names, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        _STAGING.pop(real_tmp, None)


def _commit(tmp: Path, target: Path, names: tuple[str, ...], shown: str | os.PathLike) -> None:
    try:
        if not target.exists():
            os.rename(tmp, target)
            return
        for name in names:
            new, old = tmp / name, target / name
            if new.exists():
                os.replace(new, old)
            elif old.is_file() or old.is_symlink():
                old.unlink()
    except OSError as exc:
        raise OutputError(f"{shown}: cannot write ({why_os(exc)})") from None
