"""Damaged or mismatched artefacts become one line: which file, what is wrong, how to rebuild it.

Loaders of saved things (probe, grader, index, evolve store, cached models) call
libraries whose errors are tracebacks that do not name the file to rebuild (numpy's
"could only read 8 elements", faiss's C++ assertion, torch's multi-line state-dict
report, "file is not a database"). The helpers here check cheap structural facts
first (a safetensors or ``.npy`` header against the file size: a truncated copy is the
common case) and convert whatever a loader still raises into
``RagsieveError("<file>: damaged (<reason>); <how to rebuild>")``.

Example::

    with reading_artifact(path / "index.faiss", INDEX_REBUILD):
        index = faiss.read_index(str(path / "index.faiss"))
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import struct
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ragsieve.errors import DataError, RagsieveError

__all__ = [
    "GRADER_REBUILD",
    "INDEX_REBUILD",
    "PROBE_REBUILD",
    "STORE_REBUILD",
    "cache_rebuild",
    "check_model_folder",
    "check_npy",
    "check_safetensors",
    "damaged",
    "read_json_artifact",
    "reading_artifact",
    "record_training_outputs",
    "sqlite_error",
    "state_dict_mismatch",
    "weights_key",
]

# How to rebuild each kind of artefact, in CLI terms (the user is usually at a shell).
INDEX_REBUILD = "rebuild the index (`ragsieve index --out <folder> --overwrite`)"
PROBE_REBUILD = "retrain the probe (`ragsieve probe train`)"
GRADER_REBUILD = "retrain the grader (`ragsieve grader train`)"
STORE_REBUILD = "restore it from a backup, or start a new store (`ragsieve evolve init`)"

# A safetensors header larger than this is not a header: the length bytes are garbage.
_MAX_HEADER = 100 * 1024 * 1024


def cache_rebuild(folder: str | os.PathLike[str]) -> str:
    """The hint for something ragsieve builds itself on first use."""
    return f"delete {folder} and ragsieve rebuilds it on next use"


def damaged(file: str | os.PathLike[str], reason: str, rebuild: str) -> RagsieveError:
    """The one-line error for a damaged artefact (returned, for ``raise damaged(...)``)."""
    return RagsieveError(f"{file}: damaged ({_one_line(reason)}); {rebuild}")


def _one_line(text: str, limit: int = 200) -> str:
    """The first non-blank line of ``text``, shortened: library messages can be pages long."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    first = lines[0] if lines else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


def _reason(exc: BaseException) -> str:
    text = _one_line(str(exc))
    if isinstance(exc, KeyError):
        return f"missing entry {text}"
    return text or type(exc).__name__


def _loader_errors() -> tuple[type[BaseException], ...]:
    """What loaders raise on bad bytes: stdlib types plus the libraries' own, if installed."""
    errors: list[type[BaseException]] = [
        OSError, ValueError, EOFError, RuntimeError, KeyError, IndexError, TypeError,
        struct.error, sqlite3.DatabaseError, UnicodeDecodeError,
    ]
    try:
        from safetensors import SafetensorError

        errors.append(SafetensorError)
    except ImportError:  # pragma: no cover - safetensors is a dependency
        pass
    import pickle

    errors.append(pickle.UnpicklingError)
    return tuple(errors)


@contextmanager
def reading_artifact(file: str | os.PathLike[str], rebuild: str, reason: str | None = None) -> Iterator[None]:
    """Turn any error raised while loading ``file`` into :func:`damaged`'s one line.

    ``reason`` replaces the library's own message when that is unreadable (faiss reports
    a C++ assertion). ragsieve's own errors pass through unchanged (they are already one
    line); a missing file says "missing" rather than "damaged".
    """
    try:
        yield
    except RagsieveError:
        raise
    except FileNotFoundError as exc:
        missing = exc.filename or file
        raise RagsieveError(f"{missing}: missing; {rebuild}") from None
    except _loader_errors() as exc:
        raise damaged(file, reason or _reason(exc), rebuild) from None


def read_json_artifact(file: str | os.PathLike[str], rebuild: str) -> dict[str, Any]:
    """A JSON object written by ragsieve (configs, manifests); one line if it is not one."""
    from ragsieve.text_input import read_text

    file = Path(file)
    if not file.is_file() and not file.is_dir():
        raise RagsieveError(f"{file}: missing; {rebuild}")
    try:
        data = json.loads(read_text(file))
    except DataError as exc:  # not UTF-8, or a folder: keep the what, drop the file name and advice
        raise damaged(file, str(exc).split(": ", 1)[-1].split("; ")[0], rebuild) from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise damaged(file, f"not valid JSON: {_reason(exc)}", rebuild) from None
    if not isinstance(data, dict):
        raise damaged(file, f"expected a JSON object, got {type(data).__name__}", rebuild)
    return data


def check_safetensors(file: str | os.PathLike[str], rebuild: str) -> None:
    """Check a safetensors file's header against its size without loading any tensor.

    Catches truncated copies (the usual damage: a full disk, an interrupted copy) in
    microseconds, before a multi-second model load fails somewhere inside a library.
    """
    file = Path(file)
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise damaged(file, f"{size} bytes, too short for a safetensors file", rebuild)
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, _MAX_HEADER):
                raise damaged(file, f"header length {n} does not fit a {size}-byte file", rebuild)
            header = fh.read(n)
    except FileNotFoundError:
        raise RagsieveError(f"{file}: missing; {rebuild}") from None
    except OSError as exc:
        raise damaged(file, f"cannot read ({exc.strerror or exc})", rebuild) from None
    try:
        meta = json.loads(header)
        end = max((int(v["data_offsets"][1]) for k, v in meta.items() if k != "__metadata__"), default=0)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        raise damaged(file, "unreadable safetensors header", rebuild) from None
    expected = 8 + n + end
    if size < expected:
        raise damaged(file, f"truncated: {size} of {expected} bytes", rebuild)


def check_npy(file: str | os.PathLike[str], rebuild: str) -> None:
    """Check a ``.npy`` file's header against its size (truncation) without reading the array."""
    import numpy as np

    file = Path(file)
    fmt = np.lib.format
    with reading_artifact(file, rebuild):
        size = file.stat().st_size
        with open(file, "rb") as fh:
            version = fmt.read_magic(fh)
            read_header = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
            if read_header is None:
                return  # a newer format: leave the checks to numpy
            shape, _, dtype = read_header(fh)
            offset = fh.tell()
    if dtype.hasobject:
        return  # pickled object arrays have no fixed size; numpy's own error will do
    expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size < expected:
        raise damaged(file, f"truncated: {size} of {expected} bytes", rebuild)


def check_model_folder(folder: str | os.PathLike[str], rebuild: str) -> None:
    """Check every safetensors file of a model folder (e.g. a cached ``model.safetensors``)."""
    folder = Path(folder)
    if folder.is_dir():
        for file in sorted(folder.glob("*.safetensors")):
            check_safetensors(file, rebuild)


def state_dict_mismatch(expected: Mapping[str, Any], got: Mapping[str, Any]) -> str | None:
    """The first difference between two state dicts (keys, then shapes), or None.

    Torch's own ``load_state_dict`` error is a multi-line report; this is one clause.
    """
    if missing := sorted(set(expected) - set(got)):
        return f"tensor {missing[0]!r} missing"
    if extra := sorted(set(got) - set(expected)):
        return f"unexpected tensor {extra[0]!r}"
    for key in sorted(expected):
        want, have = tuple(expected[key].shape), tuple(got[key].shape)
        if want != have:
            return f"tensor {key!r} is {list(have)}, expected {list(want)}"
    return None


def sqlite_error(file: str | os.PathLike[str], exc: sqlite3.Error, rebuild: str) -> RagsieveError:
    """One line for an SQLite failure: busy (retry later) is not damage (restore / rebuild)."""
    reason = _reason(exc)
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in reason or "busy" in reason):
        return RagsieveError(f"{file}: busy ({reason}); another process holds it, retry when it is done")
    if isinstance(exc, sqlite3.OperationalError) and ("unable to open" in reason or "readonly" in reason):
        return RagsieveError(f"{file}: cannot open ({reason}); check the folder exists and is writable")
    return damaged(file, reason, rebuild)


# --------------------------------------------------------------------- training outputs of a study

TRAINING_OUTPUTS = "artifacts.json"


def weights_key(folder: str | Path, filename: str = "model.safetensors") -> str:
    """A short key that changes with a model folder's weights (first MB + size of its safetensors;
    ``filename="adapter_model.safetensors"`` for a PEFT adapter)."""
    f = Path(folder) / filename
    if not f.is_file():
        raise RagsieveError(f"{folder}: no {filename} to key the scores made with it by")
    with f.open("rb") as fh:
        head = fh.read(1 << 20)
    return hashlib.sha1(head + str(f.stat().st_size).encode()).hexdigest()[:12]


def file_sha256(file: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks.

    Example::

        file_sha256("ragsieve/assets/base-reranker/model.safetensors")
    """
    digest = hashlib.sha256()
    with open(file, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_training_outputs(out_dir: str | os.PathLike[str], files: list[str | os.PathLike[str]]) -> list[str]:
    """Record the sha256 of a study's training outputs (weights stay out of git) in ``<out_dir>/artifacts.json``.

    ``files`` are files inside ``out_dir`` (usually its git-ignored ``work/``), given like ``out_dir``
    (e.g. ``out_dir / "probe" / "probe.safetensors"``); they are recorded by their path relative to it.
    Returns one line per file saying whether a rerun rebuilt the recorded file or a different one (the
    new hash replaces it).
    """
    out = Path(out_dir)
    record_file = out / TRAINING_OUTPUTS
    record: dict[str, Any] = json.loads(record_file.read_text()) if record_file.is_file() else {}
    lines = []
    for f in files:
        path = Path(f)
        rel = path.resolve().relative_to(out.resolve()).as_posix()
        entry = {"sha256": file_sha256(path), "bytes": path.stat().st_size}
        before = record.get(rel, {}).get("sha256")
        if before is None:
            lines.append(f"{rel}: sha256 {entry['sha256'][:12]} recorded in {record_file}")
        elif before == entry["sha256"]:
            lines.append(f"{rel}: rebuilt the recorded file (sha256 {before[:12]})")
        else:
            lines.append(f"{rel}: differs from the recorded file (sha256 {entry['sha256'][:12]}, was {before[:12]})")
        record[rel] = entry
    tmp = record_file.with_name(record_file.name + ".tmp")
    tmp.write_text(json.dumps(dict(sorted(record.items())), indent=1) + "\n")
    os.replace(tmp, record_file)
    return lines
