from __future__ import annotations

import json

import pytest

from ragsieve.errors import RagsieveError
from ragsieve.studies.runner import run_experiment_file
from tests.conftest import requires_data


def test_unknown_experiment_and_bad_params(tmp_path):
    cfg = tmp_path / "x.yaml"
    cfg.write_text("experiment: nope\nout_dir: out\n")
    with pytest.raises(RagsieveError, match="unknown experiment 'nope'"):
        run_experiment_file(cfg)
    cfg.write_text("experiment: probe_nq\nout_dir: out\nparams: {n_question: 3}\n")
    with pytest.raises(RagsieveError, match="unknown key 'n_question'"):
        run_experiment_file(cfg)
    cfg.write_text("experiment: probe_nq\noutdir: out\n")
    with pytest.raises(RagsieveError, match="unknown key 'outdir'"):
        run_experiment_file(cfg)


@requires_data
def test_probe_then_cbdr_then_rerank_align_smoke(tmp_path, tiny_llm_dir, tiny_cross_encoder_dir, monkeypatch):
    """Probe → CBDR → rerank_align end to end on tiny models and BM25: files, keys, resumability."""
    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path / "cache"))
    # A random tiny LLM is never right; label by gold-answer length parity so both classes exist.
    monkeypatch.setattr("ragsieve.eval.qa.contains_answer", lambda pred, golds: len(golds[0]) % 2 == 1)
    probe_out = tmp_path / "probe"
    cfg = tmp_path / "probe.yaml"
    cfg.write_text(
        f"experiment: probe_nq\nout_dir: {probe_out}\nparams:\n  llm: {tiny_llm_dir}\n  retriever: bm25\n"
        "  n_questions: 24\n  max_new_tokens: 2\n  max_prompt_tokens: 450\n  train: {epochs: 2}\n"
    )
    metrics = run_experiment_file(cfg)
    for key in ("auroc_q", "auroc_qc", "accuracy_q", "accuracy_qc", "counts"):
        assert key in metrics
    assert (probe_out / "calibration.png").stat().st_size > 0
    assert (probe_out / "probe" / "probe.safetensors").exists()
    lines = (probe_out / "generations.jsonl").read_text().splitlines()
    assert len(lines) == 24 * 3  # closed + gold + 1 retrieved per question
    run_experiment_file(cfg)  # a rerun resumes: nothing is generated twice
    assert len((probe_out / "generations.jsonl").read_text().splitlines()) == len(lines)

    cbdr = tmp_path / "cbdr.yaml"
    cbdr.write_text(
        f"experiment: cbdr_nq\nout_dir: {tmp_path / 'cbdr'}\nparams:\n  probe_results: {probe_out}\n"
        "  retriever: bm25\n  max_new_tokens: 2\n  max_prompt_tokens: 450\n  betas: [0.0, 0.5, 1.0]\n"
    )
    result = run_experiment_file(cbdr)
    assert len(result["sweep"]) == 3 * 2
    row = next(r for r in result["sweep"] if r["beta"] == 1.0 and r["top_k"] == 1)
    assert row["rr"] == 1.0 and row["accuracy"] == result["always_retrieve_accuracy"]["top1"]
    assert 0.0 <= result["skip_at_parity"] <= 1.0
    saved = json.loads((tmp_path / "cbdr" / "metrics.json").read_text())
    assert saved["n_questions"] == result["n_questions"] > 0
    assert (tmp_path / "cbdr" / "accuracy_vs_rr.png").stat().st_size > 0

    align = tmp_path / "align.yaml"
    align.write_text(
        f"experiment: rerank_align\nout_dir: {tmp_path / 'align'}\nparams:\n"
        f"  prefs: {{probe: {probe_out / 'probe'}, retriever: bm25, candidates: 6, train_questions: 6,"
        " test_questions: 3}\n"
        "  base:\n    sources:\n      hotpotqa-distractor: {train_questions: 3, test_questions: 2, test_fraction: 0.5}\n"
        f"    train: {{init: {tiny_cross_encoder_dir}, batch_size: 2, max_length: 128}}\n"
        "  train: {batch_size: 2, max_length: 128}\n"
        "  rag: {nq_questions: 3, hotpotqa_questions: 2, max_new_tokens: 2, max_prompt_tokens: 450}\n"
    )
    result = run_experiment_file(align)
    rankers = {"bm25", "bi-encoder", "base", "aligned"}
    assert set(result["table1"]) == rankers and set(result["table1"]["aligned"]) >= {"P@1", "R@5", "MRR@3"}
    assert set(result["table2"]) == rankers | {"retriever"}
    assert set(result["table2"]["aligned"]) == {"nq_top1", "nq_top3", "hotpotqa_top1", "hotpotqa_top3"}
    fixed = [r for r in result["table3"] if "beta_quantile" not in r]
    assert {(r["beta"], r["top_k"]) for r in fixed} == {(b, k) for b in (0.0, 0.9, 0.95, 0.98) for k in (1, 3)}
    by_quantile = sorted((r for r in result["table3"] if "beta_quantile" in r), key=lambda r: r["beta_quantile"])
    assert len(by_quantile) == 8 and all(0.0 <= r["rr"] <= 1.0 for r in by_quantile)
    # a higher β retrieves at least as often
    top1 = [r["rr"] for r in by_quantile if r["top_k"] == 1]
    assert top1 == sorted(top1)
    gold_at_1 = result["rag"]["nq"]["gold_at_1"]
    assert set(gold_at_1) == rankers | {"retriever"} and all(0.0 <= v <= 1.0 for v in gold_at_1.values())
    assert (tmp_path / "align" / "model" / "ragsieve_aligned.json").exists()
    assert (tmp_path / "align" / "rag_accuracy.png").stat().st_size > 0
    assert (tmp_path / "align" / "cbdr_aligned.png").stat().st_size > 0
    # a rerun trains nothing and answers nothing again
    stamp = (tmp_path / "align" / "model" / "ragsieve_aligned.json").stat().st_mtime_ns
    n_gen = len((tmp_path / "align" / "generations_nq.jsonl").read_text().splitlines())
    assert run_experiment_file(align)["table2"] == result["table2"]
    assert (tmp_path / "align" / "model" / "ragsieve_aligned.json").stat().st_mtime_ns == stamp
    assert len((tmp_path / "align" / "generations_nq.jsonl").read_text().splitlines()) == n_gen


def test_bad_study_values_are_refused_before_out_dir_exists(tmp_path):
    from ragsieve.errors import RagsieveError

    out = tmp_path / "never"
    cfg = tmp_path / "evolve.yaml"
    cfg.write_text(f"experiment: evolve\nout_dir: {out}\nparams:\n  rounds: -3\n")
    with pytest.raises(RagsieveError, match="rounds"):
        run_experiment_file(cfg)
    assert not out.exists()
