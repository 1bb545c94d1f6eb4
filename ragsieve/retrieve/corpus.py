"""Your own corpus as passages: files in, token-sized chunks with stable ids out.

Accepted inputs (any mix, folders searched recursively in sorted order):

* ``.jsonl`` / ``.jsonl.gz`` rows ``{"id"?, "text", "title"?, "metadata"?}`` — one document
  per row (``id`` defaults to ``<file stem>:<line>``);
* ``.txt`` / ``.md`` files — one document per file (id = the path relative to the folder
  given, title = the first Markdown heading or the file name).

Each document is cut into windows of ``chunk_tokens`` tokens of the retrieval encoder's
tokenizer, overlapping by ``overlap_tokens``. A chunk's id is ``<doc id>#<start>-<end>``
(character offsets into the document), so it stays the same when other documents change,
and its ``meta`` keeps the source file, the offsets and the row's ``metadata``.
Bad input is one line naming the file (and line): bytes that are not UTF-8, an empty
file, a row without ``text``, two documents with one id.

Example::

    passages = read_corpus(["docs/", "faq.jsonl"], ChunkConfig(chunk_tokens=200, overlap_tokens=40))
    build_index(passages, "index/mine", kind="hybrid")
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from ragsieve.config import StrictConfig
from ragsieve.data.records import Passage
from ragsieve.errors import DataError
from ragsieve.models.specs import DEFAULT_ENCODER

DOCUMENT_SUFFIXES = (".jsonl", ".jsonl.gz", ".txt", ".md")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.M)


class ChunkConfig(StrictConfig):
    """How documents become passages; ``chunk_tokens = 0`` keeps every document whole."""

    chunk_tokens: int = Field(200, ge=0, description="tokens per chunk (0 = no chunking)")
    overlap_tokens: int = Field(40, ge=0, description="tokens shared by neighbouring chunks")
    tokenizer: str = DEFAULT_ENCODER  # an encoder spec: chunks fit what the dense retriever reads

    @model_validator(mode="after")
    def _overlap_below_chunk(self) -> "ChunkConfig":
        if self.chunk_tokens and self.overlap_tokens >= self.chunk_tokens:
            raise ValueError(f"overlap_tokens ({self.overlap_tokens}) must be below chunk_tokens ({self.chunk_tokens})")
        return self


@dataclass(frozen=True)
class Document:
    """One source document before chunking."""

    id: str
    text: str
    title: str
    source: str  # file (and line for jsonl rows)
    metadata: dict[str, Any]


def iter_files(paths: Sequence[str | Path]) -> Iterator[tuple[Path, Path]]:
    """``(file, root)`` for every document file under ``paths`` (a folder is searched recursively)."""
    if not paths:
        raise DataError("give at least one passages file or folder")
    for raw in paths:
        path = Path(raw).expanduser()
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(DOCUMENT_SUFFIXES))
            if not found:
                raise DataError(f"{path}: no {', '.join(DOCUMENT_SUFFIXES)} files in this folder")
            for file in found:
                yield file, path
        elif not path.exists():
            raise DataError(f"{path}: passages file not found")
        elif not path.name.lower().endswith(DOCUMENT_SUFFIXES):
            raise DataError(f"{path}: passages must be {', '.join(DOCUMENT_SUFFIXES)} (or a folder of them)")
        else:
            yield path, path.parent


def read_documents(paths: Sequence[str | Path]) -> list[Document]:
    """Every document in ``paths``; duplicate ids are refused, naming both places."""
    from ragsieve.data.jsonl import read_jsonl
    from ragsieve.text_input import read_text

    docs: list[Document] = []
    seen: dict[str, str] = {}

    def add(doc: Document) -> None:
        if doc.id in seen:
            raise DataError(f"{doc.source}: duplicate id '{doc.id}' (first seen at {seen[doc.id]}); ids must be unique")
        seen[doc.id] = doc.source
        docs.append(doc)

    for file, root in iter_files(paths):
        name = file.name.lower()
        if name.endswith((".txt", ".md")):
            text = read_text(file, "passages")
            if not text.strip():
                raise DataError(f"{file}: empty file")
            heading = _HEADING.search(text) if name.endswith(".md") else None
            title = heading.group(1) if heading else file.stem
            add(Document(file.relative_to(root).as_posix(), text, title, str(file), {}))
            continue
        rows = 0
        for lineno, row in read_jsonl(file).numbered():
            rows += 1
            where = f"{file}:{lineno}"
            text = row.get("text") if isinstance(row, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise DataError(f"{where}: a passage row needs a non-empty 'text' string")
            metadata = row.get("metadata") or {}
            if not isinstance(metadata, dict):
                raise DataError(f"{where}: 'metadata' must be an object")
            doc_id = str(row["id"]) if row.get("id") not in (None, "") else f"{file.stem}:{lineno}"
            add(Document(doc_id, text, str(row.get("title") or ""), where, metadata))
        if rows == 0:
            raise DataError(f"{file}: empty file")
    return docs


class Chunker:
    """Token windows over a document, cut at the tokenizer's character offsets."""

    def __init__(self, config: ChunkConfig):
        self.config = config
        self._tokenizer = None
        if config.chunk_tokens:
            from transformers import AutoTokenizer

            from ragsieve.models.encoder import resolve_encoder_path

            self._tokenizer = AutoTokenizer.from_pretrained(str(resolve_encoder_path(config.tokenizer)))

    def spans(self, text: str) -> list[tuple[int, int]]:
        """``(start, end)`` character spans of the chunks, in order."""
        if self._tokenizer is None:
            return [(0, len(text))]
        offsets = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        if not offsets:
            return [(0, len(text))]
        size, step = self.config.chunk_tokens, self.config.chunk_tokens - self.config.overlap_tokens
        spans = []
        for lo in range(0, len(offsets), step):
            window = offsets[lo : lo + size]
            spans.append((window[0][0], window[-1][1]))
            if lo + size >= len(offsets):
                break
        return spans

    def chunk(self, doc: Document) -> list[Passage]:
        spans = self.spans(doc.text)
        out = []
        for start, end in spans:
            meta = {"source": doc.source, "doc_id": doc.id, "start": start, "end": end}
            if doc.metadata:
                meta["metadata"] = doc.metadata
            pid = doc.id if len(spans) == 1 else f"{doc.id}#{start}-{end}"
            out.append(Passage(pid, doc.text[start:end].strip(), doc.title, meta))
        return out


def read_corpus(paths: Sequence[str | Path], config: ChunkConfig | None = None) -> list[Passage]:
    """Documents from ``paths`` cut into passages (see the module doc)."""
    chunker = Chunker(config or ChunkConfig())
    return [p for doc in read_documents(paths) for p in chunker.chunk(doc)]
