"""The relevance grader: losses, sampling, prompt budget, every grader kind, judge, data, experiment, CLI.

Unit tests run on the tiny random Llama from conftest (one torch thread: the machine is
shared); the one ``integration`` test loads the real SmolLM2.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from tests.conftest import requires_data

# Small prompts: the tiny BPE tokenizer spends ~1 token per character.
TINY = {"max_length": 400, "max_passage_tokens": 64, "max_query_tokens": 32}
QUERIES = ["who wrote hamlet", "capital of france", "who wrote hamlet", "capital of france"] * 4
PASSAGES = ["Hamlet was written by William Shakespeare", "the quick brown fox", "Paris is the capital of France",
            "the lazy dog"] * 4
LABELS = [1, 0, 1, 0] * 4


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models run fastest on one thread when the cores are busy with other jobs."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def index_cache(tmp_path_factory):
    """One cache dir for the module, so the data and experiment tests build each BM25 index once."""
    return tmp_path_factory.mktemp("grade-cache")


@pytest.fixture
def new(tiny_llm_dir):
    from ragsieve.registry import new_grader

    def make(kind: str, **options):
        return new_grader(kind, str(tiny_llm_dir), **{**TINY, **options})

    return make


# -- losses and sampling -------------------------------------------------------------------------


def test_contrastive_margin_loss_matches_hand_computation():
    import torch

    from ragsieve.grade.losses import LOSSES, ContrastiveMarginLoss, CrossEntropyLoss

    loss = ContrastiveMarginLoss(margin=1.0)
    # o = [.5, .5]: pull |o - e1|^2 = .5, push (1 - |o - e0|)^2 = (1 - sqrt(.5))^2
    assert float(loss(torch.tensor([[0.0, 0.0]]), torch.tensor([1]))) == pytest.approx(0.5 + (1 - 0.5**0.5) ** 2)
    # confidently right: nothing to pull, the other label is sqrt(2) > m away → ~0
    assert float(loss(torch.tensor([[-20.0, 20.0]]), torch.tensor([1]))) == pytest.approx(0.0, abs=1e-6)
    # confidently wrong: pull |e0 - e1|^2 = 2, push (1 - 0)^2 = 1
    assert float(loss(torch.tensor([[20.0, -20.0]]), torch.tensor([1]))) == pytest.approx(3.0, abs=1e-6)
    # batch = mean of rows
    both = loss(torch.tensor([[0.0, 0.0], [-20.0, 20.0]]), torch.tensor([1, 1]))
    assert float(both) == pytest.approx((0.5 + (1 - 0.5**0.5) ** 2) / 2)
    assert float(CrossEntropyLoss()(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))) == pytest.approx(np.log(2))
    assert set(LOSSES) == {"cross_entropy", "contrastive"}
    with pytest.raises(ValueError, match="margin"):
        ContrastiveMarginLoss(margin=0)


def test_sampling_switches():
    from ragsieve.grade.train import resample_indices

    labels = np.array([1, 0, 0, 0, 0, 1, 0, 0])
    assert resample_indices(labels, "none").tolist() == list(range(8))
    over = resample_indices(labels, "oversample", seed=1)
    assert (labels[over] == 1).sum() == (labels[over] == 0).sum() == 6 and set(over) == set(range(8))
    under = resample_indices(labels, "undersample", seed=1)
    assert (labels[under] == 1).sum() == (labels[under] == 0).sum() == 2 and len(set(under)) == 4
    assert resample_indices(labels, "undersample", seed=1).tolist() == under.tolist()  # deterministic
    with pytest.raises(RagsieveError, match="both labels"):
        resample_indices([1, 1], "none")
    with pytest.raises(RagsieveError, match="unknown sampling 'smote'"):
        resample_indices(labels, "smote")


def test_parse_verdict():
    from ragsieve.grade.prompt import parse_verdict

    assert [parse_verdict(a) for a in ("Yes.", "yes, it answers it", "NO", "No, it is about cats.")] == [1, 1, 0, 0]
    assert parse_verdict("The document is not relevant to the question") == 0
    assert parse_verdict("Relevant") == 1 and parse_verdict("irrelevant") == 0
    assert parse_verdict("I cannot tell") is None and parse_verdict("") is None


# -- input policy: truncation and empty passages --------------------------------------------------


def test_truncation_is_counted_and_prompt_fits(new):
    grader = new("prompted", max_passage_tokens=20)
    long_text = "the quick brown fox jumps over the lazy dog " * 20
    prompts = grader.encode(["who wrote hamlet", "who wrote hamlet"], [long_text, "fox"])
    assert [p.passage_truncated for p in prompts] == [True, False]
    assert grader.stats.truncated_passages == 1
    assert len(prompts[0].input_ids) <= TINY["max_length"]
    grader.score_pairs(["q " * 200], ["fox"])  # an over-long query is cut too, and counted
    assert grader.stats.truncated_queries == 1
    with pytest.raises(RagsieveError, match="raise max_length"):
        new("prompted", max_length=50).score_pairs(["who"], ["fox"])


def test_empty_passage_is_not_relevant_with_score_zero(new):
    grader = new("classifier")
    results = grader.grade("who wrote hamlet", ["", "   ", Passage("p", "", "Title only"), "Hamlet is a play"])
    assert [r.relevant for r in results[:3]] == [False, False, False]
    assert [r.score for r in results[:3]] == [0.0, 0.0, 0.0]
    assert 0.0 < results[3].score < 1.0
    assert grader.stats.empty_passages == 3 and grader.stats.pairs == 4
    assert grader.grade("who", []) == []
    with pytest.raises(RagsieveError, match="empty query"):
        grader.grade("  ", ["text"])


# -- graders: training, save/load, refusal ------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "options", "train"),
    [
        ("generative", {}, {"lr": 3e-3, "max_steps": 8}),
        ("classifier", {}, {"lr": 3e-3, "max_steps": 8, "loss": "contrastive"}),
        ("head", {}, {"lr": 3e-2, "epochs": 30, "batch_size": 16}),  # full batch: a convex fit
        ("lora", {"lora_r": 4, "lora_alpha": 16}, {"lr": 1e-2, "max_steps": 16, "sampling": "oversample"}),
    ],
)
def test_grader_trains_saves_and_loads(new, tmp_path, kind, options, train):
    from ragsieve.registry import load_grader
    from ragsieve.grade.train import GraderTrainConfig

    import torch

    torch.manual_seed(0)  # LoRA's init draws from the global generator: whatever ran before on this worker
    grader = new(kind, **options)
    before = grader.score_pairs(QUERIES[:4], PASSAGES[:4])
    result = grader.fit(QUERIES, PASSAGES, LABELS, GraderTrainConfig(**{"batch_size": 8, **train}))
    assert result.steps > 0 and len(result.losses) == result.steps
    assert result.final_loss < result.first_loss  # the loss moves
    after = grader.score_pairs(QUERIES[:4], PASSAGES[:4])
    assert not np.allclose(before, after)
    assert grader.config.trained["steps"] == result.steps

    grader.save(tmp_path / kind)
    loaded = load_grader(tmp_path / kind)
    assert type(loaded) is type(grader) and loaded.config.kind == kind
    np.testing.assert_allclose(loaded.score_pairs(QUERIES[:4], PASSAGES[:4]), after, atol=1e-5)
    saved = json.loads((tmp_path / kind / "grader_config.json").read_text())
    assert saved["base"] == grader.config.base and saved["hidden_size"] == 32


def test_head_on_cached_states_equals_full_scoring_and_prompted_reads_the_same_states(new):
    from ragsieve.grade.train import GraderTrainConfig

    head = new("head")
    states = head.final_states(QUERIES, PASSAGES)
    head.fit_states(states, LABELS, GraderTrainConfig(lr=1e-2, epochs=2))
    np.testing.assert_allclose(head.state_scores(states[:4]), head.score_pairs(QUERIES[:4], PASSAGES[:4]), atol=1e-5)
    prompted = new("prompted")
    np.testing.assert_allclose(
        prompted.scores_from_states(states[:4]), prompted.score_pairs(QUERIES[:4], PASSAGES[:4]), atol=1e-5
    )
    with pytest.raises(RagsieveError, match="not trained"):
        prompted.fit(QUERIES, PASSAGES, LABELS)


def test_batching_does_not_change_scores(new):
    grader = new("classifier")
    passages = ["a much longer passage about the quick brown fox " * 3, "fox", "dog", "x"]
    batched = grader.score_pairs(QUERIES[:4], passages)
    single = [grader.score_pairs([q], [p])[0] for q, p in zip(QUERIES[:4], passages)]
    np.testing.assert_allclose(batched, single, atol=1e-5)


def test_load_refuses_mismatches(new, tmp_path):
    from ragsieve.registry import load_grader, new_grader
    from ragsieve.grade.train import GraderTrainConfig

    grader = new("head")
    grader.fit(QUERIES[:8], PASSAGES[:8], LABELS[:8], GraderTrainConfig(lr=1e-2, max_steps=1))
    folder = grader.save(tmp_path / "g")
    with pytest.raises(RagsieveError, match="was trained on 'hf:.*', not 'embedded:smollm2-135m-instruct'"):
        load_grader(folder, base="embedded:smollm2-135m-instruct")
    assert load_grader(folder, base=grader.config.base).config.kind == "head"

    config = json.loads((folder / "grader_config.json").read_text())
    (folder / "grader_config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    with pytest.raises(RagsieveError, match="32 wide; retrain"):
        load_grader(folder)
    (folder / "grader_config.json").write_text(json.dumps({**config, "kind": "magic"}))
    with pytest.raises(RagsieveError, match="unknown grader kind 'magic'"):
        load_grader(folder)
    (folder / "grader_config.json").write_text(json.dumps({**config, "colour": "red"}))
    with pytest.raises(RagsieveError, match="unknown key 'colour'"):
        load_grader(folder)
    (folder / "grader_config.json").write_text(json.dumps(config))
    (folder / "grader.safetensors").unlink()
    with pytest.raises(RagsieveError, match="grader.safetensors, which is missing"):
        load_grader(folder)
    with pytest.raises(RagsieveError, match="no grader at .*nothing; train one"):
        load_grader(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RagsieveError, match="not a saved grader"):
        load_grader(tmp_path / "empty")
    with pytest.raises(RagsieveError, match="no grader named 'nope' is shipped or cached.*grader train"):
        load_grader("embedded:nope")
    with pytest.raises(RagsieveError, match="endpoint"):
        new_grader("classifier", "openai:http://127.0.0.1:9/v1#x")
    with pytest.raises(RagsieveError, match="lora_r and lora_alpha"):
        new("lora")


def test_threshold_baselines_cosine_and_cross_encoder(tmp_path):
    import shutil

    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from ragsieve.registry import load_grader, new_grader
    from ragsieve.models import get_embedded

    cosine = new_grader("cosine")  # embedded MiniLM
    threshold = cosine.fit(QUERIES, PASSAGES, LABELS)
    assert cosine.threshold == threshold
    results = cosine.grade("who wrote hamlet", ["Hamlet was written by William Shakespeare", "the lazy dog", ""])
    assert [r.relevant for r in results] == [True, False, False] and results[2].score == 0.0
    cosine.save(tmp_path / "cos")
    assert not (tmp_path / "cos" / "grader.safetensors").exists()  # nothing but a threshold to keep
    assert load_grader(tmp_path / "cos").threshold == threshold

    # A tiny random 1-logit BERT stands in for the reranker issue's cross-encoder.
    src = get_embedded("all-minilm-l6-v2").path()
    ce_dir = tmp_path / "ce"
    ce_dir.mkdir()
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(src / name, ce_dir / name)
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        num_labels=1,
    )).save_pretrained(ce_dir)
    cross = new_grader("cross-encoder", str(ce_dir))
    cross.fit(QUERIES, PASSAGES, LABELS)
    scores = cross.score_pairs(QUERIES[:4], PASSAGES[:4])
    cross.save(tmp_path / "ce-grader")
    loaded = load_grader(tmp_path / "ce-grader")
    np.testing.assert_allclose(loaded.score_pairs(QUERIES[:4], PASSAGES[:4]), scores, atol=1e-5)
    assert loaded.threshold == cross.threshold
    with pytest.raises(RagsieveError, match="needs a base model"):
        new_grader("cross-encoder")

    from ragsieve.pipeline.stages import SieveStages

    passages = [Passage("a", "Hamlet was written by William Shakespeare"), Passage("b", "the lazy dog")]
    grading = SieveStages(grader=cosine)  # the grader as the sieve's only stage
    stage = grading.apply("who wrote hamlet", passages)
    assert [p.id for p in stage.kept] == ["a"] and stage.graded_out == 1 and not stage.all_dropped
    assert grading.apply("who wrote hamlet", passages[1:]).all_dropped
    assert not grading.apply("who wrote hamlet", []).all_dropped  # nothing retrieved ≠ all dropped


# -- LLM judge against a real HTTP server on loopback --------------------------------------------


def _judge_reply(body) -> str:
    document = body["messages"][-1]["content"].split("DOCUMENT:\n", 1)[1]
    return "Yes, it is." if document.startswith("relevant") else "No." if document.startswith("off") else "Hmm?"


@pytest.fixture
def judge_server(chat_server_factory):
    return chat_server_factory(_judge_reply)


def test_judge_labels_survive_an_endpoint_outage_and_resume(judge_server, tmp_path):
    from ragsieve.grade.dataset import GradingPair
    from ragsieve.grade.judge import LLMJudge
    from ragsieve.models import OpenAIChatLLM

    texts = ["relevant: Shakespeare wrote it", "off topic", "unclear text", "relevant again", "off again"]
    pairs = [GradingPair(f"q|p{i}", "s", "q", "who wrote hamlet", f"p{i}", t, i, 0.5, 0, 0)
             for i, t in enumerate(texts)]
    store = tmp_path / "judge.jsonl"
    llm = OpenAIChatLLM(f"openai:{judge_server.url}#judge", retries=1, backoff=0.01, timeout=5)

    judge_server.answer_limit = 2  # then the endpoint goes down
    with pytest.raises(RagsieveError, match=r"unavailable after 2 tries.*2 label\(s\) are saved in .*rerun to resume"):
        LLMJudge(llm, store).label(pairs)
    assert len(store.read_text().splitlines()) == 2  # nothing answered was lost

    judge_server.answer_limit = None  # back up
    report = LLMJudge(llm, store).label(pairs)
    assert len(judge_server.calls) == 5  # 2 before the outage + only the 3 missing ones
    assert report.reused == 2 and report.judged == 3
    assert report.labels == {"q|p0": 1, "q|p1": 0, "q|p3": 1, "q|p4": 0}
    assert report.unparseable_ids == ["q|p2"] and report.summary()["unparseable"] == 1
    assert "analyze the DOCUMENT and determine whether it is relevant to answering the QUESTION" in (
        judge_server.messages[0].replace("Analyze", "analyze")
    )
    LLMJudge(llm, store).label(pairs)  # everything stored: no request at all
    assert len(judge_server.calls) == 5


def test_experiment_judge_teacher_relabels_and_reports_agreement(judge_server, tmp_path):
    from rich.console import Console

    from ragsieve.grade.dataset import GradingPair
    from studies.grader import GraderExperiment, GraderExperimentConfig

    texts = ["relevant: yes", "off topic", "unclear", "off again"]
    gold = [1, 1, 0, 0]
    pairs = [GradingPair(f"q|p{i}", "s", "q", "who", f"p{i}", t, i, 0.5, g, g)
             for i, (t, g) in enumerate(zip(texts, gold))]
    cfg = GraderExperimentConfig(teacher="judge", judge_llm=f"openai:{judge_server.url}#judge")
    judged, summary = GraderExperiment()._judge(cfg, pairs, tmp_path, Console(quiet=True))
    assert [(p.id, p.label, p.gold_label) for p in judged] == [("q|p0", 1, 1), ("q|p1", 0, 1), ("q|p3", 0, 0)]
    assert summary["unparseable"] == 1 and summary["dropped_unparseable"] == 1
    assert summary["agreement_with_gold"] == pytest.approx(2 / 3)
    assert (tmp_path / "judge_labels.jsonl").exists()


# -- dataset, experiment, CLI on the real benchmark files --------------------------------------------


@requires_data
def test_grading_dataset_from_three_sources(tmp_path, monkeypatch, index_cache):
    from ragsieve.grade.dataset import (
        GradingDataConfig, assign_splits, build_grading_pairs, label_skew, plot_score_histogram,
        read_grading_pairs, write_grading_pairs,
    )

    monkeypatch.setenv("RAGSIEVE_CACHE", str(index_cache))
    config = GradingDataConfig(sources=["nq-oracle", "fever", "hotpotqa-distractor"], queries_per_source=10,
                               retriever="bm25")
    pairs = assign_splits(build_grading_pairs(config), test_fraction=0.2)
    assert len(pairs) == 3 * 10 * 5 and {p.source for p in pairs} == set(config.sources)
    assert all(p.label == p.gold_label for p in pairs) and 0 < sum(p.label for p in pairs) < len(pairs)
    splits = {}
    for p in pairs:
        splits.setdefault(p.query_id, set()).add(p.split)
    assert all(len(s) == 1 for s in splits.values())  # no query on both sides
    assert sum(s == {"test"} for s in splits.values()) == 6  # 20 % of 30 queries
    skew = label_skew(pairs)
    assert set(skew["by_source"]) == set(config.sources) and skew["pairs"] == 150
    assert 0 < skew["positive_rate"] < 1 and set(skew["by_split"]) == {"train", "test"}
    assert plot_score_histogram([p.score for p in pairs], [p.label for p in pairs], tmp_path / "h.png").stat().st_size
    write_grading_pairs(tmp_path / "pairs.jsonl", pairs)
    assert read_grading_pairs(tmp_path / "pairs.jsonl", split="test") == [p for p in pairs if p.split == "test"]


@requires_data
def test_experiment_end_to_end_and_resumable_per_config(tmp_path, tiny_llm_dir, monkeypatch, index_cache):
    from rich.console import Console

    from ragsieve.config import build_config
    from studies import grader as experiment_module
    from studies.grader import GraderExperiment, GraderExperimentConfig

    monkeypatch.setenv("RAGSIEVE_CACHE", str(index_cache))
    params = {
        "llm": str(tiny_llm_dir),
        "data": {"sources": ["nq-oracle", "fever", "hotpotqa-distractor"], "queries_per_source": 5,
                 "retriever": "bm25"},
        **TINY, "max_passage_tokens": 40,
        "train": {"max_steps": 2, "batch_size": 4},
        "configs": {"prompted": {"kind": "prompted"}, "A": {"kind": "generative"},
                    "B": {"kind": "head", "train": {"lr": 1e-3, "epochs": 1}}, "C": {"kind": "classifier"}},
        "lora_grid": {"ranks": [2], "alphas": [4, 8]},
        "samplings": ["none", "oversample"],
        "save_models": ["C"],
        "cosine_baseline": False,  # covered by its own test; MiniLM costs ~10 s here
    }
    cfg = build_config(GraderExperimentConfig, params)
    out = tmp_path / "grader"
    console = Console(quiet=True)
    metrics = GraderExperiment().run(cfg, out, console)

    names = {"prompted", "A", "B", "C", "B+contrastive", "C+contrastive", "C+oversample", "lora_r2_a4", "lora_r2_a8"}
    assert set(metrics["configs"]) == names
    for m in metrics["configs"].values():
        assert {"accuracy", "precision", "recall", "f1"} <= set(m)
    assert set(metrics["loss_comparison"]["C"]) == {"cross_entropy", "contrastive"}
    sampling = metrics["sampling_comparison"]["C"]
    assert sampling["none"] == {k: metrics["configs"]["C"][k] for k in ("accuracy", "precision", "recall", "f1")}
    assert sampling["oversample"]["f1"] == metrics["configs"]["C+oversample"]["f1"]
    assert [(r["rank"], r["alpha"]) for r in metrics["lora_grid"]] == [(2, 4), (2, 8)]
    assert metrics["label_skew"]["pairs"] == 75 and metrics["target"]["config"] == "C"
    assert all((out / "confusion" / f"{n}.png").stat().st_size > 0 for n in names)
    assert (out / "cosine_histogram.png").stat().st_size > 0
    assert (out / "models" / "C" / "grader.safetensors").exists()
    assert json.loads((out / "metrics.json").read_text())["configs"]["C"] == metrics["configs"]["C"]
    assert json.loads((out / "test_pairs.json").read_text())["labels"] == [p["label"] for p in (
        json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()) if p["split"] == "test"]
    # the report-only mode rebuilds the same metrics from the stored scores and test_pairs.json alone
    assert GraderExperiment().report(cfg, out, console)["configs"] == metrics["configs"]

    # A rerun trains nothing: every config's result was stored when it finished ...
    def no_training(*args, **kwargs):
        raise AssertionError("a finished config was trained again")

    monkeypatch.setattr(experiment_module._Runner, "_lm", no_training)
    monkeypatch.setattr(experiment_module._Runner, "_head", no_training)
    from ragsieve.grade import dataset as dataset_module

    real_build = dataset_module.build_grading_pairs
    def no_retrieval(*args, **kwargs):
        raise AssertionError("the stored pairs.jsonl should have been reused")

    monkeypatch.setattr(dataset_module, "build_grading_pairs", no_retrieval)
    assert GraderExperiment().run(cfg, out, console)["configs"] == metrics["configs"]
    # other data settings → the pairs are rebuilt, not reused
    built = []
    monkeypatch.setattr(dataset_module, "build_grading_pairs", lambda c, **k: built.append(c) or real_build(c, **k))
    changed = build_config(GraderExperimentConfig, {**params, "data": {**params["data"], "queries_per_source": 4}})
    other = tmp_path / "changed"
    other.mkdir()
    for name in ("pairs.jsonl", "pairs.json"):
        (other / name).write_bytes((out / name).read_bytes())
    pairs, _ = GraderExperiment()._pairs(changed, other, console)
    assert len(built) == 1 and len(pairs) == 3 * 4 * 5
    # ... and a changed config reruns only itself.
    (out / "configs" / "lora_r2_a8.json").unlink()
    calls = []
    def record(self, job):
        calls.append(job.name)
        return np.zeros(15), {}, None

    monkeypatch.setattr(experiment_module._Runner, "_lm", record)
    GraderExperiment().run(cfg, out, console)
    assert calls == ["lora_r2_a8"]

    with pytest.raises(RagsieveError, match="unknown key 'lrr'"):
        build_config(GraderExperimentConfig, {**params, "configs": {"C": {"kind": "classifier", "train": {"lrr": 1}}}})
    bad = build_config(GraderExperimentConfig, {**params, "loss_comparison": ["Z"]})
    with pytest.raises(RagsieveError, match="loss_comparison names 'Z'"):
        GraderExperiment().run(bad, tmp_path / "bad", console)
    bad = build_config(GraderExperimentConfig, {**params, "sampling_comparison": ["prompted"]})
    with pytest.raises(RagsieveError, match="sampling_comparison: 'prompted' is the prompted baseline"):
        GraderExperiment().run(bad, tmp_path / "bad", console)


def test_cli_train_eval_and_grade(tmp_path, tiny_llm_dir, cli):

    rows = [{"query": q, "passage": p, "label": y, "split": "train" if i < 12 else "test", "source": f"s{i // 2 % 2}"}
            for i, (q, p, y) in enumerate(zip(QUERIES, PASSAGES, LABELS))]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = tmp_path / "grader"
    result = cli(
        "grader", "train", "--pairs", pairs, "--out", model, "--kind", "head", "--base", tiny_llm_dir,
        "--lr", "0.01", "--epochs", "2", "--max-length", "400", "--max-passage-tokens", "48",
    )
    assert result.code == 0, result.err
    assert (model / "grader.safetensors").exists() and "head grader on 12 pairs" in result.out

    result = cli("grader", "eval", "--grader", model, "--pairs", pairs,
                 "--out", tmp_path / "m.json", "--confusion", tmp_path / "cm.png")
    assert result.code == 0, result.err
    metrics = json.loads(result.out.strip().splitlines()[0])
    assert metrics["n"] == 4 and {"accuracy", "precision", "recall", "f1"} <= set(metrics)
    assert (tmp_path / "cm.png").stat().st_size > 0
    by_source = json.loads((tmp_path / "m.json").read_text())["by_source"]
    assert set(by_source) == {"s0", "s1"} and all(m["n"] == 2 and m["base_rate"] == 0.5 for m in by_source.values())

    txt = tmp_path / "passages.txt"
    txt.write_text("Hamlet was written by William Shakespeare\n\nthe lazy dog\n")
    result = cli("grade", "who wrote hamlet", "--passages", txt, "--grader", model, "--json")
    assert result.code == 0, result.err
    graded = [json.loads(line) for line in result.out.strip().splitlines()]
    assert [g["id"] for g in graded] == ["0", "1"] and all(0 <= g["score"] <= 1 for g in graded)

    jl = tmp_path / "passages.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in ({"id": "a", "text": ""}, {"id": "b", "text": "fox"})))
    result = cli("grade", "who wrote hamlet", "--passages", jl, "--grader", model)
    assert result.code == 0, result.err
    assert "1 empty passage(s) graded not relevant" in result.out + result.err

    result = cli("grade", "q", "--passages", jl, "--grader", tmp_path / "none")
    assert result.code == 2 and "no grader at" in result.err
    (tmp_path / "p.csv").write_text("x")
    result = cli("grade", "q", "--passages", tmp_path / "p.csv", "--grader", model)
    assert result.code == 2 and ".jsonl or .txt" in result.err
    result = cli("grader", "train", "--pairs", pairs, "--out", model, "--kind", "svm")
    assert result.code == 2 and "unknown grader kind 'svm'" in result.err


@pytest.mark.integration
def test_smollm2_verdict_tokens_and_classifier_padding():
    from ragsieve.registry import new_grader

    prompted = new_grader("prompted", max_passage_tokens=64)
    assert prompted.verdict.true_id != prompted.verdict.false_id
    scores = prompted.score_pairs(["who wrote hamlet?"] * 2,
                                  ["Hamlet is a tragedy written by William Shakespeare.", "Paris is in France."])
    assert ((scores > 0) & (scores < 1)).all()
    classifier = new_grader("classifier", max_passage_tokens=64)
    passages = ["Hamlet is a tragedy written by William Shakespeare around 1600.", "Paris."]
    batched = classifier.score_pairs(["who wrote hamlet?"] * 2, passages)
    single = [classifier.score_pairs(["who wrote hamlet?"], [p])[0] for p in passages]
    np.testing.assert_allclose(batched, single, atol=1e-4)  # left padding + position ids: batch-invariant


@requires_data
def test_experiment_selects_and_ships_the_default_grader_at_a_precision_floor(tmp_path, tiny_llm_dir, monkeypatch,
                                                                             index_cache):
    """Every grader tuned on train for the best F1 at precision >= floor, compared on test with intervals;
    the best one that can ship is written as a grader folder that loads with its tuned threshold."""
    from rich.console import Console

    from ragsieve.config import build_config
    from ragsieve.registry import load_grader
    from studies.grader import GraderExperiment, GraderExperimentConfig

    monkeypatch.setenv("RAGSIEVE_CACHE", str(index_cache))
    params = {
        "llm": str(tiny_llm_dir),
        "data": {"sources": ["nq-oracle", "fever"], "queries_per_source": 6, "retriever": "bm25",
                 "reranker_unseen": True},
        **TINY, "train": {"max_steps": 2, "batch_size": 4},
        "configs": {"prompted": {"kind": "prompted"}, "B": {"kind": "head", "train": {"lr": 1e-3, "epochs": 2}},
                    "C": {"kind": "classifier"}},
        "loss_comparison": [], "sampling_comparison": [], "lora_grid": None, "cosine_baseline": False,
        "save_models": ["prompted", "B"], "target_config": "C",
        "select_precision": 0.5, "threshold_pairs": 10, "bootstrap": 50, "ship_to": str(tmp_path / "ship"),
    }
    out = tmp_path / "grader"
    metrics = GraderExperiment().run(build_config(GraderExperimentConfig, params), out, Console(quiet=True))

    for m in metrics["configs"].values():
        op = m["operating_point"]
        assert op["f1_ci95"][0] <= op["f1"] <= op["f1_ci95"][1] and len(op["precision_ci95"]) == 2
    assert metrics["configs"]["C"]["operating_point"]["tuned_on_pairs"] <= 10  # a sample of train, not all of it
    selection = metrics["selection"]
    ranked = [(r["meets_floor"], r["f1"]) for r in selection["ranking"]]
    assert ranked == sorted(ranked, reverse=True) and selection["best"] == selection["ranking"][0]["config"]
    assert selection["best_shippable"] in ("prompted", "B")  # a full fine-tune (C) never ships
    assert "ci95" in selection["versus_runner_up"] and "verdict" in selection["versus_runner_up"]
    shipped = load_grader(tmp_path / "ship")
    chosen = metrics["configs"][selection["best_shippable"]]["operating_point"]
    assert shipped.config.threshold == chosen["threshold"] and metrics["target"]["config"] == selection["best_shippable"]
    assert shipped.config.trained["operating_point"]["f1"] == chosen["f1"]
    # none of the queries is one the base reranker trained on
    from ragsieve.data import load_dataset
    from ragsieve.benchmarks.mining import unseen_question_ids

    queries = {json.loads(line)["query_id"] for line in (out / "pairs.jsonl").read_text().splitlines()}
    unseen = {f"{name}:{q}" for name in ("nq-oracle", "fever") for q in unseen_question_ids(name, load_dataset(name))}
    assert queries <= unseen


def test_the_default_grader_ships_and_grades_from_a_fresh_clone(tmp_path, cli):
    """`ragsieve grade` with no --grader uses embedded:default, which is in the package (≤ 50 MB)
    with the threshold chosen by experiments/grader_scale.yaml."""
    from ragsieve.paths import resolve_artifact

    folder = resolve_artifact("graders", "embedded:default")
    assert folder == resolve_artifact("graders", "default")  # `--grader default` too
    assert all(f.stat().st_size <= 50 * 2**20 and f.suffix in {".json", ".safetensors"}
               for f in folder.rglob("*") if f.is_file())
    config = json.loads((folder / "grader_config.json").read_text())
    assert config["trained"]["chosen_by"] == "experiments/grader_scale.yaml"
    if config["kind"] not in ("cosine", "cross-encoder", "ranker"):
        pytest.skip("an LLM grader: graded with the real SmolLM2 in the integration tests")
    passages = tmp_path / "p.txt"
    passages.write_text("Hamlet is a tragedy written by William Shakespeare.\nThe Nile flows through Egypt.\n")
    r = cli("grade", "who wrote hamlet", "--passages", passages, "--json")
    assert r.code == 0, r.err
    rows = [json.loads(line) for line in r.out.splitlines()]
    assert len(rows) == 2 and rows[0]["score"] > rows[1]["score"] and rows[0]["relevant"] >= rows[1]["relevant"]


def test_cross_encoder_threshold_is_refused_on_other_weights(tmp_path, tiny_cross_encoder_dir):
    """A ranker grader's threshold is tied to the weights it was fitted on: reloading it over changed
    weights is refused in one line; the shipped graders carry the key of the shipped base reranker."""
    import shutil

    from safetensors.torch import load_file, save_file

    from ragsieve.errors import RagsieveError
    from ragsieve.registry import cross_encoder_key, load_grader, new_grader

    ce = tmp_path / "ce"
    shutil.copytree(tiny_cross_encoder_dir, ce)
    grader = new_grader("cross-encoder", str(ce))
    grader.fit(["who wrote hamlet"] * 4, ["Hamlet is by Shakespeare.", "Foxes are red.", "Shakespeare wrote it.",
                                          "Rain."], [1, 0, 1, 0])
    assert grader.config.trained["ranker_weights"] == cross_encoder_key(str(ce))
    grader.save(tmp_path / "grader")
    assert load_grader(tmp_path / "grader").config.threshold == grader.config.threshold  # same weights: fine
    weights = load_file(ce / "model.safetensors")
    save_file({k: v + 1.0 if v.is_floating_point() else v for k, v in weights.items()}, ce / "model.safetensors")
    with pytest.raises(RagsieveError, match="fit the threshold again"):
        load_grader(tmp_path / "grader")
    for shipped in ("embedded:default",):
        assert load_grader(shipped).config.trained["ranker_weights"] == cross_encoder_key("embedded:base")


def test_report_recomputes_intervals_by_query_from_stored_scores(tmp_path):
    """`run --report-only` on a grader study: intervals over whole queries from configs/ and test_pairs.json,
    nothing trained or scored; stored scores that do not fit the test split are refused."""
    from rich.console import Console

    from ragsieve.config import build_config
    from studies.grader import RATES, GraderExperiment, GraderExperimentConfig

    cfg = build_config(GraderExperimentConfig, {
        "configs": {}, "loss_comparison": [], "sampling_comparison": [], "lora_grid": None, "cross_encoder": None,
        "save_models": [], "target_config": "cosine", "target_precision": 0.6, "target_recall": 0.5, "bootstrap": 300})
    rng = np.random.default_rng(0)
    queries = [f"q{i // 5}" for i in range(200)]  # 40 queries × 5 pairs; a query's pairs agree
    labels = np.repeat(rng.integers(0, 2, 40), 5)
    scores = np.clip(labels * 0.5 + rng.normal(0.25, 0.2, 200), 0, 1)
    predicted = (scores >= 0.5).astype(int)
    point = {k: rate(labels, predicted) for k, rate in RATES.items()}
    out = tmp_path / "grader"
    (out / "configs").mkdir(parents=True)
    (out / "configs" / "cosine.json").write_text(json.dumps({
        "settings": {}, "metrics": {**point, "accuracy": float(np.mean(predicted == labels)), "threshold": 0.5,
                                    "precision_ci95": [0, 1]},
        "test_scores": scores.tolist()}))
    (out / "test_pairs.json").write_text(json.dumps({
        "data_key": "k", "ids": [f"{q}|p{i}" for i, q in enumerate(queries)], "query_ids": queries,
        "labels": labels.tolist(), "empty_passages": []}))
    (out / "metrics.json").write_text(json.dumps({"data": {"data_key": "k"}, "seconds": 12.0}))

    metrics = GraderExperiment().report(cfg, out, Console(quiet=True))
    cosine = metrics["configs"]["cosine"]
    low, high = cosine["precision_ci95"]
    assert low < cosine["precision"] < high and metrics["seconds"] == 12.0  # the run's other fields kept
    assert metrics["target"]["verdict"] in ("met", "met at the point estimate, not shown", "missed")
    assert json.loads((out / "configs" / "cosine.json").read_text())["metrics"]["precision_ci95"] == [low, high]
    # the same pairs resampled one by one: a narrower interval than by query
    from ragsieve.eval.stats import bootstrap_metric

    _, pair_low, pair_high = bootstrap_metric(RATES["precision"], labels, predicted, n_boot=300)
    assert high - low > pair_high - pair_low
    # labels that are not the run's: a stored point estimate no longer recomputes
    flipped = {**json.loads((out / "test_pairs.json").read_text()), "labels": (1 - labels).tolist()}
    (out / "test_pairs.json").write_text(json.dumps(flipped))
    with pytest.raises(RagsieveError, match="differ from the run's"):
        GraderExperiment().report(cfg, out, Console(quiet=True))
