"""Text-free score records a study commits to git, so an expensive scoring phase never runs twice.

A :class:`PairScores` folder holds one scorer's ``(query id, passage id) → score`` rows per dataset as
gzip'd JSON lines, ``<folder>/<dataset>.<k>.jsonl.gz``, each shard below ``max_bytes`` (git and
``tests/test_repo_hygiene.py`` refuse files over 5 MB). :meth:`PairScores.add` appends one gzip member
per call and fsyncs it, so a kill loses at most the chunk being written; a shard cut mid-member is
rewritten from its readable rows when next opened. ``<folder>/meta.json`` names the scorer (e.g. the
teacher's weights digest): records of another scorer are ignored, and never extended, with a one-line
warning. :func:`write_id_records` / :func:`read_id_records` keep whole text-free rows the same way.

Example::

    records = PairScores("results/rerank_distill/records/teacher", "fever", {"weights_sha256": "ab12..."})
    todo = [(q, p) for q, p in pairs if (q, p) not in records.scores]
    records.add([(q, p, s) for (q, p), s in zip(todo, score(todo))])
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from ragsieve.data.jsonl import read_jsonl, write_jsonl
from ragsieve.errors import DataError

log = logging.getLogger(__name__)

__all__ = ["PairScores", "read_id_records", "records_match", "write_id_records"]

META = "meta.json"
#: a shard stops growing past this, one chunk below git's 5 MB limit
MAX_SHARD_BYTES = 4 * 1024 * 1024


def records_match(folder: str | os.PathLike[str], identity: dict[str, Any]) -> bool:
    """True if ``folder``'s records were written for ``identity`` (the meta file is written when absent).

    A mismatch logs one line: the records belong to another scorer or recipe and are not used.

    Example::

        records_match("records/teacher", {"weights_sha256": "ab12..."})
    """
    folder = Path(folder)
    meta = folder / META
    want = json.loads(json.dumps(identity, sort_keys=True))  # what the file would hold (tuples → lists)
    if meta.is_file():
        try:
            have = json.loads(meta.read_text())
        except ValueError:
            have = None
        if have != want:
            log.warning("%s: records of another scorer or recipe (%s, not %s): ignored, not extended; "
                        "delete the folder to record this one", folder, _short(have), _short(want))
            return False
        return True
    folder.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps(want, indent=1, sort_keys=True) + "\n")
    return True


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _readable_rows(path: Path) -> tuple[list[dict], bool]:
    """(rows, intact): a shard cut by a kill yields its complete rows and ``intact = False``."""
    reader = read_jsonl(path, skip_bad=True)
    rows: list[dict] = []
    try:
        for row in reader:
            rows.append(row)
    except DataError:
        return rows, False
    return rows, reader.skipped == 0


class PairScores:
    """One scorer's recorded scores of one dataset's (query id, passage id) pairs (see module doc).

    ``scores`` maps ``(query_id, passage_id)`` to the recorded float; empty when the folder belongs to
    another ``identity`` (then :meth:`add` records nothing).
    """

    def __init__(self, folder: str | os.PathLike[str], dataset: str, identity: dict[str, Any],
                 max_bytes: int = MAX_SHARD_BYTES) -> None:
        self.folder, self.dataset, self.max_bytes = Path(folder), dataset, max_bytes
        self.scores: dict[tuple[str, str], float] = {}
        self.usable = records_match(self.folder, identity)
        if not self.usable:
            return
        for shard in self._shards():
            rows, intact = _readable_rows(shard)
            if not intact:  # rewrite it whole, or the next member appended would sit behind the cut
                write_jsonl(shard, rows)
            for row in rows:
                self.scores[(str(row["query_id"]), str(row["passage_id"]))] = float(row["score"])

    def _shards(self) -> list[Path]:
        return sorted(self.folder.glob(f"{self.dataset}.*.jsonl.gz"))

    def add(self, items: Iterable[tuple[str, str, float]]) -> None:
        """Record ``(query id, passage id, score)`` items: one gzip member, fsynced (a kill loses at most it)."""
        rows = [{"query_id": str(q), "passage_id": str(p), "score": float(s)} for q, p, s in items]
        for row in rows:
            self.scores[(row["query_id"], row["passage_id"])] = row["score"]
        if not self.usable or not rows:
            return
        shards = self._shards()
        shard = shards[-1] if shards else self.folder / f"{self.dataset}.000.jsonl.gz"
        if shard.is_file() and shard.stat().st_size >= self.max_bytes:
            shard = self.folder / f"{self.dataset}.{len(shards):03d}.jsonl.gz"
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows).encode()
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(shard, "ab") as fh:  # concatenated gzip members are one valid gzip stream
            fh.write(gzip.compress(data, mtime=0))
            fh.flush()
            os.fsync(fh.fileno())

    def lookup(self, query_id: str, passage_ids: Sequence[str]) -> list[float] | None:
        """The recorded scores of every passage of one query, or None if any is missing."""
        got = [self.scores.get((str(query_id), str(p))) for p in passage_ids]
        return None if any(s is None for s in got) else [float(s) for s in got]


def write_id_records(folder: str | os.PathLike[str], dataset: str, rows: Sequence[dict],
                     max_bytes: int = MAX_SHARD_BYTES) -> list[Path]:
    """Write text-free rows as ``<folder>/<dataset>.<k>.jsonl.gz`` shards, each written atomically.

    Shards are cut by their uncompressed size (``max_bytes``), so each compressed shard is smaller still.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(f"{dataset}.*.jsonl.gz"):
        old.unlink()
    shards: list[list[dict]] = [[]]
    size = 0
    for row in rows:
        n = len(json.dumps(row)) + 1
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(row)
        size += n
    paths = []
    for k, part in enumerate(shards):
        paths.append(folder / f"{dataset}.{k:03d}.jsonl.gz")
        write_jsonl(paths[-1], part)
    return paths


def read_id_records(folder: str | os.PathLike[str], dataset: str) -> list[dict] | None:
    """The rows :func:`write_id_records` wrote for ``dataset``, or None if none (or a shard is damaged)."""
    shards = sorted(Path(folder).glob(f"{dataset}.*.jsonl.gz"))
    rows: list[dict] = []
    for shard in shards:
        part, intact = _readable_rows(shard)
        if not intact:
            log.warning("%s: damaged record shard: not used", shard)
            return None
        rows += part
    return rows if shards else None
