"""Tests for ragsieve.retrieve: BM25, dense, hybrid (RRF) and on-disk indexes.

Unit tests use a tiny randomly initialised BERT sentence-transformer (built once per session
from the MiniLM tokenizer); one integration test uses the real embedded all-MiniLM-L6-v2.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.retrieve import (
    BM25Retriever,
    DenseRetriever,
    Hit,
    HybridRetriever,
    Retriever,
    build_index,
    load_index,
)
from ragsieve.retrieve.hybrid import rrf_fuse

TINY_MAX_SEQ = 32

PASSAGES = [
    Passage("p00", "Alexander Fleming discovered penicillin in 1928 at St Mary's Hospital.", "Penicillin"),
    Passage("p01", "The Eiffel Tower is a wrought-iron lattice tower in Paris, France.", "Eiffel Tower"),
    Passage("p02", "Photosynthesis converts light energy into chemical energy in plants.", "Photosynthesis"),
    Passage("p03", "The Great Wall of China stretches across northern China.", "Great Wall"),
    Passage("p04", "Mount Everest is Earth's highest mountain above sea level.", "Everest"),
    Passage("p05", "Zanzibarite is a made-up mineral used only in this unit test.", ""),
    Passage("p06", "The mitochondrion is the powerhouse of the cell, producing ATP.", "Mitochondrion"),
    Passage("p07", "William Shakespeare wrote Hamlet around the year 1600.", "Hamlet"),
    Passage("p08", "The Pacific Ocean is the largest and deepest ocean on Earth.", "Pacific Ocean"),
    Passage("p09", "Insulin is a hormone that regulates blood glucose levels.", "Insulin"),
    Passage("p10", "The Amazon rainforest covers much of the Amazon basin in South America.", "Amazon"),
    Passage("p11", "Marie Curie won Nobel Prizes in both physics and chemistry.", "Marie Curie"),
]
QUERIES = ["who discovered penicillin", "tallest mountain on earth", "zanzibarite mineral", "who wrote hamlet"]


@pytest.fixture(scope="session")
def tiny_encoder_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-layer, 32-d random BERT with the MiniLM WordPiece vocab, saved as a sentence-transformer."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from ragsieve.models.encoder import resolve_encoder_path

    root = tmp_path_factory.mktemp("tiny_encoder")
    hf_dir, st_dir = root / "hf", root / "st"
    tokenizer = BertTokenizerFast.from_pretrained(resolve_encoder_path("embedded:all-minilm-l6-v2"))
    tokenizer.model_max_length = TINY_MAX_SEQ
    tokenizer.save_pretrained(hf_dir)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    BertModel(config).save_pretrained(hf_dir)
    transformer = Transformer(str(hf_dir))
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "mean")], device="cpu")
    model.save(str(st_dir))
    return str(st_dir)


def _ids(hits: list[Hit]) -> list[str]:
    return [h.passage.id for h in hits]


def _clustered_vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((8, dim))
    x = centres[rng.integers(0, 8, n)] + 0.5 * rng.standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


# -- BM25 -------------------------------------------------------------------------------------


def test_bm25_finds_exact_term_passage() -> None:
    bm25 = BM25Retriever.build(PASSAGES)
    hits = bm25.search("zanzibarite", k=3)
    assert _ids(hits) == ["p05"]  # only passage sharing a term; zero-score passages are not hits
    assert hits[0].rank == 0 and hits[0].score > 0
    top = bm25.search("Who discovered penicillin?", k=5)
    assert top[0].passage.id == "p00"
    assert [h.rank for h in top] == list(range(len(top)))
    assert all(a.score >= b.score for a, b in zip(top, top[1:]))
    assert bm25.search("the of and", k=5) == []  # stopwords only: nothing matches


def test_bm25_over_stopword_only_passages_scores_zero_instead_of_failing() -> None:
    bm25 = BM25Retriever.build([Passage("p0", "a"), Passage("p1", "the of")])
    assert bm25.scores("who wrote hamlet").tolist() == [0.0, 0.0]
    assert bm25.search("a", k=2) == []


# -- search contract ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def retrievers(tiny_encoder_path: str) -> dict[str, Retriever]:
    bm25 = BM25Retriever.build(PASSAGES)
    dense = DenseRetriever.build(PASSAGES, encoder_spec=tiny_encoder_path, show_progress=False, batch_size=4)
    return {"bm25": bm25, "dense": dense, "hybrid": HybridRetriever(bm25, dense, rrf_k=60, depth=100)}


@pytest.mark.parametrize("kind", ["bm25", "dense", "hybrid"])
def test_empty_query_and_bad_k(retrievers: dict[str, Retriever], kind: str) -> None:
    r = retrievers[kind]
    for bad in ("", "   \n\t"):
        with pytest.raises(RagsieveError, match="empty query"):
            r.search(bad)
        with pytest.raises(RagsieveError, match="empty query"):
            r.search_batch(["fine", bad])
    for k in (0, -3):
        with pytest.raises(RagsieveError, match="k must be a positive integer"):
            r.search("penicillin", k=k)


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_k_bigger_than_pool_returns_all(retrievers: dict[str, Retriever], kind: str) -> None:
    hits = retrievers[kind].search("penicillin", k=1000)
    assert len(hits) == len(PASSAGES)
    assert sorted(_ids(hits)) == sorted(p.id for p in PASSAGES)
    assert [h.rank for h in hits] == list(range(len(PASSAGES)))
    # BM25 returns every *matching* passage, never more than the pool
    assert 0 < len(retrievers["bm25"].search("the earth ocean mountain", k=1000)) <= len(PASSAGES)


def test_dense_batch_matches_single(retrievers: dict[str, Retriever]) -> None:
    dense = retrievers["dense"]
    batch = dense.search_batch(QUERIES, k=5)
    for q, hits in zip(QUERIES, batch):
        single = dense.search(q, k=5)
        assert _ids(single) == _ids(hits)
        np.testing.assert_allclose([h.score for h in single], [h.score for h in hits], rtol=1e-4, atol=1e-5)


# -- RRF ------------------------------------------------------------------------------------


def _hits(ids: list[str]) -> list[Hit]:
    return [Hit(Passage(i, f"text {i}"), score=1.0 - r / 10, rank=r) for r, i in enumerate(ids)]


def test_rrf_arithmetic_hand_example() -> None:
    fused = rrf_fuse([_hits(["a", "b", "c"]), _hits(["c", "a", "d"])], rrf_k=60)
    expected = {"a": 1 / 61 + 1 / 62, "c": 1 / 63 + 1 / 61, "b": 1 / 62, "d": 1 / 63}
    assert _ids(fused) == ["a", "c", "b", "d"]
    for h in fused:
        assert h.score == pytest.approx(expected[h.passage.id], abs=1e-12)
    assert [h.rank for h in fused] == [0, 1, 2, 3]
    assert _ids(rrf_fuse([_hits(["a", "b", "c"]), _hits(["c", "a", "d"])], rrf_k=60, k=2)) == ["a", "c"]
    # equal fused scores: ordered by passage id, whatever the input order
    assert _ids(rrf_fuse([_hits(["z", "y"]), _hits(["y", "z"])], rrf_k=0)) == ["y", "z"]
    assert _ids(rrf_fuse([_hits(["m"]), _hits(["k"])], rrf_k=60)) == ["k", "m"]


def test_hybrid_scores_are_rrf_of_parts(retrievers: dict[str, Retriever]) -> None:
    hybrid = retrievers["hybrid"]
    assert isinstance(hybrid, HybridRetriever)
    q = "who discovered penicillin"
    ranks_bm25 = {h.passage.id: h.rank for h in hybrid.bm25.search(q, k=100)}
    ranks_dense = {h.passage.id: h.rank for h in hybrid.dense.search(q, k=100)}
    for h in hybrid.search(q, k=len(PASSAGES)):
        want = sum(1 / (60 + r[h.passage.id] + 1) for r in (ranks_bm25, ranks_dense) if h.passage.id in r)
        assert h.score == pytest.approx(want, rel=1e-9)


# -- dense / faiss ----------------------------------------------------------------------------


def test_hnsw_agrees_with_exact_on_small_set() -> None:
    vecs = _clustered_vectors(600, 32)
    passages = [Passage(f"v{i:04d}", f"vector {i}") for i in range(len(vecs))]
    exact = DenseRetriever.build(passages, embeddings=vecs, exact=True)
    hnsw = DenseRetriever.build(passages, embeddings=vecs, exact=False, m=16, ef_construction=100, ef_search=64)
    assert exact.ef_search is None and hnsw.ef_search == 64
    queries = _clustered_vectors(50, 32, seed=1)
    got, want = hnsw.search_vectors(queries, k=10), exact.search_vectors(queries, k=10)
    recall = np.mean([len(set(_ids(g)) & set(_ids(w))) / 10 for g, w in zip(got, want)])
    assert recall >= 0.98
    # exact scores are cosine similarities
    np.testing.assert_allclose(want[0][0].score, float(queries[0] @ vecs[int(want[0][0].passage.id[1:])]), rtol=1e-5)


def test_injected_embeddings_validated() -> None:
    with pytest.raises(RagsieveError, match="shape"):
        DenseRetriever.build(PASSAGES, embeddings=np.ones((3, 8), dtype=np.float32))


def test_truncation_count(tiny_encoder_path: str, caplog: pytest.LogCaptureFixture) -> None:
    long = " ".join(["penicillin"] * 3 * TINY_MAX_SEQ)
    passages = PASSAGES[:4] + [Passage(f"long{i}", long) for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="ragsieve.retrieve.dense"):
        dense = DenseRetriever.build(passages, encoder_spec=tiny_encoder_path, show_progress=False)
    assert dense.truncated_count == 3
    assert any("3 of 7 passages" in r.getMessage() for r in caplog.records)
    short = DenseRetriever.build(PASSAGES[:4], encoder_spec=tiny_encoder_path, show_progress=False)
    assert short.truncated_count == 0
    assert DenseRetriever.build(PASSAGES[:2], embeddings=np.eye(2, 4)).truncated_count is None


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
def test_add_counts_the_truncated_new_passages(tiny_encoder_path: str, tmp_path: Path, kind: str) -> None:
    from ragsieve.retrieve import add_to_index
    from ragsieve.retrieve.index import read_manifest

    long = " ".join(["penicillin"] * 3 * TINY_MAX_SEQ)
    out = tmp_path / kind
    build_index([*PASSAGES[:4], Passage("long0", long)], out, kind=kind, encoder_spec=tiny_encoder_path,
                show_progress=False)
    assert load_index(out).truncated_count == 1
    add_to_index(out, [Passage("long1", long), PASSAGES[4], Passage("long2", long)])
    assert load_index(out).truncated_count == 3  # the index's count, not unknown (None) after an add
    assert "truncated_count" not in read_manifest(out)["options"]  # a count, not a build option


# -- persistence ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bm25", "dense", "hybrid"])
def test_index_round_trip(tiny_encoder_path: str, tmp_path: Path, kind: str) -> None:
    built = build_index(PASSAGES, tmp_path / "idx", kind=kind, encoder_spec=tiny_encoder_path, show_progress=False) if kind != "bm25" else build_index(PASSAGES, tmp_path / "idx", kind=kind)
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["kind"] == kind and manifest["n_passages"] == len(PASSAGES) and manifest["format_version"] == 1
    assert {"encoder", "created", "options"} <= set(manifest)
    assert (tmp_path / "idx" / "passages.jsonl").exists()
    loaded = load_index(tmp_path / "idx")
    assert type(loaded) is type(built) and loaded.kind == kind
    assert loaded.passages == PASSAGES
    if kind == "dense":
        assert loaded._encoder is None  # encoder loads only when a query is encoded
    for q in QUERIES:
        a, b = built.search(q, k=5), loaded.search(q, k=5)
        assert _ids(a) == _ids(b)
        np.testing.assert_allclose([h.score for h in a], [h.score for h in b], rtol=1e-5)


@pytest.mark.parametrize("cls", [BM25Retriever, DenseRetriever])
def test_retriever_save_load(tmp_path: Path, cls: type[Retriever]) -> None:
    vecs = _clustered_vectors(len(PASSAGES), 16)
    r = cls.build(PASSAGES, embeddings=vecs) if cls is DenseRetriever else cls.build(PASSAGES)
    r.save(tmp_path / "r")
    r2 = cls.load(tmp_path / "r")
    assert r2.passages == PASSAGES
    if isinstance(r, DenseRetriever):
        assert r2.ef_search == r.ef_search and r2.encoder_spec == r.encoder_spec
        assert _ids(r.search_vectors(vecs[:3], 4)[2]) == _ids(r2.search_vectors(vecs[:3], 4)[2])
    else:
        assert _ids(r.search("penicillin mountain", 4)) == _ids(r2.search("penicillin mountain", 4))


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def test_atomic_build_leaves_nothing_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the build itself fails
    with pytest.raises(RagsieveError):
        build_index(PASSAGES, tmp_path / "idx", kind="dense", embeddings=np.ones((2, 4)))
    assert _leftovers(tmp_path) == []

    # writing fails half-way: some files already written into the temporary folder
    def broken_save(self: DenseRetriever, path: Path, *, with_passages: bool = True) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "index.faiss").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(DenseRetriever, "save", broken_save)
    vecs = _clustered_vectors(len(PASSAGES), 16)
    with pytest.raises(OSError, match="disk full"):
        build_index(PASSAGES, tmp_path / "idx", kind="hybrid", embeddings=vecs)
    assert _leftovers(tmp_path) == []

    # an existing index survives a failed overwrite untouched
    build_index(PASSAGES, tmp_path / "old", kind="bm25")
    before = sorted(p.name for p in (tmp_path / "old").rglob("*"))
    with pytest.raises(OSError):
        build_index(PASSAGES, tmp_path / "old", kind="dense", embeddings=vecs, overwrite=True)
    assert _leftovers(tmp_path) == ["old"]
    assert sorted(p.name for p in (tmp_path / "old").rglob("*")) == before
    assert load_index(tmp_path / "old").kind == "bm25"


def test_build_index_errors(tmp_path: Path) -> None:
    dup = PASSAGES[:3] + [Passage("p01", "another text with the same id")]
    with pytest.raises(RagsieveError, match="duplicate passage id 'p01'"):
        build_index(dup, tmp_path / "idx", kind="bm25")
    with pytest.raises(RagsieveError, match="unknown index kind 'sparse'"):
        build_index(PASSAGES, tmp_path / "idx", kind="sparse")
    build_index(PASSAGES, tmp_path / "idx", kind="bm25")
    with pytest.raises(RagsieveError, match="already exists"):
        build_index(PASSAGES, tmp_path / "idx", kind="bm25")
    rebuilt = build_index(PASSAGES[:5], tmp_path / "idx", kind="bm25", overwrite=True)
    assert len(load_index(tmp_path / "idx").passages) == len(rebuilt.passages) == 5
    assert _leftovers(tmp_path) == ["idx"]


def test_load_index_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "empty", tmp_path / "missing"):
        with pytest.raises(RagsieveError, match="not a ragsieve index") as err:
            load_index(path)
        assert "\n" not in str(err.value)
    build_index(PASSAGES, tmp_path / "idx", kind="bm25")
    manifest_path = tmp_path / "idx" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "kind": "colbert"}))
    with pytest.raises(RagsieveError, match="unknown index kind 'colbert'") as err:
        load_index(tmp_path / "idx")
    assert "\n" not in str(err.value)


def test_import_is_cheap() -> None:
    code = "import sys, ragsieve.retrieve; print(sorted(m for m in ('torch', 'faiss', 'bm25s', 'sentence_transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1])
    assert out.stdout.strip() == "[]"


# -- integration: the real embedded MiniLM ----------------------------------------------------


@pytest.mark.integration
def test_minilm_integration(tmp_path: Path) -> None:
    from ragsieve.errors import ModelNotAvailable

    try:
        from ragsieve.models.encoder import resolve_encoder_path

        resolve_encoder_path("embedded:all-minilm-l6-v2")
    except ModelNotAvailable as exc:
        pytest.skip(str(exc))
    hybrid = build_index(PASSAGES, tmp_path / "idx", kind="hybrid", show_progress=False)
    assert isinstance(hybrid, HybridRetriever) and hybrid.dense.dim == 384
    cases = {
        "Who discovered penicillin?": "p00",
        "What is the highest mountain in the world?": "p04",
        "Which organelle makes ATP for the cell?": "p06",
        "Who is the author of Hamlet?": "p07",
    }
    for query, gold in cases.items():
        dense_hits = hybrid.dense.search(query, k=len(PASSAGES))
        assert dense_hits[0].passage.id == gold, query
        # the relevant passage is clearly more similar than the irrelevant ones
        assert dense_hits[0].score > max(h.score for h in dense_hits[1:]) + 0.05
        assert hybrid.search(query, k=3)[0].passage.id == gold, query
    # the saved index answers the same way, encoder loaded lazily from the spec
    loaded = load_index(tmp_path / "idx")
    assert _ids(loaded.search("Who discovered penicillin?", k=5)) == _ids(hybrid.search("Who discovered penicillin?", k=5))


def test_bm25s_logger_stays_quiet_after_its_lazy_import():
    import logging

    from ragsieve.data.records import Passage
    from ragsieve.retrieve.bm25 import BM25Retriever

    BM25Retriever.build([Passage("p1", "Fleming discovered penicillin.")]).search("penicillin", k=1)
    assert logging.getLogger("bm25s").getEffectiveLevel() >= logging.WARNING
