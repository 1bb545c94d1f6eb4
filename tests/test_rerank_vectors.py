"""Never encode a passage twice (issue #62): index hits carry their stored vector, other text goes through a
bounded per-process cache, and the cosine half of a reranker reads either instead of encoding."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ragsieve.data.records import Passage, stored_vector
from ragsieve.rerank.vectors import PassageVectorCache, vector_key

PASSAGES = [
    Passage("p0", "Hamlet is a tragedy written by William Shakespeare around 1600.", "Hamlet"),
    Passage("p1", "Paris is the capital and largest city of France.", "Paris"),
    Passage("p2", "The quick brown fox jumps over the lazy dog.", ""),
    Passage("p3", "Shakespeare was born in Stratford-upon-Avon in 1564.", "William Shakespeare"),
]


def test_the_cache_is_bounded_least_recently_used_first_and_counts():
    one = np.ones(384, np.float32)  # 1,536 bytes
    cache = PassageVectorCache(max_mb=3 * one.nbytes / 2**20)
    cache.put_many(["a", "b", "c"], [one, one * 2, one * 3])
    assert cache.get_many(["a"])[0][0] == 1  # a is now the most recently used
    cache.put_many(["d"], [one * 4])  # over the bound: b (least recently used) goes
    got = cache.get_many(["a", "b", "c", "d"])
    assert [None if v is None else int(v[0]) for v in got] == [1, None, 3, 4]
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["entries"], stats["evicted"]) == (4, 1, 3, 1)
    assert not cache.get_many(["a"])[0].flags.writeable  # a caller cannot change what others read
    assert PassageVectorCache(0).put_many(["x"], [one]) is None and PassageVectorCache(0).stats()["entries"] == 0
    assert vector_key("m|torch", "x") != vector_key("m|openvino", "x")


def test_the_cache_survives_concurrent_writers_and_readers():
    cache = PassageVectorCache(max_mb=0.05)
    errors = []

    def work(seed: int) -> None:
        try:
            for i in range(300):
                key = str((seed * 7 + i) % 50)
                cache.put_many([key], [np.full(384, float(key), np.float32)])
                got = cache.get_many([key])[0]
                assert got is None or got[0] == float(key)
        except Exception as exc:  # noqa: BLE001 - collected for the main thread's assert
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors and cache.stats()["bytes"] <= cache.max_bytes


@pytest.fixture(scope="module")
def cosine():
    from ragsieve.rerank.neural import BiEncoderRanker

    return BiEncoderRanker()


@pytest.mark.integration
def test_index_hits_carry_the_vector_the_cosine_reads_instead_of_encoding(cosine, tmp_path):
    from ragsieve.retrieve.dense import DenseRetriever
    from ragsieve.retrieve.hybrid import HybridRetriever

    # both on torch fp32, as this ranker encodes (the shipped default's cosine and the index's default backend
    # agree as well: tests/test_index_backends.py)
    dense = DenseRetriever.build(PASSAGES, exact=True, show_progress=False, encoder_backend="torch")
    hybrid = HybridRetriever.build(PASSAGES, exact=True, show_progress=False, encoder_backend="torch")
    for retriever in (dense, hybrid):
        hits = retriever.search("who wrote hamlet", k=4)
        assert all(stored_vector(h.passage, dense.encoder_spec) is not None for h in hits)
    hits = dense.search("who wrote hamlet", k=4)
    before = cosine.encoded_passages
    from_index = cosine.score("who wrote hamlet", [h.passage for h in hits])
    assert cosine.encoded_passages == before  # nothing encoded: every vector came from the index
    encoded = PassageVectorCache(0)
    from ragsieve.rerank.neural import BiEncoderRanker

    fresh = BiEncoderRanker(vector_cache=encoded).score("who wrote hamlet", [Passage(h.passage.id, h.passage.text,
                                                                                  h.passage.title) for h in hits])
    assert np.abs(from_index - fresh).max() < 1e-5  # the index and the reranker encode alike (both torch fp32)


@pytest.mark.integration
def test_a_second_request_over_the_same_documents_encodes_nothing(cosine):
    texts = ["Hamlet is a play by Shakespeare.", "Paris is in France.", "A fox jumps."]
    first = cosine.score("who wrote hamlet", texts)
    encoded = cosine.encoded_passages
    second = cosine.score("who is the author of hamlet", texts)
    assert cosine.encoded_passages == encoded and cosine.vector_stats()["cache_hits"] >= 3
    assert first.shape == second.shape == (3,)


@pytest.mark.integration
def test_the_cascade_cross_encodes_the_cosine_top_and_ranks_the_rest_below_in_cosine_order(cosine):
    from ragsieve.registry import load_reranker
    from ragsieve.rerank.cascade import CascadeRanker

    query = "who wrote hamlet shakespeare"
    mix = load_reranker("embedded:base", whole_passages=False)  # pointwise: a pair's score ignores the others
    cosine = mix.cosine
    full = mix.score(query, PASSAGES)
    assert np.allclose(CascadeRanker(mix, top=len(PASSAGES)).score(query, PASSAGES), full, atol=1e-3)  # all on top: the mix
    cos = cosine.score(query, PASSAGES)
    two = CascadeRanker(mix, top=2).score(query, PASSAGES)
    top = np.argsort(-cos, kind="stable")[:2]
    rest = np.argsort(-cos, kind="stable")[2:]
    assert np.allclose(two[top], full[top], atol=1e-3)  # the cosine's best two keep the full score
    assert two[rest].max() < two[top].min()  # the rest below them ...
    assert list(np.argsort(-two[rest])) == list(range(len(rest)))  # ... in cosine order
    queries = [query] * 4 + ["paris france"] * 4  # one call, two queries: each gets its own top 2
    both = CascadeRanker(mix, top=2).score_pairs(queries, PASSAGES + PASSAGES)
    assert np.allclose(both[:4], two, atol=1e-3)


def test_cascade_specs_resolve_in_the_registry_and_refuse_bad_sizes():
    from ragsieve.errors import RagsieveError
    from ragsieve.registry import load_reranker
    from ragsieve.rerank.cascade import CascadeRanker
    from ragsieve.rerank.lexical import BM25Ranker

    ranker = load_reranker("cascade:3:bm25", whole_passages=False)
    assert isinstance(ranker, CascadeRanker) and ranker.top == 3 and isinstance(ranker.cross, BM25Ranker)
    for bad in ("cascade:0", "cascade:x", "cascade:"):
        with pytest.raises(RagsieveError, match="cascade"):
            load_reranker(bad)


@pytest.mark.integration
def test_the_cascade_chooses_among_passages_not_chunks_and_reads_the_chosen_by_best_chunk():
    """A long passage is one candidate: the cascade (no window of its own, so nothing wraps it in best-chunk
    reading) cross-encodes its top n passages as the default reads them, by their best window-sized chunk."""
    from ragsieve.registry import load_reranker
    from ragsieve.rerank.cascade import CascadeRanker

    query = "who wrote hamlet shakespeare"
    filler = " ".join(["The weather in the valley was mild that year and the harvest was good."] * 40)
    long_passage = filler + " Hamlet is a tragedy written by William Shakespeare around 1600."
    passages = PASSAGES + [long_passage]
    fast = load_reranker("embedded:fast")
    assert isinstance(fast, CascadeRanker) and not fast.pointwise  # not wrapped: it reads long passages itself
    default = load_reranker("embedded:base")  # reads the long passage by its best chunk
    everyone = CascadeRanker(load_reranker("embedded:base"), top=len(passages))
    assert np.allclose(everyone.score(query, passages), default.score(query, passages), atol=1e-3)
