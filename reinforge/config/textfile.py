"""Reading a user's text file (a config, a data file, code problems) as UTF-8, so that one that is
not UTF-8 is one line naming the file, the line and byte where decoding failed, and the fix,
instead of a bare ``UnicodeDecodeError`` that names no file."""

from __future__ import annotations

from pathlib import Path

_BOM = b"\xef\xbb\xbf"


def read_utf8(path: str | Path, key: str, error: type[Exception] = ValueError) -> str:
    """The text of ``path`` decoded as UTF-8 (a leading byte-order mark, as some editors write,
    is dropped). ``key``: the config key or role that named the file, put first in the message;
    ``error``: the exception class raised for a file that is not UTF-8 (e.g. TaskError)."""
    path = Path(path)
    data = path.read_bytes()
    skip = len(_BOM) if data.startswith(_BOM) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as err:
        at = skip + err.start
        line = data.count(b"\n", 0, at) + 1
        column = at - (data.rfind(b"\n", 0, at) + 1) + 1
        raise error(
            f"{key}: {str(path)!r} is not UTF-8 text: byte 0x{data[at]:02x} at offset {at} (line {line}, "
            f"byte {column} of the line) cannot be decoded; re-save the file as UTF-8, e.g. "
            f"`iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8{path.suffix}` when it is Latin-1"
        ) from None
