"""Forgetting guards for the aligned reranker (issue #18): the distillation loss, a few training steps with
each guard from the shipped base reranker, the forgetting measurement, the study's pieces and the
`rerank train` options. Real models and data, tiny sizes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ragsieve.errors import RagsieveError
from ragsieve.prefs import PreferenceRecord
from tests.conftest import requires_data

HAMLET, FOXES, PARIS = "Hamlet was written by William Shakespeare.", "Foxes are small mammals.", "Paris is in France."
GROUPS = [PreferenceRecord(f"who wrote hamlet {i}", [HAMLET], [FOXES, PARIS], [0.3], [-0.2, -0.1]) for i in range(6)]
GOLD = [PreferenceRecord(f"capital of france {i}", ["Paris is the capital of France."],
                         ["Berlin is in Germany.", "Rome is an old city."], [1.0], [0.0, 0.0]) for i in range(4)]


def test_distill_loss_is_group_infonce_at_weight_0_and_without_drift(tiny_cross_encoder_dir):
    import torch
    from sentence_transformers.cross_encoder import CrossEncoder

    from ragsieve.rerank.training.losses import GroupInfoNCEDistillLoss, GroupInfoNCELoss
    from ragsieve.rerank.training.trainer import start_logits

    model = CrossEncoder(str(tiny_cross_encoder_dir), max_length=32, num_labels=1)
    model.eval()  # no dropout: the same weights give the same logits in every call
    queries = ["who wrote hamlet", "capital of france"]
    columns = [queries, ["Shakespeare wrote Hamlet.", "Paris."], ["Foxes.", "Berlin."], ["Rome.", "Dogs."]]
    tau = 0.5
    expected = GroupInfoNCELoss(model, temperature=tau)(columns, None)
    # weight 0: the same loss to the bit (same layout, scaling and cross-entropy)
    assert torch.equal(GroupInfoNCEDistillLoss(model, temperature=tau, distill_weight=0.0)(columns, None), expected)
    rows = [{"query": q, "positive": p, "negative_1": n1, "negative_2": n2} for q, p, n1, n2 in zip(*columns)]
    teacher = [torch.tensor(t) for t in start_logits(model, rows, group_size=3)]
    # the teacher is the model itself (no training yet): the KL term is 0
    with_kl = GroupInfoNCEDistillLoss(model, temperature=tau, distill_weight=1.0)(columns, teacher)
    assert torch.allclose(with_kl, expected, atol=1e-5)
    # a teacher ordering the docs otherwise costs more
    other = [torch.tensor([-3.0, 0.0, 3.0])] * 2
    assert GroupInfoNCEDistillLoss(model, temperature=tau, distill_weight=1.0)(columns, other) > expected + 1e-3
    with pytest.raises(ValueError, match="distill_weight must be >= 0"):
        GroupInfoNCEDistillLoss(model, distill_weight=-1.0)


def test_start_logits_cache_reads_stored_pairs_and_scores_only_new_ones(tmp_path, tiny_cross_encoder_dir):
    import torch
    from sentence_transformers.cross_encoder import CrossEncoder

    from ragsieve.probe.cache import StateCache
    from ragsieve.rerank.shipped import weights_key
    from ragsieve.rerank.training.trainer import start_logits

    model = CrossEncoder(str(tiny_cross_encoder_dir), max_length=32, num_labels=1)
    rows = [{"query": "who wrote hamlet", "positive": HAMLET, "negative_1": FOXES, "negative_2": PARIS}]
    key = weights_key(tiny_cross_encoder_dir)
    assert len(key) == 12 and key == weights_key(tiny_cross_encoder_dir)
    plain = start_logits(model, rows, group_size=3)
    cache = StateCache(tmp_path / "start.sqlite")
    assert start_logits(model, rows, group_size=3, cache=cache, model_key=key)[0] == pytest.approx(plain[0], abs=1e-5)
    assert len(cache) == 3
    with torch.no_grad():  # other weights: the stored pairs are read, only the new pair is scored
        for p in model.model.parameters():
            p.add_(0.5)
    more = rows + [{"query": "who wrote hamlet", "positive": HAMLET, "negative_1": PARIS, "negative_2": "Dogs bark."}]
    got = start_logits(model, more, group_size=3, cache=cache, model_key=key)
    assert got[0] == pytest.approx(plain[0], abs=1e-5) and got[1][:2] == pytest.approx([plain[0][0], plain[0][2]], abs=1e-5)
    assert len(cache) == 4
    # another start model (key) shares nothing
    assert start_logits(model, rows, group_size=3, cache=cache, model_key="other")[0] != pytest.approx(plain[0], abs=1e-3)
    cache.close()


def test_replay_rows_and_guard_fields_are_validated(tmp_path):
    from pydantic import ValidationError

    from ragsieve.rerank.training.trainer import CrossEncoderTrainConfig, replay_rows, train_cross_encoder

    assert len(replay_rows(GOLD, 6, 0.5, 3)) == 6  # half of the 12 rows are gold
    assert len(replay_rows(GOLD, 6, 0.25, 3)) == 2
    rows = replay_rows(GOLD, 30, 0.5, 3)  # more than the 4 gold groups: further passes, fresh negatives
    assert len(rows) == 30 and {r["query"] for r in rows} == {g.query for g in GOLD}
    for bad in ({"replay_ratio": 1.0}, {"replay_ratio": -0.1}, {"distill_weight": -1}, {"lora_r": -2},
                {"eval_steps": -1}, {"patience": 0}):
        with pytest.raises(ValidationError):
            CrossEncoderTrainConfig(**bad)
    # a guard without its data is refused before any model loads (init does not even exist)
    with pytest.raises(RagsieveError, match="needs gold groups to replay"):
        train_cross_encoder(GROUPS, CrossEncoderTrainConfig(init="/nonexistent", replay_ratio=0.5), tmp_path / "a")
    with pytest.raises(RagsieveError, match="needs relevance_dev"):
        train_cross_encoder(GROUPS, CrossEncoderTrainConfig(init="/nonexistent", eval_steps=5), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("guard", [{"distill_weight": 1.0}, {"replay_ratio": 0.5}, {"lora_r": 4},
                                   {"eval_steps": 1, "patience": 2}])
def test_each_guard_trains_a_plain_loadable_folder(tmp_path, guard):
    """2–3 steps from the shipped base reranker; the folder loads through the registry like any other."""
    from safetensors.torch import load_file

    from ragsieve.registry import load_reranker
    from ragsieve.rerank.shipped import base_reranker_dir
    from ragsieve.rerank.training.trainer import TRAINING_CARD, CrossEncoderTrainConfig, train_cross_encoder

    base = base_reranker_dir()
    cfg = CrossEncoderTrainConfig(init=str(base), group_size=3, batch_size=4, max_length=64, lr=1e-4, **guard)
    out = train_cross_encoder(GROUPS, cfg, tmp_path / "ce", replay=GOLD, relevance_dev=GOLD)
    card = json.loads((out / TRAINING_CARD).read_text())
    assert card["guards"] == {"replay_ratio": 0.0, "distill_weight": 0.0, "lora_r": 0, "eval_steps": 0,
                              "cosine_mix": False, **{k: v for k, v in guard.items() if k != "patience"}}
    assert card["preference_rows"] == 6 and card["steps"] in (2, 3)
    saved, start = load_file(out / "model.safetensors"), load_file(base / "model.safetensors")
    assert set(saved) == set(start)  # a plain BertForSequenceClassification: no adapter or wrapper names
    if "replay_ratio" in guard:
        assert card["replay_rows"] == 6
    if "lora_r" in guard:  # adapters merged into the attention weights; embeddings were never trained
        name = "bert.encoder.layer.0.attention.self.query.weight"
        assert not np.allclose(saved[name].float().numpy(), start[name].float().numpy())
        emb = "bert.embeddings.word_embeddings.weight"
        assert np.array_equal(saved[emb].float().numpy(), start[emb].float().numpy())
    if "eval_steps" in guard:
        steps = [h["step"] for h in card["dev_history"]]
        assert steps[:2] == [1, 2] and card["best_dev_step"] in steps and 0 <= card["best_dev_ndcg@10"] <= 1
    ranker = load_reranker(str(out), max_length=64)
    scores = ranker.score("who wrote hamlet", [HAMLET, FOXES])
    assert scores.shape == (2,) and np.all(np.isfinite(scores))


def test_cosine_mix_folder_scores_as_its_start(tmp_path):
    """A folder fine-tuned with cosine_mix carries the start's mix in its card, and the registry honours it."""
    from ragsieve.registry import load_reranker
    from ragsieve.rerank.mixed import CosineMixRanker
    from ragsieve.rerank.neural import CrossEncoderRanker
    from ragsieve.rerank.shipped import CARD, base_reranker_dir, read_card
    from ragsieve.rerank.training.trainer import CrossEncoderTrainConfig, train_cross_encoder

    base = base_reranker_dir()
    weight = float(read_card(base).get("cosine_weight", 0.0))
    cfg = CrossEncoderTrainConfig(init=str(base), group_size=3, batch_size=8, max_length=64, epochs=0.1,
                                  cosine_mix=True)
    out = train_cross_encoder(GROUPS, cfg, tmp_path / "mixed")
    plain = train_cross_encoder(GROUPS, cfg.model_copy(update={"cosine_mix": False}), tmp_path / "plain")
    assert not (plain / CARD).exists() and isinstance(load_reranker(str(plain)).ranker, CrossEncoderRanker)
    if not weight:  # a shipped base without a cosine term has nothing to inherit
        assert not (out / CARD).exists()
        return
    card = json.loads((out / CARD).read_text())
    assert card["cosine_weight"] == weight and card["default_backend"] == "torch" and "calibration" not in card
    ranker = load_reranker(f"cross-encoder:{out}", max_length=64)
    assert isinstance(ranker.ranker, CosineMixRanker) and ranker.weight == weight
    mixed = ranker.score("who wrote hamlet", [HAMLET, FOXES])
    assert mixed.shape == (2,) and np.all(np.isfinite(mixed)) and mixed[0] > mixed[1]


@requires_data
def test_forgetting_on_two_datasets_and_resume_from_cache(tmp_path):
    from ragsieve.rerank.base import RetrievalOrder
    from ragsieve.benchmarks.forgetting import heldout_queries, measure_forgetting
    from ragsieve.rerank.lexical import BM25Ranker
    from ragsieve.benchmarks.relevance import evaluate_rankers

    datasets = ["hotpotqa-distractor", "fever"]
    result = measure_forgetting({"bm25": BM25Ranker, "order": RetrievalOrder()}, "bm25", datasets=datasets,
                                max_queries=3, cache_dir=tmp_path, n_boot=200)
    assert result["reference"] == "bm25" and list(result["datasets"]) == datasets
    for name, d in result["datasets"].items():
        assert d["n"] == 3
        bm25, order = d["rankers"]["bm25"], d["rankers"]["order"]
        assert "vs_reference" not in bm25
        for metric in ("MRR@10", "nDCG@10"):
            assert order[metric]["low"] <= order[metric]["mean"] <= order[metric]["high"]
            vs = order["vs_reference"][metric]
            assert vs["n"] == 3 and np.isclose(vs["diff"], order[metric]["mean"] - bm25[metric]["mean"])
            assert vs["low"] <= vs["diff"] <= vs["high"] and "verdict" in vs
        # the same numbers as the means the base reranker's report computes over those queries
        means = evaluate_rankers({"bm25": BM25Ranker()}, heldout_queries(name, max_queries=3), ks=(10,),
                                 measures=("MRR",))
        assert np.isclose(means["bm25"]["MRR@10"], bm25["MRR@10"]["mean"])
    assert len(list(tmp_path.glob("*.json"))) == 4  # one per (dataset, ranker key)

    def never():
        raise AssertionError("a cached ranker was built again")

    again = measure_forgetting({"bm25": never, "order": never}, "bm25", datasets=datasets, max_queries=3,
                               cache_dir=tmp_path, n_boot=200)
    assert again == result
    with pytest.raises(RagsieveError, match="reference 'base'"):
        measure_forgetting({"bm25": BM25Ranker}, "base", datasets=datasets)


def _variant(name: str, p1: float, p3: float, mrr_diff: float, high: float, verdict: str) -> dict:
    vs = {"diff": mrr_diff, "low": mrr_diff - 0.05, "high": high, "p_value": 0.01, "verdict": verdict, "n": 100}
    cell = {"mean": 0.8 + mrr_diff, "low": 0.7, "high": 0.9}
    ranks = {"base": {"MRR@10": {"mean": 0.8, "low": 0.7, "high": 0.9}, "nDCG@10": cell},
             name: {"MRR@10": cell, "nDCG@10": cell, "vs_reference": {"MRR@10": vs, "nDCG@10": vs}}}
    paired = {"diff": p1 - 0.9, "p_value": 0.5, "low": -0.1, "high": 0.1}
    return {"prefs_test": {"means": {"P@1": p1, "P@3": p3, "R@5": 0.5, "MRR@5": 0.9},
                           "vs_base": {"P@1": paired, "P@3": paired}},
            "forgetting": {"datasets": {"fever": {"n": 100, "rankers": ranks}}}}


def test_best_guard_rule_and_tables():
    from studies.rerank_align_guard import choose_best, markdown_table, preference_table

    variants = {
        "unguarded": _variant("unguarded", 0.95, 0.8, -0.30, -0.2, "B better"),  # best P@1, forgets
        "distill-1": _variant("distill-1", 0.92, 0.7, -0.02, 0.01, "no measurable difference"),
        "lora-8": _variant("lora-8", 0.92, 0.75, -0.005, -0.001, "B better"),  # within 0.01 of base
        "lowlr": _variant("lowlr", 0.90, 0.9, 0.0, 0.02, "no measurable difference"),
    }
    best = choose_best(variants, max_mrr_drop=0.01)
    assert best["eligible"] == ["distill-1", "lora-8", "lowlr"] and best["best"] == "lora-8"  # P@1 tie → P@3
    assert best["keeps_relevance"]["unguarded"] == {"fever": False}
    assert choose_best({"unguarded": variants["unguarded"]})["best"] is None
    metrics = {"variants": variants, "best_guard": best,
               "base": {"prefs_test": {"P@1": 0.9, "P@3": 0.7, "R@5": 0.5, "MRR@5": 0.9}}}
    table = markdown_table(metrics)
    assert table.count("| fever (100) | base |") == 1 and "| | unguarded | 0.500 [0.700, 0.900] | -0.300" in table
    assert "no: measurably below" in table
    assert "**lora-8**" in preference_table(metrics)


def test_rerank_train_guard_options(tmp_path, cli, tiny_cross_encoder_dir):
    import shutil

    from ragsieve.models import get_embedded
    from ragsieve.prefs import write_preferences

    prefs, gold = tmp_path / "prefs.jsonl", tmp_path / "gold.jsonl"
    write_preferences(prefs, GROUPS)
    write_preferences(gold, GOLD)
    out = tmp_path / "ce"
    base = ["rerank", "train", "--prefs", prefs, "--out", out]
    for args, message in [(["--replay-ratio", "1.5"], "replay_ratio"), (["--lora-r", "-1"], "lora_r"),
                          (["--distill-weight", "-0.5"], "distill_weight"),
                          (["--replay-ratio", "0.5"], "needs --replay FILE"),
                          (["--eval-steps", "3"], "needs --relevance-dev FILE"),
                          (["--checkpoint-steps", "-1"], "checkpoint_steps"),
                          (["--checkpoint-steps", "5", "--lora-r", "2"], "checkpoint_steps cannot be combined")]:
        r = cli(*base, *args)
        assert r.code == 2 and message in r.err, (args, r.err)
        assert len(r.err.strip().splitlines()) == 1, r.err
    assert not out.exists()  # refused before anything was written
    cfg = tmp_path / "train.yaml"
    cfg.write_text("batch_size: 4\nmax_length: 64\ngroup_size: 3\n")
    r = cli(*base, "--init", tiny_cross_encoder_dir, "--config", cfg, "--replay", gold, "--replay-ratio", "0.5",
            "--lora-r", "2", "--relevance-dev", gold, "--eval-steps", "2")
    assert r.code == 0, r.err
    card = json.loads((out / "ragsieve_training.json").read_text())
    # the measured default guards: cosine mix, and distillation to the start cross-encoder
    assert card["guards"] == {"replay_ratio": 0.5, "distill_weight": 1.0, "lora_r": 2, "eval_steps": 2,
                              "cosine_mix": True}
    assert card["replay_rows"] == 6 and card["dev_history"]
    # resumable training: checkpoints next to the output while it runs, removed once the model is saved
    r = cli(*base[:-1], tmp_path / "ce-ckpt", "--init", tiny_cross_encoder_dir, "--config", cfg,
            "--checkpoint-steps", "1")
    assert r.code == 0, r.err
    assert (tmp_path / "ce-ckpt" / "model.safetensors").exists() and not (tmp_path / "ce-ckpt.checkpoints").exists()
    assert json.loads((tmp_path / "ce-ckpt" / "ragsieve_training.json").read_text())["resumed_from_step"] is None
    # from an encoder (a new, random head) there is nothing to distil: the default is off, asking for it is refused
    encoder = tmp_path / "encoder"
    shutil.copytree(get_embedded("all-minilm-l6-v2").path(), encoder)
    r = cli(*base[:-1], tmp_path / "ce-enc", "--init", encoder, "--config", cfg, "--distill-weight", "1")
    assert r.code == 2 and "needs a trained cross-encoder" in r.err and len(r.err.strip().splitlines()) == 1, r.err


@requires_data
def test_guard_study_end_to_end_tiny_and_resumes(tmp_path):
    """Two variants on 2 preference records (10 groups), 2 datasets × 3 held-out queries; a rerun redoes nothing."""
    import shutil

    from ragsieve.prefs import read_preferences, write_preferences
    from studies.runner import run_experiment_file
    from tests.conftest import REPO

    committed = REPO / "results" / "rerank_align_guard" / "prefs"
    prefs = tmp_path / "prefs"
    prefs.mkdir()
    write_preferences(prefs / "prefs_train.jsonl", read_preferences(committed / "prefs_train.jsonl")[:2])
    write_preferences(prefs / "prefs_test.jsonl", read_preferences(committed / "prefs_test.jsonl")[:4])
    shutil.copy(committed / "shifts.jsonl", prefs / "shifts.jsonl")
    out = tmp_path / "study"
    cfg = tmp_path / "guard.yaml"
    cfg.write_text(
        f"experiment: rerank_align_guard\nout_dir: {out}\nparams:\n  prefs_dir: {prefs}\n"
        "  train: {group_size: 3, batch_size: 8, max_length: 64, query_max_tokens: 32}\n"
        "  variants: {unguarded: {}, replay+distill: {replay_ratio: 0.5, distill_weight: 1.0, eval_steps: 2}}\n"
        f"  gold: {{mined_dir: {tmp_path / 'no-mined'}, replay_per_dataset: 4, dev_per_dataset: 2}}\n"
        "  datasets: [hotpotqa-distractor, fever]\n  forgetting_max_queries: 3\n  eval_max_length: 64\n"
        "  bootstrap: 200\n")
    result = run_experiment_file(cfg)
    assert set(result["variants"]) == {"unguarded", "replay+distill"}
    guarded = result["variants"]["replay+distill"]
    assert guarded["training"]["replay_rows"] > 0 and guarded["training"]["dev_history"]
    assert guarded["prefs_test"]["n"] == 4 and guarded["prefs_test"]["vs_base"]["P@1"]["test"] == "exact McNemar"
    assert set(guarded["forgetting"]["datasets"]) == {"hotpotqa-distractor", "fever"}
    assert set(guarded["forgetting"]["datasets"]["fever"]["rankers"]) == {"base", "replay+distill", "base-ce"}
    assert result["gold_groups"]["fever"]["source"] == "relevance train split"
    assert result["best_guard"]["best"] in (None, "unguarded", "replay+distill")
    table = (out / "forgetting.md").read_text()
    assert table.count("(3) | base |") == 2 and table.count("| | base-ce |") == 2  # one per dataset
    saved = {p.name: p.stat().st_mtime_ns for p in (out / "variants").iterdir()}
    assert set(saved) == {"unguarded.json", "replay+distill.json"}
    again = run_experiment_file(cfg)  # every variant is done: nothing trains or scores again
    assert again["best_guard"] == result["best_guard"]
    assert {p.name: p.stat().st_mtime_ns for p in (out / "variants").iterdir()} == saved
