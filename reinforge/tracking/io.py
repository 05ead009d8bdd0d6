"""Crash-safe file writes for the run directory.

Whole files (config, status, summaries, plots, eval details) are written to a temporary file in
the same directory, flushed and fsync'ed, then renamed over the target with ``os.replace``, which
is atomic on POSIX and Windows: a reader sees the old content or the new, never half of either.

Append-only logs (``*.jsonl``) get one JSON object per line, written in one ``write`` call and
fsync'ed. A crash in the middle of an append can leave at most a torn final line without its
newline; :func:`read_jsonl` ignores such a line, and the next :func:`append_jsonl` cuts it off
before writing, so the log stays readable line by line.

A write that fails raises OSError with the file's name set (a failed ``write`` call alone does
not name it), so a full disk is reported as "which file, on which device"; :func:`is_disk_full`
recognises one however a library wrapped it.
"""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

__all__ = [
    "DamagedRunError",
    "read_json",
    "DiskFullError",
    "is_disk_full",
    "atomic_write_text",
    "atomic_write_bytes",
    "atomic_write_json",
    "append_jsonl",
    "append_jsonl_many",
    "read_jsonl",
    "rewrite_jsonl",
    "to_jsonable",
]


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "file write failed")


class DiskFullError(OSError):
    """A write failed because its file system is full (or over quota). The message says what
    filled up and what is still intact."""


class DamagedRunError(ValueError):
    """A file of a run directory cannot be read as what reinforge wrote there (garbage, truncated, the
    wrong shape). The message is one line, ``FILE: what is wrong; the fix``, and the three parts are
    kept as ``path``, ``problem`` and ``fix``. A ValueError, so the readers that tolerate a damaged run
    (``reinforge runs``, ``compare``) catch it with the rest."""

    def __init__(self, path: str | os.PathLike, problem: str | None = None, fix: str | None = None) -> None:
        self.path, self.problem, self.fix = Path(path), problem, fix
        super().__init__(f"{path}: {problem}; {fix}" if problem else str(path))


_NO_DEFAULT = object()


def read_json(path: str | os.PathLike, *, fix: str, default: Any = _NO_DEFAULT, kind: type | None = None) -> Any:
    """The JSON value in ``path``. A missing file returns ``default`` (FileNotFoundError without one);
    text that is not JSON, not UTF-8, or (with ``kind``) not a ``kind`` raises DamagedRunError
    naming the file, what is wrong and ``fix``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if default is _NO_DEFAULT:
            raise
        return default
    except UnicodeDecodeError as err:
        raise DamagedRunError(path, f"not UTF-8 text (byte {err.start})", fix) from None
    except IsADirectoryError:
        raise DamagedRunError(path, "a directory, not a file", fix) from None
    try:
        value = json.loads(text)
    except ValueError as err:
        raise DamagedRunError(path, f"not valid JSON ({err})", fix) from None
    if kind is not None and not isinstance(value, kind):
        raise DamagedRunError(path, f"holds {json_kind(value)}, not {json_kind(kind())}", fix)
    return value


def json_kind(value: Any) -> str:
    """What a JSON value is, in words: 'a JSON list', 'JSON null'."""
    if isinstance(value, bool) or value is None:
        return f"JSON {json.dumps(value)}"
    return {dict: "a JSON object", list: "a JSON list", str: "a JSON string"}.get(type(value), "a JSON number")


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` (or an exception it was raised from) is a full disk or an exceeded quota.
    torch.save and safetensors wrap the OSError in their own RuntimeErrors, so their text counts
    too ("file write failed" is torch's zip writer on ENOSPC)."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _DISK_FULL:
            return True
        if any(t in str(err) for t in _DISK_FULL_TEXT):
            return True
        err = err.__cause__ or err.__context__
    return False


def _named(err: OSError, path: Path) -> OSError:
    """``err`` with ``path`` as its file name (an OSError from ``write`` carries none)."""
    if err.filename is None and err.errno is not None:
        return OSError(err.errno, err.strerror, str(path))
    return err


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once at import: temporary files are created 0600, and renamed files should get the
# permissions an ordinary ``open(path, "w")`` would have given them.
_FILE_MODE = 0o666 & ~_current_umask()


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable; a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, fsync, rename).

    On any failure the temporary file is removed and ``path`` keeps its previous content.
    """
    path = Path(path)
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, _FILE_MODE)
        except OSError:
            pass
        os.replace(tmp, path)
    except BaseException as err:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        if isinstance(err, OSError) and _named(err, path) is not err:
            raise _named(err, path) from err
        raise
    _fsync_dir(directory)
    return path


def atomic_write_text(path: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; see :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode(encoding))


def to_jsonable(obj: Any) -> Any:
    """``json.dumps`` fallback for the values a training loop logs: numpy/torch scalars and arrays,
    paths, datetimes, sets. Anything else raises TypeError naming the type."""
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (_dt.datetime, _dt.date)):
        return obj.isoformat()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    if hasattr(obj, "detach"):  # torch.Tensor: 0-d -> scalar, otherwise nested lists
        return obj.detach().cpu().tolist()
    if hasattr(obj, "tolist"):  # numpy scalar -> Python scalar, ndarray -> nested lists
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"object of type {type(obj).__name__} is not JSON serialisable")


def _dumps(obj: Any, **kwargs: Any) -> str:
    # NaN/inf are kept (Python's json reads them back); a NaN loss is information worth logging.
    return json.dumps(obj, default=to_jsonable, ensure_ascii=False, **kwargs)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> Path:
    """Write ``obj`` as JSON to ``path`` atomically."""
    return atomic_write_text(path, _dumps(obj, indent=indent) + "\n")


def _line(record: Any) -> str:
    text = _dumps(record)
    # json.dumps never emits a raw newline (they are escaped inside strings), so one record is
    # exactly one line.
    return text + "\n"


def _drop_torn_tail(f) -> None:
    """If the file (opened r+b) does not end with a newline, its last line is the remains of an
    interrupted append: cut it off, unless it is a complete JSON value (a file written by hand
    without the final newline), in which case terminate it."""
    end = f.seek(0, os.SEEK_END)
    if end == 0:
        return
    f.seek(end - 1)
    if f.read(1) == b"\n":
        return
    # Find the start of the unterminated last line.
    block = 1 << 16
    pos = end
    start = 0
    while pos > 0:
        read_from = max(0, pos - block)
        f.seek(read_from)
        chunk = f.read(pos - read_from)
        idx = chunk.rfind(b"\n")
        if idx >= 0:
            start = read_from + idx + 1
            break
        pos = read_from
    f.seek(start)
    tail = f.read(end - start)
    try:
        json.loads(tail.decode("utf-8"))
        complete = True
    except (UnicodeDecodeError, ValueError):
        complete = False
    if complete:
        f.seek(end)
        f.write(b"\n")
    else:
        f.truncate(start)
        f.seek(start)


def append_jsonl_many(path: str | os.PathLike, records: Iterable[Any]) -> None:
    """Append several records, one line each, in a single write followed by one fsync."""
    data = "".join(_line(r) for r in records).encode("utf-8")
    if not data:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    try:
        with open(path, "a+b") as f:
            # "a+b" always writes at the end; reading/truncating the torn tail first is still allowed.
            _drop_torn_tail(f)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:  # a part-written line is a torn tail: the next append cuts it off
        if _named(err, path) is err:
            raise
        raise _named(err, path) from err
    if not existed:
        _fsync_dir(path.parent)


def append_jsonl(path: str | os.PathLike, record: Any) -> None:
    """Append ``record`` as one JSON line to ``path`` (created if missing), flushed and fsync'ed."""
    append_jsonl_many(path, [record])


def read_jsonl(path: str | os.PathLike) -> list[Any]:
    """Read a JSON-lines file written by :func:`append_jsonl`.

    A missing file reads as ``[]``; a directory in its place raises DamagedRunError; blank lines
    are skipped. A final line without its newline
    that does not parse is the remains of an interrupted append and is ignored. Any other line
    that does not parse raises ValueError naming the file and line number: that is corruption,
    not a crash mid-append, and should not be silently skipped.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except IsADirectoryError:  # e.g. a folder made by hand where the log goes
        raise DamagedRunError(path, "is a directory, not the JSON-lines log reinforge writes there",
                              "move it out of the run directory, then run the command again") from None
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    records = []
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            records.append(json.loads(raw.decode("utf-8")))
        except (UnicodeDecodeError, ValueError) as err:
            raise ValueError(f"{path}: line {lineno} is not valid JSON ({err})") from None
    if torn.strip():
        try:
            records.append(json.loads(torn.decode("utf-8")))
        except (UnicodeDecodeError, ValueError):
            pass  # torn final line from an interrupted append
    return records


def rewrite_jsonl(path: str | os.PathLike, records: Iterable[Any]) -> Path:
    """Replace the content of ``path`` with ``records`` (one JSON line each), atomically."""
    return atomic_write_text(path, "".join(_line(r) for r in records))

