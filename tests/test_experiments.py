from __future__ import annotations

import json
from pathlib import Path
import shutil

import pytest

from ragsieve.errors import RagsieveError
from studies.runner import run_experiment_file
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


def test_every_experiment_file_validates():
    """Each experiments/*.yaml naming a study is valid for that study's config (nothing runs, nothing is written)."""
    from ragsieve.config import build_config, read_mapping
    from studies.runner import ExperimentFile, load_experiment
    from tests.conftest import REPO

    checked = []
    for path in sorted((REPO / "experiments").glob("*.yaml")):
        data = read_mapping(path)
        if "experiment" not in data:  # sieve_default.yaml is a `ragsieve fit` config (bench/fit.py)
            continue
        spec = build_config(ExperimentFile, data, source=str(path))
        build_config(load_experiment(spec.experiment).Config, spec.params, source=f"{path}: params")
        checked.append(path.name)
    assert {"rerank_align.yaml", "rerank_align_guard.yaml", "rerank_base.yaml"} <= set(checked)


def test_rerank_align_guard_config_refuses_bad_variants(tmp_path):
    cfg = tmp_path / "guard.yaml"
    cfg.write_text(f"experiment: rerank_align_guard\nout_dir: {tmp_path / 'never'}\n"
                   "params:\n  variants: {x: {replay_ratio: 1.5}}\n")
    with pytest.raises(RagsieveError, match="variant 'x': 'replay_ratio'"):
        run_experiment_file(cfg)
    cfg.write_text(f"experiment: rerank_align_guard\nout_dir: {tmp_path / 'never'}\n"
                   "params:\n  variants: {lora: {lora_rank: 8}}\n")
    with pytest.raises(RagsieveError, match="unknown key 'lora_rank'"):
        run_experiment_file(cfg)
    assert not (tmp_path / "never").exists()


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
    for key in ("auroc_q", "auroc_qc", "accuracy_q", "accuracy_qc", "counts", "diagnostics"):
        assert key in metrics
    qc = metrics["diagnostics"]["qc"]
    assert set(qc["probe_within"]) <= {"gold", "retrieved"} and "answer_in_question" in metrics["diagnostics"]["q"]
    assert qc["probe"]["auroc"] == metrics["auroc_qc"] or metrics["auroc_qc"] is None
    assert (probe_out / "calibration.png").stat().st_size > 0
    assert (probe_out / "probe" / "probe.safetensors").exists()
    # the probe (a training output, git-ignored) has its sha256 recorded for a rerun to check against
    recorded = json.loads((probe_out / "artifacts.json").read_text())["probe/probe.safetensors"]
    assert recorded["bytes"] == (probe_out / "probe" / "probe.safetensors").stat().st_size
    lines = (probe_out / "generations.jsonl").read_text().splitlines()
    assert len(lines) == 24 * 3  # closed + gold + 1 retrieved per question
    # a rerun resumes (nothing is generated twice); comparing with a copy of its own probe gives no difference
    shutil.copytree(probe_out / "probe", tmp_path / "same-probe")
    cfg.write_text(cfg.read_text() + f"  compare_to: [{tmp_path / 'same-probe'}]\n  n_boot: 50\n")
    again = run_experiment_file(cfg)
    assert len((probe_out / "generations.jsonl").read_text().splitlines()) == len(lines)
    same = again["compared"][str(tmp_path / "same-probe")]["qc"]
    assert same["diff"] == 0 and same["p_value"] in (None, 1.0) and same["verdict"] in (None, "no measurable difference")

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

    # mark the probe run's closed-book answers, to see them copied into rerank_align's generations
    gens_path = probe_out / "generations.jsonl"
    rows = [json.loads(x) for x in gens_path.read_text().splitlines()]
    gens_path.write_text("".join(json.dumps({**r, "generation": "copied " + r["generation"]} if r["variant"] == "closed"
                                            else r) + "\n" for r in rows))
    align = tmp_path / "align.yaml"
    align.write_text(
        f"experiment: rerank_align\nout_dir: {tmp_path / 'align'}\nparams:\n"
        f"  prefs: {{probe: {probe_out / 'probe'}, retriever: bm25, candidates: 6, train_questions: 6,"
        " test_questions: 3}\n"
        "  base:\n    sources:\n      hotpotqa-distractor: {train_questions: 3, test_questions: 2, test_fraction: 0.5}\n"
        f"    train: {{init: {tiny_cross_encoder_dir}, batch_size: 2, max_length: 128}}\n"
        "  train: {batch_size: 2, max_length: 128}\n"
        "  seeds: [0, 1]\n  exclude_base_trained: true\n"
        "  rag: {nq_questions: 3, hotpotqa_questions: 2, max_new_tokens: 2, max_prompt_tokens: 450,"
        f" grader: 'embedded:default', reuse_from: [{probe_out}], upper_bounds: true}}\n"
    )
    result = run_experiment_file(align)
    rankers = {"bm25", "bi-encoder", "base", "aligned", "aligned-seed1"}
    assert set(result["table1"]) == rankers and set(result["table1"]["aligned"]) >= {"P@1", "R@5", "MRR@3"}
    assert set(result["table1_stats"]["vs_base"]) == {"aligned", "aligned-seed1"}
    assert set(result["table2"]) == rankers | {"retriever", "aligned+grader"}
    cell = result["table2_stats"]["cells"]["aligned+grader"]["nq_top1"]
    assert cell["n"] == 3 and cell["ci95"][0] <= cell["accuracy"] <= cell["ci95"][1]
    assert set(result["table2_stats"]["paired"]) == {"aligned_vs_base", "aligned-seed1_vs_base", "sieve_vs_best_plain",
                                                     "sieve_vs_best_plain_any_k", "sieve_vs_aligned"}
    grader = result["rag"]["nq"]["grader"]["top3"]
    assert grader["gold_in_top_k"] <= 3 and (grader["gold_dropped_rate"] is None or 0 <= grader["gold_dropped_rate"] <= 1)
    assert len(result["seed_spread"]["table2:nq_top3"]["values"]) == 2
    assert result["excluded_base_trained"] >= 0 and result["rag"]["nq"]["questions"] == 3
    # the probe run's closed-book answers to the same questions were copied, not generated again
    made = [json.loads(x) for x in (tmp_path / "align" / "generations_nq.jsonl").read_text().splitlines()]
    closed_here = [g for g in made if g["variant"] == "closed"]
    assert closed_here and all(g["generation"].startswith("copied ") for g in closed_here)
    assert set(result["table2"]["aligned"]) == {"nq_top1", "nq_top3", "hotpotqa_top1", "hotpotqa_top3"}
    fixed = [r for r in result["table3"] if "beta_quantile" not in r]
    assert {(r["beta"], r["top_k"]) for r in fixed} == {(b, k) for b in (0.0, 0.9, 0.95, 0.98) for k in (1, 3)}
    by_quantile = sorted((r for r in result["table3"] if "beta_quantile" in r), key=lambda r: r["beta_quantile"])
    assert len(by_quantile) == 8 and all(0.0 <= r["rr"] <= 1.0 for r in by_quantile)
    # a higher β retrieves at least as often
    top1 = [r["rr"] for r in by_quantile if r["top_k"] == 1]
    assert top1 == sorted(top1)
    gold_at_1 = result["rag"]["nq"]["gold_at_1"]
    assert set(gold_at_1) == rankers | {"retriever", "aligned+grader"} and all(0.0 <= v <= 1.0 for v in gold_at_1.values())
    # the reference orders: gold first on every question, the probe's Inc where the test shifts hold it
    bounds = result["rag"]["nq"]["upper_bounds"]
    assert bounds["gold-first"]["questions"] == 3 and {"vs_base", "aligned_vs_base", "base"} <= set(
        bounds["gold-first"]["top1"])
    assert set(bounds) <= {"gold-first", "shift-order"} and "upper_bounds" in result["rag"]["hotpotqa"]
    assert (tmp_path / "align" / "model" / "ragsieve_aligned.json").exists()
    # the committed preference files hold ids and scores; the text-bearing ones stay in the ignored work/
    committed = [json.loads(x) for x in (tmp_path / "align" / "prefs" / "prefs_test.jsonl").read_text().splitlines()]
    assert all("query" not in r and "pos" not in r and r["query_id"] for r in committed)
    assert (tmp_path / "align" / "work" / "prefs" / "prefs_test.jsonl").is_file()
    assert (tmp_path / "align" / "rag_accuracy.png").stat().st_size > 0
    tables = (tmp_path / "align" / "tables.md").read_text()
    assert "### Table 1" in tables and "aligned vs base" in tables and "gold-first" in tables and "nan" not in tables
    assert "sieve vs aligned" in tables and "sieve's grader" in tables
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


# the knowledge-boundary studies at issue #15's sample sizes (they replaced the 1,000- / 250- /
# 150-question runs of the same names)
STUDY_CONFIGS = ("probe_nq", "cbdr_nq", "probe_hotpotqa", "cbdr_hotpotqa", "rerank_align")


@pytest.mark.parametrize("name", STUDY_CONFIGS)
def test_study_configs_validate(name):
    """The committed configs parse into their study's config and keep the issue's sizes."""
    from ragsieve.config import build_config, read_mapping
    from studies.runner import ExperimentFile, load_experiment
    from tests.conftest import REPO

    path = REPO / "experiments" / f"{name}.yaml"
    spec = build_config(ExperimentFile, read_mapping(path), source=str(path))
    cfg = build_config(load_experiment(spec.experiment).Config, spec.params, source=str(path))
    assert spec.out_dir == f"results/{name}"
    if name.startswith("probe"):
        assert cfg.n_questions == 0 and cfg.layer_sweep == "all" and cfg.n_boot >= 1000
        assert cfg.state_cache.startswith(f"results/{name}/work/")  # git-ignored, next to the run
        for path in cfg.compare_to:  # a compared probe is a git-ignored training output next to the run, by sha256
            rel = Path(path).relative_to(f"results/{name}")
            assert f"{rel}/probe.safetensors" in json.loads((REPO / f"results/{name}/artifacts.json").read_text())
    if name.startswith("cbdr"):
        assert cfg.min_questions >= 500 and cfg.reuse_probe_generations
        assert cfg.probe_results == f"results/probe_{name.removeprefix('cbdr_')}"
    if name == "rerank_align":  # issue #15's sizes, on the probe run's split
        assert cfg.prefs.train_questions >= 1000 and cfg.prefs.test_questions >= 300 and len(cfg.seeds) == 3
        assert cfg.prefs.split_file == "results/probe_nq/split.json"
        assert cfg.rag.nq_question_split == "results/probe_nq/split.json:test" and cfg.rag.nq_questions >= 500
        assert cfg.init == "embedded:base" and cfg.rag.grader and cfg.train.cosine_mix and cfg.exclude_base_trained


@requires_data
def test_questions_the_base_reranker_trained_on_are_known_from_its_card():
    """The shipped base reranker's training questions are recomputed from its card's recipe; the scale
    tables' NQ test ids minus them still leave the issue's >= 500 questions."""
    from ragsieve.benchmarks.mining import trained_question_ids
    from ragsieve.rerank.shipped import base_reranker_dir
    from tests.conftest import REPO

    trained = trained_question_ids("nq-oracle", base_reranker_dir())
    assert len(trained) == 1000
    test = set(json.loads((REPO / "results" / "probe_nq" / "split.json").read_text())["test"])
    from ragsieve.data import load_dataset

    oracle_test = {q.id for q in load_dataset("nq-oracle").questions} & test
    assert len(oracle_test - trained) >= 500
    assert trained_question_ids("nq-open", base_reranker_dir()) == set()  # not mined


@requires_data
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.UndefinedMetricWarning")  # tiny dev/test splits
def test_probe_layer_sweep_on_mixed_sources_then_gate_table(tmp_path, tiny_llm_dir, monkeypatch):
    """The scale options end to end on a tiny LLM: NQ-oracle + NQ-open, every layer captured while
    answering and swept on dev with intervals, then Table 3 reusing the probe's stored answers; reruns resume."""
    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path / "cache"))
    # A random tiny LLM is never right; label by gold-answer length parity so both classes exist.
    monkeypatch.setattr("ragsieve.eval.qa.contains_answer", lambda pred, golds: len(golds[0]) % 2 == 1)
    probe_out = tmp_path / "probe"
    cfg = tmp_path / "probe.yaml"
    cfg.write_text(
        f"experiment: probe_nq\nout_dir: {probe_out}\nparams:\n  llm: {tiny_llm_dir}\n  retriever: bm25\n"
        "  extra_datasets: [nq-open]\n  n_questions: 40\n  layer_sweep: all\n  n_boot: 30\n"
        f"  state_cache: {probe_out / 'work' / 'states.sqlite'}\n"
        "  max_new_tokens: 2\n  max_prompt_tokens: 450\n  train: {epochs: 2}\n"
    )
    metrics = run_experiment_file(cfg)
    sweep = metrics["layer_sweep"]
    assert [r["layer"] for r in sweep["by_layer"]] == [1, 2, 3, 4] and metrics["layer"] == sweep["chosen_layer"]
    row = sweep["by_layer"][0]
    assert set(row["dev"]) == set(row["test"]) == {"all", "q", "qc"} and {"low", "high"} <= set(row["test"]["qc"])
    assert len(metrics["auroc_qc_ci95"]) == 2 and sweep["states_recomputed"] == 0  # captured while answering
    by_source = {k: v["questions_by_source"] for k, v in metrics["counts"].items()}
    assert sum(s["nq-open"] for s in by_source.values()) > 0
    gens = [json.loads(x) for x in (probe_out / "generations.jsonl").read_text().splitlines()]
    split = json.loads((probe_out / "split.json").read_text())
    assert sum(len(v) for v in split.values()) == 40
    open_only = {g["question_id"] for g in gens} - {g["question_id"] for g in gens if g["variant"] == "gold"}
    assert open_only and len(gens) == 40 * 2 + (40 - len(open_only))  # no gold prompt without a gold passage

    heads = probe_out / "work" / "heads"
    stamps = {p.name: p.stat().st_mtime_ns for p in heads.glob("*/probe.safetensors")}
    again = run_experiment_file(cfg)  # resumes: no answer, no state and no layer's head is made again
    assert len((probe_out / "generations.jsonl").read_text().splitlines()) == len(gens)
    assert {p.name: p.stat().st_mtime_ns for p in heads.glob("*/probe.safetensors")} == stamps
    assert again["layer_sweep"]["by_layer"] == sweep["by_layer"] and again["auroc_qc"] == metrics["auroc_qc"]

    # a second study reuses the first one's stored answers (same LLM and answer settings) instead of answering
    reuse = tmp_path / "reuse.yaml"
    body = cfg.read_text().replace(str(probe_out), str(tmp_path / "probe2"))
    reuse.write_text(body + f"  reuse_generations_from: [{probe_out}]\n")
    assert run_experiment_file(reuse)["generations_reused"] == len(gens)
    assert (tmp_path / "probe2" / "generations.jsonl").read_text().count("\n") == len(gens)
    longer = body.replace("max_new_tokens: 2", "max_new_tokens: 3")
    reuse.write_text(longer + f"  reuse_generations_from: [{probe_out}]\n")
    with pytest.raises(RagsieveError, match="max_new_tokens=2 there, 3 here"):
        run_experiment_file(reuse)

    cbdr = tmp_path / "cbdr.yaml"
    cbdr.write_text(
        f"experiment: cbdr_nq\nout_dir: {tmp_path / 'cbdr'}\nparams:\n  probe_results: {probe_out}\n"
        "  retriever: bm25\n  max_new_tokens: 2\n  betas: [0.0, 0.5, 1.0]\n  n_boot: 30\n  random_draws: 50\n"
        "  reuse_probe_generations: true\n"
    )
    result = run_experiment_file(cbdr)
    n = result["n_questions"]
    assert 0 < n < len(split["test"])  # NQ-open test questions have no passage to retrieve: left out
    assert result["generations_reused_from_probe"] >= n  # every closed-book answer came from the probe run
    assert len(result["table3"]) == 3 * 2 and {"ci95", "random", "vs_always_retrieve"} <= set(result["table3"][0])
    for k in ("top1", "top3"):
        ci = result["skip_at_parity_ci95"][k]
        assert ci["low"] <= ci["skip"] <= ci["high"] and 0.0 <= result["oracle_gate"][k]["accuracy"] <= 1.0


def test_grouped_auroc_helpers():
    """The grouped AUROC interval and paired difference: doctests, and a paired bootstrap that is paired."""
    import doctest

    import numpy as np

    from ragsieve.eval import stats
    from ragsieve.eval.stats import auroc_difference

    assert doctest.testmod(stats).failed == 0
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    groups = np.arange(400) // 2
    good = y + rng.normal(0, 0.8, 400)
    same = auroc_difference(y, good, good.copy(), groups, n_boot=200)
    assert same["diff"] == 0 and same["p_value"] == 1.0 and same["low"] == same["high"] == 0
    noisy = good + rng.normal(0, 2.0, 400)
    d = auroc_difference(y, good, noisy, groups, n_boot=200)
    assert d["diff"] > 0.1 and d["low"] > 0 and d["p_value"] < 0.05
