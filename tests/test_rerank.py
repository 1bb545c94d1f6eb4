from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from ragsieve.data.records import Passage
from ragsieve.errors import ModelNotAvailable, RagsieveError
from ragsieve.rerank import BaseRanker, as_passages
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
    with pytest.raises(RagsieveError, match="unknown reranker spec 'nope'"):
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

    from ragsieve.rerank.training.losses import GroupInfoNCELoss

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
    from ragsieve.rerank.training.trainer import group_rows

    rec = PreferenceRecord("q", ["p1", "p2"], ["n1", "n2"], [0.2, 0.1], [-0.1, -0.3])
    rows = group_rows([rec], group_size=4)
    assert len(rows) == 2 and list(rows[0]) == ["query", "positive", "negative_1", "negative_2", "negative_3"]
    assert {rows[0]["negative_1"], rows[0]["negative_2"]} == {"n1", "n2"}  # own negatives first, then refilled
    with pytest.raises(RagsieveError, match="group_size must be >= 2"):
        group_rows([rec], group_size=1)


def test_train_cross_encoder_moves_scores(tmp_path, tiny_cross_encoder_dir):
    from ragsieve.prefs import PreferenceRecord
    from ragsieve.rerank.training.trainer import CrossEncoderTrainConfig, train_cross_encoder

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


def test_train_cross_encoder_resumes_after_kill(tmp_path, tiny_cross_encoder_dir):
    """kill -9 mid-training, rerun: it resumes from the last checkpoint and ends with the weights of an
    uninterrupted training; checkpoints of other settings are cleared, not resumed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from safetensors.torch import load_file

    from ragsieve.prefs import PreferenceRecord
    from ragsieve.rerank.training.trainer import TRAINING_CARD, CrossEncoderTrainConfig, train_cross_encoder

    script = tmp_path / "train.py"
    script.write_text(f"""
import sys, time
from transformers import TrainerCallback
from ragsieve.prefs import PreferenceRecord
from ragsieve.rerank.training.trainer import CrossEncoderTrainConfig, train_cross_encoder
recs = [PreferenceRecord(f"who wrote hamlet {{i}}", ["Hamlet was written by William Shakespeare."],
        ["Foxes are small mammals.", "Paris is in France."], [0.3], [-0.2, -0.1]) for i in range(24)]
cfg = CrossEncoderTrainConfig(init={str(tiny_cross_encoder_dir)!r}, group_size=3, lr=5e-3, epochs=2, batch_size=4,
                              max_length=64, distill_weight=1.0, checkpoint_steps=3)
slow = sys.argv[1] == "slow"
if slow:  # slow steps so the parent can kill between two saves
    class Slow(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            time.sleep(0.5)
    import sentence_transformers.cross_encoder as ce
    Base = ce.CrossEncoderTrainer
    class SlowTrainer(Base):
        def __init__(self, *a, callbacks=None, **k):
            super().__init__(*a, callbacks=[*(callbacks or []), Slow()], **k)
    ce.CrossEncoderTrainer = SlowTrainer
train_cross_encoder(recs, cfg, sys.argv[2], checkpoint_dir=sys.argv[3])
""")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    # the uninterrupted reference (its own checkpoint folder), trained beside the run that is killed
    ref_err = (tmp_path / "ref.err").open("w")  # a file: a full pipe would block it
    reference = subprocess.Popen([sys.executable, str(script), "fast", str(tmp_path / "ref"),
                                  str(tmp_path / "ref-ckpt")], env=env, stdout=subprocess.DEVNULL,
                                 stderr=ref_err)
    ckpts = tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, str(script), "slow", str(tmp_path / "out"), str(ckpts)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (ckpts / "checkpoint-3" / "trainer_state.json").is_file():
        assert proc.poll() is None and time.time() < deadline, "the training ended before its first checkpoint"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "out" / "model.safetensors").exists()
    reference.wait(300)
    ref_err.close()
    assert reference.returncode == 0, (tmp_path / "ref.err").read_text()[-2000:]
    subprocess.run([sys.executable, str(script), "fast", str(tmp_path / "out"), str(ckpts)], check=True, env=env,
                   capture_output=True)
    card = json.loads((tmp_path / "out" / TRAINING_CARD).read_text())
    assert card["resumed_from_step"] >= 3 and card["steps"] == json.loads((tmp_path / "ref" / TRAINING_CARD).read_text())["steps"]
    ref, out = load_file(str(tmp_path / "ref" / "model.safetensors")), load_file(str(tmp_path / "out" / "model.safetensors"))
    assert ref.keys() == out.keys()
    assert all(np.allclose(ref[k].float().numpy(), out[k].float().numpy(), atol=1e-5) for k in ref)
    # a checkpoint made under other settings is cleared, not resumed
    stale = tmp_path / "stale"
    (stale / "checkpoint-99").mkdir(parents=True)
    (stale / "ragsieve_checkpoint_key.txt").write_text("other\n")
    recs = [PreferenceRecord("q", ["a"], ["b"], [0.1], [0.0])]
    cfg = CrossEncoderTrainConfig(init=str(tiny_cross_encoder_dir), group_size=2, max_length=32, checkpoint_steps=5)
    train_cross_encoder(recs, cfg, tmp_path / "fresh", checkpoint_dir=stale)
    assert not (stale / "checkpoint-99").exists()
    with pytest.raises(RagsieveError, match="checkpoint_steps cannot be combined"):
        train_cross_encoder(recs, cfg.model_copy(update={"lora_r": 4}), tmp_path / "x", checkpoint_dir=stale)


def test_fast_backends_match_predict(tiny_cross_encoder_dir, tmp_path, monkeypatch):
    """Same inputs as CrossEncoder.predict; fp32 ONNX equal, int8 close and rank-preserving here."""
    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path))
    pairs = [("who wrote hamlet", p.full_text) for p in POOL] + [("capital of france", "Paris " * 30)]
    ref = load_reranker(f"cross-encoder:{tiny_cross_encoder_dir}", max_length=64).predict_pairs(pairs)
    for backend, atol in (("onnx", 1e-5), ("torch-bf16", 0.05), ("torch-int8", 0.05), ("onnx-int8", 0.05),
                          ("openvino-bf16", 0.05)):
        ranker = load_reranker(f"cross-encoder:{tiny_cross_encoder_dir}", max_length=64, batch_size=2,
                               backend=backend)
        np.testing.assert_allclose(ranker.predict_pairs(pairs), ref, atol=atol, err_msg=backend)
    assert (tmp_path / "onnx").is_dir()  # exported once, cached
    with pytest.raises(RagsieveError, match="unknown cross-encoder backend 'gpu'"):
        load_reranker(f"cross-encoder:{tiny_cross_encoder_dir}", backend="gpu")


def test_bare_folder_is_a_cross_encoder(tiny_cross_encoder_dir):
    assert load_reranker(str(tiny_cross_encoder_dir)).name == "cross-encoder"


def test_evaluate_rankers_counts_misses_and_duplicates():
    from ragsieve.benchmarks.relevance import RankingQuery, evaluate_rankers

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
    from ragsieve.benchmarks.relevance import RelevanceSource, ranking_queries, split_questions, training_groups

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
    from ragsieve.benchmarks.base_reranker import BaseRerankerConfig, ensure_base_reranker
    from ragsieve.benchmarks.relevance import RelevanceSource

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


# --- base reranker: mining, distillation, calibration, shipped asset --------------------------


def test_interleave_round_robin_skips_gold_and_repeats():
    from ragsieve.benchmarks.mining import _interleave

    got = _interleave([("own", ["a", "g"]), ("dense", ["a", "b", "c"]), ("bm25", ["b", "d"])], {"g"}, 4)
    assert got == [("a", "own"), ("b", "dense"), ("d", "bm25"), ("c", "dense")]
    assert _interleave([("x", ["g"])], {"g"}, 3) == []


def test_group_distill_loss_is_infonce_plus_kl_or_margin_mse():
    import torch

    from ragsieve.rerank.training.distill import group_distill_loss

    scores = torch.tensor([[2.0, 0.5, -1.0]])
    teacher = torch.tensor([[0.6, 0.5, 0.1]])
    ce = -torch.log_softmax(scores, -1)[0, 0]
    p_t = torch.softmax(teacher * 20, -1)
    kl = (p_t * (torch.log(p_t) - torch.log_softmax(scores, -1))).sum()
    assert torch.isclose(group_distill_loss(scores, teacher, 0.5, 20.0), ce + 0.5 * kl, atol=1e-5)
    assert torch.isclose(group_distill_loss(scores, teacher, 0.0, 20.0), ce)
    # a student matching the teacher's logits pays no distillation cost
    assert torch.isclose(group_distill_loss(teacher * 20, teacher, 1.0, 20.0),
                         -torch.log_softmax(teacher * 20, -1)[0, 0], atol=1e-5)
    # margin-mse: every difference within the group matched; a shifted copy of the teacher pays nothing
    centred = (scores - scores.mean()) - (teacher * 20 - (teacher * 20).mean())
    assert torch.isclose(group_distill_loss(scores, teacher, 0.5, 20.0, "margin-mse"),
                         ce + 0.5 * centred.pow(2).mean(), atol=1e-5)
    assert torch.isclose(group_distill_loss(teacher * 20 + 3.0, teacher, 1.0, 20.0, "margin-mse"),
                         -torch.log_softmax(teacher * 20, -1)[0, 0], atol=1e-5)


def test_distill_rows_and_dev_samples():
    from ragsieve.rerank.training.distill import dev_samples, distill_rows

    mined = [{"query": "q", "pos": [["p1", "P1", 0.9], ["p2", "P2", 0.8]],
              "neg": [["n1", "N1", 0.5, "bm25"], ["n2", "N2", 0.7, "dense"]]}]
    rows = distill_rows(mined, group_size=4, passes=2)
    assert len(rows) == 2 and all(len(r["docs"]) == len(r["label"]) == 4 for r in rows)
    assert {r["docs"][0] for r in rows} == {"P1", "P2"}  # positives rotate over passes
    assert all(r["label"][0] in (0.9, 0.8) for r in rows)
    sample = dev_samples(mined, max_docs=3)[0]
    assert sample["documents"] == ["P1", "P2", "N2"] and sample["positive"] == ["P1", "P2"]
    with pytest.raises(RagsieveError):
        distill_rows(mined, group_size=1, passes=1)
    # batched layout: every batch holds one dataset, passes stay in order
    many = [{**mined[0], "dataset": d, "query": f"{d}{i}"} for d in "ab" for i in range(5)]
    laid = distill_rows(many, group_size=3, passes=2, batch_size=2)
    assert len(laid) == 24  # 5 rows per dataset fill up to 3 full batches of 2
    blocks = [laid[i: i + 2] for i in range(0, 24, 2)]
    assert all(len({r["query"][0] for r in b}) == 1 for b in blocks)
    assert {r["query"] for r in laid[:12]} == {m["query"] for m in many}


def test_calibration_fits_temperature_and_threshold():
    from ragsieve.rerank.calibration import Calibration, threshold_for_precision

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 4000)
    logits = np.where(y == 1, 3.0, -3.0) + rng.normal(0, 2.0, len(y))
    cal = Calibration.fit(logits, y)
    p = cal.proba(logits)
    for lo, hi in ((0.1, 0.3), (0.7, 0.9)):  # well calibrated: observed rate ≈ mean prob per bin
        m = (p >= lo) & (p < hi)
        assert abs(y[m].mean() - p[m].mean()) < 0.05
    # the same calibration applies to sigmoid outputs when fitted on their logits
    cal_p = Calibration.fit(1 / (1 + np.exp(-logits)), y, from_probability=True)
    assert np.isclose(cal_p.temperature, cal.temperature, rtol=1e-3)
    assert threshold_for_precision([0.9, 0.8, 0.3], [1, 1, 0], 0.9) == 0.8
    assert threshold_for_precision([0.9], [0], 0.5) is None
    # a cut keeps all ties of its score: the first of two tied 0.8s alone is not a cut (it would claim 1.0)
    assert threshold_for_precision([0.9, 0.8, 0.8], [1, 1, 0], 0.9) == 0.9
    with pytest.raises(RagsieveError, match="both classes"):
        Calibration.fit([1.0, 2.0], [1, 1])


def test_fit_calibration_is_finite_on_separable_pairs_and_cross_fits_by_query():
    from ragsieve.rerank.calibration import Calibration, fit_calibration

    scores = np.array([3.0, -2.0, -3.0, 2.5, -1.0, -2.5, 4.0, -4.0, -1.5])
    labels = np.array([1, 0, 0, 1, 0, 0, 1, 0, 0])
    groups = np.repeat(["a", "b", "c"], 3)
    cal, ece, cuts = fit_calibration(scores, labels, groups, as_loaded=np.full(9, 0.5), folds=3, n_boot=50,
                                     precisions=[1.0])
    assert cuts["1"]["recall"] == 1.0 and cuts["1"]["kept"] == pytest.approx(3 / 9)  # separable: all 3, nothing else
    # separable: plain log-loss drives the slope to infinity; Platt's targets keep the probabilities inside (0, 1)
    assert 0.05 < cal.proba([3.0])[0] < 0.99 and 0.01 < cal.proba([-3.0])[0] < 0.5
    assert Calibration.fit(scores, labels).proba([3.0])[0] > cal.proba([3.0])[0]
    assert ece["as_loaded"]["queries"] == ece["calibrated_cross_fitted"]["queries"] == 3
    assert ece["as_loaded"]["mean"] == pytest.approx(abs(0.5 - 3 / 9))
    assert ece["calibrated_cross_fitted"]["low"] <= ece["calibrated_cross_fitted"]["mean"] <= \
        ece["calibrated_cross_fitted"]["high"]


def test_ranker_calibrate_and_predict_proba():
    ranker = load_reranker("bm25")
    with pytest.raises(RagsieveError, match="not calibrated"):
        ranker.predict_proba("hamlet", POOL)
    qs = ["who wrote hamlet"] * 3 + ["capital of france"] * 3
    ys = [0, 1, 1, 1, 0, 0]
    cal = ranker.calibrate(qs, POOL + POOL, ys)
    p = ranker.predict_proba("who wrote hamlet", POOL)
    assert cal.temperature > 0 and p.shape == (3,) and p.argmax() == 1 and np.all((p >= 0) & (p <= 1))


def test_shipped_asset_roundtrip(tmp_path, monkeypatch, tiny_cross_encoder_dir):
    """write_asset → ONNX int8 ranker matches the torch model's order; torch backend loads fp16 as fp32."""
    import shutil

    from ragsieve.rerank.fast import export_onnx
    from ragsieve.rerank.neural import CrossEncoderRanker
    from ragsieve.rerank.shipped import OnnxCrossEncoderRanker, load_shipped_reranker, read_card, write_asset

    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path / "cache"))
    asset = write_asset(tiny_cross_encoder_dir, tmp_path / "asset", {"max_length": 64, "default_backend": "onnx-int8",
                                                                        "calibration": {"temperature": 2.0, "bias": 0.1}})
    assert read_card(asset)["max_length"] == 64 and (asset / "model.int8.onnx").exists()
    passages = [p.text for p in POOL] + ["a much longer passage " * 30, "x"]
    ref = CrossEncoderRanker(str(tiny_cross_encoder_dir), max_length=64)
    onnx = OnnxCrossEncoderRanker(asset, max_length=64, batch_size=2)  # batches over length-sorted pairs
    # the tokenizers path gives exactly CrossEncoder.preprocess's ids (truncation included)
    pairs = [("who wrote hamlet", p) for p in passages]
    feats = ref.model.preprocess(pairs)
    for row, e in enumerate(onnx.encode_pairs(pairs)):
        n = int(feats["attention_mask"][row].sum())
        assert feats["input_ids"][row, :n].tolist() == e.ids
    probs = ref.predict_pairs(pairs)
    # the batching/padding path reproduces the fp32 model's logits exactly on the unquantised export
    shutil.copy(export_onnx(ref.model, str(tiny_cross_encoder_dir)), asset / "model.onnx")
    fp32 = OnnxCrossEncoderRanker(asset, onnx_file="model.onnx", max_length=64, batch_size=2)
    assert np.allclose(1 / (1 + np.exp(-fp32.predict_pairs(pairs))), probs, atol=1e-4)
    assert np.isfinite(onnx.predict_pairs(pairs)).all()
    shipped = load_shipped_reranker(asset)
    assert isinstance(shipped, OnnxCrossEncoderRanker) and shipped.calibration.temperature == 2.0
    torch_ranker = load_shipped_reranker(asset, backend="torch")
    assert next(torch_ranker.model.model.parameters()).dtype.is_floating_point
    assert np.allclose(torch_ranker.predict_pairs(pairs), probs, atol=5e-3)  # fp16 weights, fp32 compute
    assert np.allclose(shipped.predict_proba("who wrote hamlet", passages),
                       torch_ranker.predict_proba("who wrote hamlet", passages), atol=0.05)
    with pytest.raises(ModelNotAvailable):
        load_shipped_reranker(tmp_path / "nothing")


def test_embedded_base_loads_shipped_asset_without_training():
    import time

    from ragsieve.rerank.shipped import ASSET_DIR

    if not (ASSET_DIR / "ragsieve_reranker.json").exists():
        pytest.skip("no shipped asset in this checkout")
    t = time.perf_counter()
    load_reranker("embedded:base", backend="onnx-int8")  # the torch-free path; no training either way
    assert time.perf_counter() - t < 5
    ranker = load_reranker("embedded:base")  # the card's backend
    res = ranker.rank("who wrote hamlet", POOL)
    assert res.results[0].passage.id == "p1"
    assert ranker.predict_proba("who wrote hamlet", POOL).argmax() == 1


def test_study_bootstrap_intervals_and_dev_pairs():
    from studies.rerank_base import bootstrap_ci, dev_pairs, paired_diff

    rng = np.random.default_rng(0)
    a = rng.random(200)
    lo, hi = bootstrap_ci(a, 500)
    assert lo < a.mean() < hi and hi - lo < 0.2
    same = paired_diff(a, a, 500)
    assert same == {"diff": 0.0, "low": 0.0, "high": 0.0}
    up = paired_diff(a + 0.1, a, 500)
    assert np.isclose(up["diff"], 0.1) and up["low"] <= 0.1 <= up["high"]
    qs, ps, ys = dev_pairs([{"query": "q", "pos": [["p", "P", 0.9]], "neg": [["n", "N", 0.1, "bm25"]]}])
    assert (qs, ps, ys) == (["q", "q"], ["P", "N"], [1, 0])


def test_cosine_mix_ranker_and_weight_tuning():
    from ragsieve.rerank.mixed import CosineMixRanker, tune_cosine_weight

    class Fixed(BaseRanker):
        def __init__(self, values, prob=False):
            self.values, self.score_is_probability = np.asarray(values), prob

        def score(self, query, passages):
            return self.values

    cross, cosine = Fixed([1.0, 0.0, 0.0]), Fixed([0.0, 0.5, 0.0])
    assert CosineMixRanker(cross, 0.0, cosine=cosine).rank("q", POOL).results[0].index == 0
    mixed = CosineMixRanker(cross, 1.0, scale=20.0, cosine=cosine)
    assert np.allclose(mixed.score("q", POOL), [1.0, 10.0, 0.0])
    # all pairs at once (serve's batches across requests) score as query by query does
    assert np.allclose(mixed.score_pairs(["q", "q", "q", "r", "r", "r"], POOL + POOL), [1.0, 10.0, 0.0] * 2)
    # sigmoid outputs are mixed on the logit scale
    assert np.allclose(CosineMixRanker(Fixed([0.5, 0.5, 0.5], prob=True), 0.0, cosine=cosine).score("q", POOL), 0.0)
    # dev: cosine finds the gold where the cross-encoder does not, so a positive weight wins
    logits = [np.array([0.0, 1.0]), np.array([1.0, 0.0])]
    cosines = [np.array([0.9, 0.1]), np.array([0.9, 0.1])]
    rel = [np.array([1, 0]), np.array([1, 0])]
    w, by_w = tune_cosine_weight(logits, cosines, rel, grid=(0.0, 1.0))
    assert w == 1.0 and by_w[1.0] > by_w[0.0]
    assert tune_cosine_weight([np.array([1.0, 0.0])], [np.array([0.1, 0.9])], [np.array([1, 0])],
                              grid=(0.0, 1.0))[0] == 0.0


def test_unit_scores_are_what_the_api_returns_for_every_kind_of_ranker():
    """Calibrated → predict_proba; sigmoid outputs → themselves; raw scores → their logistic (same order)."""
    from scipy.special import expit

    from ragsieve.rerank.calibration import Calibration
    from ragsieve.rerank.pointwise import PointwiseLLMReranker
    from ragsieve.rerank.remote import RemoteRanker

    bm25 = load_reranker("bm25")
    raw = bm25.score("who wrote hamlet", as_passages(POOL))
    np.testing.assert_allclose(bm25.unit_scores(raw), expit(raw))
    bm25.calibration = Calibration(temperature=0.5, bias=-1.0)
    np.testing.assert_allclose(bm25.unit_scores(raw), bm25.predict_proba("who wrote hamlet", POOL))

    class Probabilities(BaseRanker):
        score_is_probability = True

        def score(self, query, passages):
            return np.linspace(0.0, 1.0, len(passages))

    p = Probabilities().score("q", as_passages(POOL))
    np.testing.assert_array_equal(Probabilities().unit_scores(p), p)
    # P(true) of an LLM and a Cohere-compatible service's relevance_score are already in [0, 1]
    assert PointwiseLLMReranker.score_is_probability and RemoteRanker.score_is_probability


def test_raw_threshold_inverts_unit_scores_for_every_kind_of_ranker():
    """unit_scores(s) >= t exactly when s >= raw_threshold(t): calibrated (on logits or on sigmoid outputs),
    sigmoid outputs, raw scores; graders read their scores on the same scale (/v1/filter's threshold)."""
    from scipy.special import logit

    from ragsieve.grade.lm import LMGrader
    from ragsieve.registry import new_grader
    from ragsieve.rerank.calibration import Calibration

    class Probabilities(BaseRanker):
        score_is_probability = True

        def score(self, query, passages):
            return np.linspace(0.0, 1.0, len(passages))

    bm25, calibrated = load_reranker("bm25"), load_reranker("bm25")
    calibrated.calibration = Calibration(temperature=0.5, bias=-1.0)
    probs, calibrated_probs = Probabilities(), Probabilities()
    calibrated_probs.calibration = Calibration(temperature=2.0, bias=0.5, from_probability=True)
    assert bm25.raw_threshold(0.7) == pytest.approx(logit(0.7)) and probs.raw_threshold(0.7) == 0.7
    rng = np.random.default_rng(0)
    for ranker, scores in ((bm25, rng.normal(0, 3, 200)), (calibrated, rng.normal(0, 3, 200)),
                           (probs, rng.uniform(0, 1, 200)), (calibrated_probs, rng.uniform(0, 1, 200))):
        unit = ranker.unit_scores(scores)
        for t in (0.1, 0.25, 0.5, 0.8, 0.95):
            # a score within rounding of the cut may fall either side; none of these random ones is
            np.testing.assert_array_equal(unit >= t, scores >= ranker.raw_threshold(t))
        assert np.all(scores >= ranker.raw_threshold(0.0))
    with pytest.raises(RagsieveError, match="not in \\[0, 1\\]"):
        bm25.raw_threshold(1.5)
    # a ranker grader thresholds its ranker's scores: same scale; an LLM grader's P(relevant) is a probability
    grader = new_grader("ranker", base="bm25", threshold=0.1)
    assert grader.unit_scores([0.1]) == pytest.approx(bm25.unit_scores([0.1]))
    assert LMGrader.score_is_probability


def test_bf16_backends_run_only_where_the_cpu_has_bf16_units(monkeypatch, tmp_path, tiny_cross_encoder_dir):
    """A card naming torch-bf16 loads it on a CPU with AMX / AVX512-BF16, and its measured choice without bf16
    elsewhere (bf16 is emulated there, slower than fp32); an explicit torch-bf16 request falls back to fp32."""
    import json
    import shutil

    from ragsieve.models import cpu
    from ragsieve.rerank.mixed import CosineMixRanker
    from ragsieve.rerank.shipped import load_shipped_reranker

    folder = tmp_path / "asset"
    shutil.copytree(tiny_cross_encoder_dir, folder)
    (folder / "ragsieve_reranker.json").write_text(json.dumps({
        "max_length": 64, "default_backend": "torch-bf16", "cosine_backend": "torch-bf16", "cosine_weight": 0.25,
        "without_bf16": {"default_backend": "torch", "cosine_backend": "onnx-int8"}}))
    monkeypatch.setattr(cpu, "fast_bf16", lambda: True)
    ranker = load_shipped_reranker(folder)
    assert isinstance(ranker, CosineMixRanker) and ranker.cross.backend == "torch-bf16"
    assert ranker.cosine.backend == "torch-bf16"
    bf16 = ranker.score("who wrote hamlet", POOL)
    monkeypatch.setattr(cpu, "fast_bf16", lambda: False)
    plain = load_shipped_reranker(folder)
    assert plain.cross.backend == "torch" and plain.cosine_backend == "onnx-int8"
    assert load_shipped_reranker(folder, backend="torch-bf16").cross.backend == "torch"
    assert cpu.cpu_backend("torch-bf16") == "torch" and cpu.cpu_backend("onnx-int8") == "onnx-int8"
    np.testing.assert_allclose(bf16, plain.score("who wrote hamlet", POOL), atol=0.3)  # bf16 vs fp32 + int8 cosine


JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")


@pytest.mark.skipif(not JEMALLOC.is_file(), reason="libjemalloc2 is not installed")
def test_a_card_naming_openvino_runs_torch_bf16_beside_jemalloc(tmp_path, tiny_cross_encoder_dir):
    """OpenVINO aborts a process that preloads jemalloc (as the README suggests for long trainings): the card's
    OpenVINO backends fall back to torch-bf16 there, and OpenVINO asked for directly fails in one line."""
    import json
    import shutil
    import subprocess
    import sys

    folder = tmp_path / "asset"
    shutil.copytree(tiny_cross_encoder_dir, folder)
    (folder / "ragsieve_reranker.json").write_text(json.dumps({
        "max_length": 64, "default_backend": "openvino-bf16", "cosine_backend": "openvino-bf16",
        "cosine_weight": 0.25}))
    script = (
        "import sys\n"
        "from ragsieve.errors import ModelNotAvailable\n"
        "from ragsieve.models.encoder import load_onnx_encoder\n"
        "from ragsieve.rerank.shipped import load_shipped_reranker\n"
        f"r = load_shipped_reranker({str(folder)!r})\n"
        "print(r.cross.backend, r.cosine.backend, len(r.score('who wrote hamlet', ['Hamlet', 'Paris'])))\n"
        "try:\n    load_onnx_encoder(backend='openvino-bf16')\nexcept ModelNotAvailable as exc:\n    print(exc)\n")
    env = {**os.environ, "LD_PRELOAD": str(JEMALLOC), "RAGSIEVE_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].split()[:2] == ["torch-bf16", "torch-bf16"] or lines[0].split()[:2] == ["torch", "torch"]
    assert lines[0].split()[2] == "2" and "jemalloc" in lines[1]


def test_shipped_default_on_a_cpu_without_bf16_runs_its_fallback_backends(tmp_path):
    """The shipped card's `without_bf16` pair (what a CPU without AMX / AVX512-BF16 loads), run for real by
    telling ragsieve the CPU has none: the same ranking and nearly the same scores as the bf16 default."""
    import json
    import subprocess
    import sys

    query, docs = "who wrote hamlet", ["Hamlet is a tragedy by William Shakespeare.", "Paris is in France.",
                                       "Shakespeare's plays include Hamlet and Macbeth.", "The fox jumps."]
    script = ("import json\nfrom ragsieve.registry import load_reranker\nr = load_reranker('embedded:base')\n"
              f"print(json.dumps([r.cross.backend, r.cosine.backend, r.score({query!r}, {docs!r}).tolist()]))\n")
    env = {**os.environ, "RAGSIEVE_CPU_BF16": "0", "RAGSIEVE_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    cross, cosine, scores = json.loads(done.stdout.strip().splitlines()[-1])
    card = json.loads((Path(__file__).resolve().parents[1] / "ragsieve/assets/base-reranker/ragsieve_reranker.json")
                      .read_text())
    assert [cross, cosine] == [card["without_bf16"]["default_backend"], card["without_bf16"]["cosine_backend"]]
    default = load_reranker("embedded:base").score(query, docs)
    assert np.argsort(-np.array(scores)).tolist() == np.argsort(-default).tolist()
    np.testing.assert_allclose(scores, default, atol=0.15)  # fp32 + int8 cosine vs bf16: ≈ 0.01-0.05 apart


def test_openvino_bf16_runs_both_models_from_their_onnx_exports(monkeypatch, tmp_path, tiny_cross_encoder_dir):
    """A card naming openvino-bf16 runs the cross-encoder's and the cosine's fp32 ONNX exports (made once, into
    the cache) on OpenVINO, scoring as fp32 torch does within bf16's rounding; a CPU without bf16 units runs
    OpenVINO in f32."""
    import json
    import shutil

    from ragsieve.models import cpu
    from ragsieve.rerank.shipped import OnnxCrossEncoderRanker, load_shipped_reranker

    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "asset"
    shutil.copytree(tiny_cross_encoder_dir, folder)
    (folder / "ragsieve_reranker.json").write_text(json.dumps({
        "max_length": 64, "default_backend": "openvino-bf16", "cosine_backend": "openvino-bf16",
        "cosine_weight": 0.25}))
    monkeypatch.setattr(cpu, "fast_bf16", lambda: True)
    ranker = load_shipped_reranker(folder, threads=1)
    assert isinstance(ranker.cross, OnnxCrossEncoderRanker) and ranker.cross.model.engine == "openvino-bf16"
    assert ranker.cosine.backend == "openvino-bf16"
    fp32 = load_shipped_reranker(folder, backend="torch", cosine_backend="torch")
    np.testing.assert_allclose(ranker.score("who wrote hamlet", POOL), fp32.score("who wrote hamlet", POOL), atol=0.3)
    assert len(list((tmp_path / "cache" / "onnx").glob("cross-encoder-*/model.onnx"))) == 1
    monkeypatch.setattr(cpu, "fast_bf16", lambda: False)
    f32 = load_shipped_reranker(folder, cosine_backend="torch")  # OpenVINO in f32: fp32's scores
    np.testing.assert_allclose(f32.score("who wrote hamlet", POOL), fp32.score("who wrote hamlet", POOL), atol=1e-3)
