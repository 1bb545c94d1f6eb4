"""JSON-lines I/O: tolerant reading (plain or gzip), atomic writing, durable appending.

``read_jsonl`` returns a :class:`JsonlReader`; iterate it for dicts. With
``skip_bad=True`` malformed lines are skipped and counted in ``reader.skipped``
(final once iteration is done); otherwise the first one raises :class:`DataError`
naming ``file:line``.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from ragsieve.atomic import atomic_file
from ragsieve.errors import DataError
from ragsieve.text_input import check_input_file, decode_utf8

__all__ = ["JsonlReader", "read_jsonl", "write_jsonl", "append_jsonl"]


def _is_gz(path: Path) -> bool:
    return path.suffix == ".gz"


class JsonlReader:
    """Iterable over the JSON objects of one ``.jsonl`` / ``.jsonl.gz`` file.

    Blank lines are ignored. ``skipped`` counts malformed lines skipped so far,
    ``lineno`` is the line number of the last object yielded (for error messages).
    """

    def __init__(self, path: str | os.PathLike[str], skip_bad: bool = False) -> None:
        self.path = Path(path)
        self.skip_bad = skip_bad
        self.skipped = 0
        self.lineno = 0

    def numbered(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Yield ``(line_number, object)`` pairs (1-based line numbers)."""
        self.skipped = 0
        check_input_file(self.path)
        try:
            fh: IO[bytes] = gzip.open(self.path, "rb") if _is_gz(self.path) else open(self.path, "rb")
        except OSError as e:
            raise DataError(f"{self.path}: cannot open ({e.strerror or e})") from None
        with fh:
            offset = 0  # of the current line in the (decompressed) file, for error messages
            try:
                for lineno, raw in enumerate(fh, start=1):
                    start, offset = offset, offset + len(raw)
                    if not raw.strip():
                        continue
                    obj, error = _parse(raw, self.path, lineno, start)
                    if error is not None:
                        if self.skip_bad:
                            self.skipped += 1
                            continue
                        raise DataError(error)
                    self.lineno = lineno
                    yield lineno, obj
            except (gzip.BadGzipFile, EOFError, zlib.error) as e:
                # decompression reads ahead, so no reliable line number here
                raise DataError(f"{self.path}: corrupt or truncated gzip file ({e or type(e).__name__})") from None
            except OSError as e:  # e.g. an I/O error mid-file
                raise DataError(f"{self.path}: cannot read ({e.strerror or e})") from None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for _, obj in self.numbered():
            yield obj


def _parse(raw: bytes, path: Path, lineno: int, offset: int) -> tuple[Any, str | None]:
    """Decode line ``lineno`` (starting at file ``offset``); ``(object, None)`` or ``(None, message)``.

    Decoding goes through the shared text policy (BOM dropped on the first line, the
    file offset of a bad byte reported); the message is the one-line error to raise.
    """
    try:
        text = decode_utf8(raw, str(path), line=lineno, offset=offset)
    except DataError as e:
        return None, str(e)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        reason = f"{e.msg} at column {e.colno}"
    except RecursionError:
        reason = "nested too deeply"
    else:
        if isinstance(obj, dict):
            return obj, None
        reason = f"expected an object, got {type(obj).__name__}"
    return None, f"{path}:{lineno}: malformed JSON line ({reason})"


def read_jsonl(path: str | os.PathLike[str], skip_bad: bool = False) -> JsonlReader:
    """Read a ``.jsonl`` or ``.jsonl.gz`` file; iterate the result for dicts.

    >>> reader = read_jsonl("runs.jsonl", skip_bad=True)
    >>> rows = list(reader); reader.skipped  # lines that were not JSON objects
    """
    return JsonlReader(path, skip_bad=skip_bad)


def _dumps(row: Any) -> str:
    if dataclasses.is_dataclass(row) and not isinstance(row, type):
        row = dataclasses.asdict(row)
    if not isinstance(row, Mapping):
        raise DataError(f"cannot write {type(row).__name__} as a JSON line; expected a mapping or dataclass")
    line = json.dumps(row, ensure_ascii=False, separators=(",", ":"))
    return line + "\n"


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[Any]) -> int:
    """Write ``rows`` (mappings or dataclasses) atomically; gzip if the name ends in ``.gz``.

    The file is written to a temporary sibling and moved into place with
    :func:`os.replace`, so readers never see a half-written file. Returns the row count.
    """
    n = 0
    # atomic_file: the mode follows the umask (mkstemp made 0600 files others could not read)
    with atomic_file(path) as tmp:
        with open(tmp, "wb") as raw:
            out: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if _is_gz(path) else raw
            try:
                for row in rows:
                    out.write(_dumps(row).encode("utf-8"))
                    n += 1
            finally:
                if out is not raw:
                    out.close()
            raw.flush()
            os.fsync(raw.fileno())
    return n


def append_jsonl(path: str | os.PathLike[str], row: Any) -> None:
    """Append one row and fsync it, so a crash loses at most the line being written.

    If a previous crash left a partial last line, a newline is written first so the
    fragment stays one malformed line (skippable with ``skip_bad``) instead of
    swallowing this row.
    """
    path = Path(path)
    if _is_gz(path):
        raise DataError(f"{path}: cannot append to a gzip file; use a plain .jsonl store")
    line = _dumps(row).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                line = b"\n" + line
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
