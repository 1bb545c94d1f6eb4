"""One input policy for every text file ragsieve reads.

Passages files, QA / feedback ``.jsonl`` files, YAML / JSON configs and prompt files
are all UTF-8; a UTF-8 byte-order mark (which Windows editors add) is dropped, and
anything that is not UTF-8 becomes a one-line :class:`DataError` naming the file, the
line and the byte offset, so the user can find the byte (``xxd -s OFFSET``) and re-save
the file. Decoding is strict on purpose: silently replacing bytes would put mojibake
into passages that then get graded and reranked.

It imports nothing of ragsieve but the errors, so every layer (configs included) can use it.

Example::

    text = read_text("passages.txt", what="passages")
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path

from ragsieve.errors import DataError

__all__ = ["BOM", "check_input_file", "decode_utf8", "read_text"]

BOM = codecs.BOM_UTF8


def check_input_file(path: str | os.PathLike[str], what: str = "") -> Path:
    """``path`` as a :class:`Path` after checking it is a readable regular file.

    ``what`` names the file's role in the message ("passages", "config", ...). A folder
    gets its own message: "not found" would send the user looking for a typo.
    """
    path = Path(path)
    role = f"{what} file" if what else "file"
    if path.is_dir():
        raise DataError(f"{path}: is a directory; give the {role} itself")
    if not path.exists():
        raise DataError(f"{path}: {role} not found")
    if not os.access(path, os.R_OK):
        raise DataError(f"{path}: {role} is not readable (permission denied)")
    return path


def decode_utf8(raw: bytes, where: str, *, line: int | None = None, offset: int = 0) -> str:
    """Decode ``raw`` as strict UTF-8, dropping a leading BOM when ``offset == 0``.

    ``where`` is the file name; ``line`` is the 1-based line ``raw`` starts on (counted
    from ``raw`` when None) and ``offset`` the file offset of ``raw``'s first byte, so a
    caller decoding one line of a big file still reports the position in the file.
    """
    if offset == 0 and raw.startswith(BOM):
        raw, offset = raw[len(BOM) :], len(BOM)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(_not_utf8_message(raw, exc.start, where, line, offset)) from None


def _not_utf8_message(raw: bytes, start: int, where: str, line: int | None, offset: int) -> str:
    """``file:line: not UTF-8 (byte 0xE9 at byte offset N); ...`` for the bad byte at ``raw[start]``."""
    if line is None:
        line = raw.count(b"\n", 0, start) + 1
    return (
        f"{where}:{line}: invalid UTF-8 (byte 0x{raw[start]:02X} at byte offset {offset + start}); "
        "ragsieve reads text files as UTF-8: re-save the file as UTF-8"
    )


def read_text(path: str | os.PathLike[str], what: str = "") -> str:
    """The whole file as text (see the module doc for the policy); one-line errors otherwise."""
    path = check_input_file(path, what)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    return decode_utf8(raw, str(path))
