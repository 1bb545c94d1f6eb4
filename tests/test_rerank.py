from __future__ import annotations

import json

import numpy as np
import pytest

from ragsieve.data.records import Passage
from ragsieve.errors import ModelNotAvailable, RagsieveError
from ragsieve.rerank import BaseRanker
from ragsieve.registry import load_reranker
from tests.conftest import requires_data

POOL = [
    Passage("p0", "Paris is the capital of France."),
    Passage("p1", "Hamlet is a tragedy written by William Shakespeare."),
    Passage("p2", "Foxes are small omnivorous mammals."),
]


class _LengthRanker(BaseRanker):
    name = "length"

    def score(self, query, passages):
        return np.array([float(len(p.text) % 3) for p in passages])


def test_rank_keeps_indices_duplicates_and_stable_ties():
    passages = ["aaa", "bb", "aaa", "c"]  # scores 0, 2, 0, 1 → order 1, 3, 0, 2 (ties by input order)
    res = _LengthRanker().rank("q", passages)
    assert [r.index for r in res.results] == [1, 3, 0, 2]
    assert [r.rank for r in res.results] == [0, 1, 2, 3]
    assert [r.passage.text for r in res.results].count("aaa") == 2
    assert [r.index for r in res.top_k(2)] == [1, 3]
    assert len(_LengthRanker().rank("q", [])) == 0  # empty list → empty result, not an error
    with pytest.raises(RagsieveError, match="empty query"):
        _LengthRanker().rank("  ", passages)
    with pytest.raises(RagsieveError, match="expected Passage or str"):
        _LengthRanker().rank("q", [3])


def test_bm25_ranker_and_factory_errors():
    res = load_reranker("bm25").rank("who wrote hamlet", POOL)
    assert res.results[0].passage.id == "p1"
    dup = load_reranker("bm25").rank("hamlet", [POOL[1], POOL[0], POOL[1]])
    assert sorted(r.index for r in dup.results[:2]) == [0, 2]
    with pytest.raises(RagsieveError, match="unknown reranker 'nope'"):
        load_reranker("nope")
    with pytest.raises(ModelNotAvailable, match="cross-encoder needs a model"):
        load_reranker("cross-encoder")


def test_cross_encoder_ranker_matches_sentence_transformers(tiny_cross_encoder_dir):
    from sentence_transformers import CrossEncoder

    ranker = load_reranker(f"cross-encoder:{tiny_cross_encoder_dir}", max_length=64)
    res = ranker.rank("who wrote hamlet", POOL)
    expected = CrossEncoder(str(tiny_cross_encoder_dir), max_length=64).predict(
        [("who wrote hamlet", p.full_text) for p in POOL])
    got = {r.index: r.score for r in res.results}
    np.testing.assert_allclose([got[i] for i in range(3)], expected, rtol=1e-5, atol=1e-6)
    assert [r.score for r in res.results] == sorted((r.score for r in res.results), reverse=True)


@pytest.mark.integration
def test_bi_encoder_ranker_real_minilm():
    res = load_reranker("bi-encoder").rank("who wrote hamlet", POOL)
    assert res.results[0].passage.id == "p1"


def test_group_infonce_equals_softmax_over_own_group(tiny_cross_encoder_dir):
    import torch
    from sentence_transformers.cross_encoder import CrossEncoder

    from ragsieve.rerank.losses import GroupInfoNCELoss

    model = CrossEncoder(str(tiny_cross_encoder_dir), max_length=32, num_labels=1)
    queries = ["who wrote hamlet", "capital of france"]
    columns = [queries, ["Shakespeare wrote Hamlet.", "Paris."], ["Foxes.", "Berlin."], ["Rome.", "Dogs."]]
    tau = 0.5
    loss = GroupInfoNCELoss(model, temperature=tau)(columns, torch.zeros(2))

    def logits(docs):
        inputs = model.preprocess(list(zip(queries, docs)))
        return model(inputs)["scores"].squeeze(1)

    scores = torch.stack([logits(c) for c in columns[1:]], dim=1)  # (batch, 1 + N) — no in-batch negatives
    expected = torch.nn.functional.cross_entropy(scores / tau, torch.zeros(2, dtype=torch.long))
    assert torch.allclose(loss, expected, atol=1e-6)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        GroupInfoNCELoss(model, temperature=0)


def test_group_rows_fill_and_validate():
    from ragsieve.prefs import PreferenceRecord
    from ragsieve.rerank.train import group_rows

    rec = PreferenceRecord("q", ["p1", "p2"], ["n1", "n2"], [0.2, 0.1], [-0.1, -0.3])
    rows = group_rows([rec], group_size=4)
    assert len(rows) == 2 and list(rows[0]) == ["query", "positive", "negative_1", "negative_2", "negative_3"]
    assert {rows[0]["negative_1"], rows[0]["negative_2"]} == {"n1", "n2"}  # own negatives first, then refilled
    with pytest.raises(RagsieveError, match="group_size must be >= 2"):
        group_rows([rec], group_size=1)


def test_train_cross_encoder_moves_scores(tmp_path, tiny_cross_encoder_dir):
    from ragsieve.prefs import PreferenceRecord
    from ragsieve.rerank.train import CrossEncoderTrainConfig, train_cross_encoder

    pos, neg = "Hamlet was written by William Shakespeare.", "Foxes are small mammals."
    recs = [PreferenceRecord(f"who wrote hamlet {i}", [pos], [neg, "Paris is in France."], [0.3], [-0.2, -0.1])
            for i in range(16)]
    before = load_reranker(f"cross-encoder:{tiny_cross_encoder_dir}", max_length=64).score(
        "who wrote hamlet 0", [Passage("a", pos), Passage("b", neg)])
    cfg = CrossEncoderTrainConfig(init=str(tiny_cross_encoder_dir), group_size=3, lr=5e-3, epochs=3,
                                  batch_size=4, max_length=64)
    out = train_cross_encoder(recs, cfg, tmp_path / "ce")
    after = load_reranker(f"cross-encoder:{out}", max_length=64).score(
        "who wrote hamlet 0", [Passage("a", pos), Passage("b", neg)])
    assert (after[0] - after[1]) > (before[0] - before[1])  # the positive moved up relative to the negative


def test_fast_backends_match_predict(tiny_cross_encoder_dir, tmp_path, monkeypatch):
    """Same inputs as CrossEncoder.predict; fp32 ONNX equal, int8 close and rank-preserving here."""
    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path))
    pairs = [("who wrote hamlet", p.full_text) for p in POOL] + [("capital of france", "Paris " * 30)]
    ref = load_reranker(f"cross-encoder:{tiny_cross_encoder_dir}", max_length=64).predict_pairs(pairs)
    for backend, atol in (("onnx", 1e-5), ("torch-int8", 0.05), ("onnx-int8", 0.05)):
        ranker = load_reranker(f"cross-encoder:{tiny_cross_encoder_dir}", max_length=64, batch_size=2,
                               backend=backend)
        np.testing.assert_allclose(ranker.predict_pairs(pairs), ref, atol=atol, err_msg=backend)
    assert (tmp_path / "onnx").is_dir()  # exported once, cached
    with pytest.raises(RagsieveError, match="unknown cross-encoder backend 'gpu'"):
        load_reranker(f"cross-encoder:{tiny_cross_encoder_dir}", backend="gpu")


def test_bare_folder_is_a_cross_encoder(tiny_cross_encoder_dir):
    assert load_reranker(str(tiny_cross_encoder_dir)).name == "cross-encoder"


def test_evaluate_rankers_counts_misses_and_duplicates():
    from ragsieve.rerank.relevance import RankingQuery, evaluate_rankers

    queries = [
        RankingQuery("q1", "who wrote hamlet", tuple(POOL), frozenset({"p1"})),
        # the relevant passage is not among the candidates: a miss for every ranker
        RankingQuery("q2", "capital of france", (POOL[0], POOL[0]), frozenset({"zz"})),
    ]
    out = evaluate_rankers({"bm25": load_reranker("bm25")}, queries, ks=(1, 3), measures=("P", "MRR"))
    assert out["bm25"]["P@1"] == pytest.approx(0.5)
    assert out["bm25"]["MRR@3"] == pytest.approx(0.5)


@requires_data
def test_relevance_groups_and_queries_from_gold_data():
    from ragsieve.data import load_dataset
    from ragsieve.rerank.relevance import RelevanceSource, ranking_queries, split_questions, training_groups

    ds = load_dataset("hotpotqa-distractor")
    source = RelevanceSource(train_questions=5, test_questions=4, positives_per_question=2, test_fraction=0.5)
    train, test = split_questions(ds, source)
    assert len(train) == 5 and len(test) == 4 and not {q.id for q in train} & {q.id for q in test}
    groups = training_groups(ds, train, source, negatives=7)
    by_id = ds.passage_by_id()
    for g, q in zip(groups, train):
        assert len(g.pos) == 2 and len(g.neg) == 7
        assert set(g.pos_ids) <= set(q.gold_passage_ids) and not set(g.neg_ids) & set(q.gold_passage_ids)
        assert g.pos[0] == by_id[g.pos_ids[0]].full_text
    queries = ranking_queries(ds, test, source)
    assert all(len(q.candidates) == 10 and q.relevant for q in queries)

    fever = load_dataset("fever")
    src = RelevanceSource(train_questions=3, test_questions=3)
    _, test = split_questions(fever, src)
    for q in ranking_queries(fever, test, src):
        titles = {p.title for p in q.candidates}
        assert q.relevant & {p.id for p in q.candidates} and len(titles) >= 1


@requires_data
def test_base_reranker_is_trained_once_and_cached(tmp_path, monkeypatch, tiny_cross_encoder_dir):
    from ragsieve.rerank.embedded import BaseRerankerConfig, ensure_base_reranker
    from ragsieve.rerank.relevance import RelevanceSource

    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path))
    cfg = BaseRerankerConfig(
        sources={"hotpotqa-distractor": RelevanceSource(train_questions=4, test_questions=2, test_fraction=0.5)},
        train={"init": str(tiny_cross_encoder_dir), "batch_size": 2, "max_length": 128},
    )
    path = ensure_base_reranker(cfg)
    card = json.loads((path / "ragsieve_base.json").read_text())
    assert card["groups"] == {"hotpotqa-distractor": 4}
    assert not (path / "checkpoints").exists()
    stamp = (path / "ragsieve_base.json").stat().st_mtime_ns
    assert ensure_base_reranker(cfg) == path and (path / "ragsieve_base.json").stat().st_mtime_ns == stamp
    assert load_reranker(f"cross-encoder:{path}").rank("q", ["a", "b"]).results
