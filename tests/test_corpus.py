"""Your own corpus: files and folders in, chunked passages with stable ids, indexes you can extend."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ragsieve.errors import DataError, RagsieveError
from ragsieve.retrieve import ChunkConfig, add_to_index, build_index, load_index, read_corpus

LONG = " ".join(f"Sentence number {i} talks about topic {i % 7}." for i in range(120))


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "guide.md").write_text("# Install guide\n\nRun make demo, then make test.\n", encoding="utf-8")
    (root / "sub" / "long.txt").write_text(LONG, encoding="utf-8")
    (root / "faq.jsonl").write_text(
        json.dumps({"id": "q1", "text": "Ragsieve filters retrieved passages.", "title": "FAQ", "metadata": {"lang": "en"}})
        + "\n" + json.dumps({"text": "A row without an id gets file:line."}) + "\n", encoding="utf-8")
    (root / "ignored.csv").write_text("a,b\n")
    return root


def test_read_corpus_chunks_with_stable_ids_and_provenance(corpus):
    passages = read_corpus([corpus], ChunkConfig(chunk_tokens=64, overlap_tokens=16))
    by_doc: dict[str, list] = {}
    for p in passages:
        by_doc.setdefault(p.meta["doc_id"], []).append(p)
    assert set(by_doc) == {"faq:2", "q1", "guide.md", "sub/long.txt"}
    guide = by_doc["guide.md"][0]
    assert guide.id == "guide.md" and guide.title == "Install guide"
    assert by_doc["q1"][0].meta["metadata"] == {"lang": "en"} and by_doc["q1"][0].meta["source"].endswith("faq.jsonl:1")
    chunks = by_doc["sub/long.txt"]
    assert len(chunks) > 3 and all(p.id == f"sub/long.txt#{p.meta['start']}-{p.meta['end']}" for p in chunks)
    assert all(LONG[p.meta["start"] : p.meta["end"]].strip() == p.text for p in chunks)
    assert all(a.meta["end"] > b.meta["start"] for a, b in zip(chunks, chunks[1:]))  # neighbours overlap
    assert chunks[-1].meta["end"] == len(LONG.rstrip())
    assert read_corpus([corpus], ChunkConfig(chunk_tokens=64, overlap_tokens=16)) == passages  # stable
    whole = read_corpus([corpus / "sub" / "long.txt"], ChunkConfig(chunk_tokens=0))
    assert [p.id for p in whole] == ["long.txt"] and whole[0].text == LONG


@pytest.mark.parametrize("name, content, message", [
    ("latin1.txt", "caf\xe9".encode("latin-1"), r"latin1.txt:1: invalid UTF-8 \(byte 0xE9 at byte offset 3\)"),
    ("empty.md", b"  \n", "empty.md: empty file"),
    ("empty.jsonl", b"", "empty.jsonl: empty file"),
    ("rows.jsonl", b'{"id": "a", "text": "ok"}\n{"id": "b", "title": "no text"}\n', r"rows.jsonl:2: .*'text'"),
    ("dupes.jsonl", b'{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', r"dupes.jsonl:2: duplicate id 'a'"),
    ("table.csv", b"a,b\n", "must be .jsonl"),
])
def test_bad_corpus_files_are_one_line(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=message) as info:
        read_corpus([tmp_path / name], ChunkConfig(chunk_tokens=0))
    assert "\n" not in str(info.value)


def test_empty_folder_and_bad_chunking_are_refused(tmp_path):
    with pytest.raises(DataError, match="no .jsonl"):
        read_corpus([tmp_path])
    from ragsieve.config import build_config

    with pytest.raises(RagsieveError, match="overlap_tokens"):
        build_config(ChunkConfig, {"chunk_tokens": 10, "overlap_tokens": 10})


def test_index_passages_then_add_encodes_only_the_new(tmp_path, corpus, cli):
    out = tmp_path / "idx"
    result = cli("index", "--out", out, "--passages", corpus, "--kind", "hybrid", "--chunk-tokens", "64")
    assert result.code == 0, result.err
    before = load_index(out)
    old_vectors = before.dense.embeddings.copy()
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"id": "new", "text": "Zebras graze on the savanna grass."}) + "\n")
    result = cli("index", "--out", out, "--passages", extra, "--add")
    assert result.code == 0 and "added 1 passages" in result.out
    after = load_index(out)
    assert len(after.passages) == len(before.passages) + 1
    np.testing.assert_allclose(after.dense.embeddings[: len(old_vectors)], old_vectors, atol=1e-6)  # reused
    assert after.search("zebra savanna", k=1)[0].passage.id == "new"
    assert after.passages[0].meta  # provenance survives the index round trip
    again = cli("index", "--out", out, "--passages", extra, "--add")
    assert again.code == 2 and "already in the index" in again.err


def test_add_to_bm25_index_keeps_ids_unique(tmp_path):
    from ragsieve.data.records import Passage

    build_index([Passage("a", "apples are red")], tmp_path / "i", kind="bm25")
    add_to_index(tmp_path / "i", [Passage("b", "bananas are yellow")])
    assert load_index(tmp_path / "i").search("yellow bananas", k=1)[0].passage.id == "b"
