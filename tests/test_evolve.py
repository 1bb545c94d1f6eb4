"""Evolving LLM reranker: templates, tasks, reranker, the fast DPO loss vs TRL, methods,
the SQLite store (resumed after SIGKILL), its CLI and a smoke run of the experiment.

Everything runs on the tiny random Llama of conftest; its BPE splits most label words
into several tokens (only the first is scored), which the tests rely on.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ragsieve.errors import DataError, RagsieveError
from ragsieve.models.verdict import VerdictScores
from ragsieve.data.records import LabeledPair
from ragsieve.evolve.tasks import build_task_rounds
from ragsieve.prompts.verdicts import get_template, load_templates, verdict_tokens
from tests.conftest import REPO, requires_data

ISSUE_TEXTS = {
    "anli": "Given a premise and a hypothesis, determine their relationship and explain your reasoning. First state "
    "the relationship (entailment, neutral, or contradiction). Premise: {premise} Hypothesis: {hypothesis} "
    "Relationship:",
    "fever": "You are a fact verification expert. Analyze the relationship between the claim and evidence. Claim: "
    "{claim} Evidence: {evidence} Based on the evidence, the claim is: - SUPPORTS if the evidence confirms the claim "
    "- REFUTES if the evidence contradicts the claim - NOT ENOUGH INFO if the evidence is insufficient Your response "
    "must be exactly one word: SUPPORTS, REFUTES, or NOT ENOUGH INFO.",
    "hotpotqa-distractor": "Determine whether the following sentence provides information relevant to answering the "
    "question. Question: {question} Sentence: {sentence} Answer (only True or False):",
    "multirc": "Based on the given passage and question, determine whether the provided answer is correct. If "
    "correct, answer 'true'; if incorrect, answer 'false'. Passage: {passage} Question: {question} Answer:",
    "pubmedqa": "Answer the medical research question based on the provided scientific context. Provide a 'yes' or "
    "'no' answer. Question: {question} Scientific Context: {context} Answer:",
    "bioasq": "Determine whether the given query and content are relevant. If so, answer 'true'; if not, answer "
    "'false'. Query: {question} Content: {content} Relevance:",
}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny models gain nothing from a second thread, and on a shared 2-core machine
    oversubscribed OpenMP threads made their steps 10-20x slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def synthetic_examples(n: int, dataset: str = "pubmedqa", prefix: str = "ex") -> list[LabeledPair]:
    """Learnable toy task: label 1 iff the context mentions the fox."""
    rng = random.Random(n)
    out = []
    for i in range(n):
        label = i % 2
        animal = "fox" if label else "dog"
        q = f"is it the {animal}? {rng.choice(['quick', 'lazy', 'brown'])}"
        ctx = f"the {animal if label else 'dog'} jumps over the {rng.choice(['lazy', 'quick'])} dog"
        out.append(LabeledPair(f"{prefix}{i:03d}", f"q{i}", q, ctx, label, {"question": q, "context": ctx}, dataset=dataset))
    return out


# --------------------------------------------------------------------------- templates and tasks


def test_templates_are_the_issue_texts_with_label_words():
    templates = load_templates()
    assert {name: t.template for name, t in templates.items() if name != "relevance"} == ISSUE_TEXTS
    words = {name: (t.true_word, t.false_word) for name, t in templates.items()}
    assert words == {
        "anli": ("entailment", "contradiction"), "fever": ("SUPPORTS", "REFUTES"),
        "hotpotqa-distractor": ("True", "False"), "multirc": ("true", "false"), "pubmedqa": ("yes", "no"),
        "bioasq": ("true", "false"), "relevance": ("true", "false"),
    }
    with pytest.raises(RagsieveError, match="no verdict template 'nope'"):
        get_template("nope")
    with pytest.raises(RagsieveError, match="needs field"):
        get_template("fever").render({"claim": "x"})


def test_verdict_tokens_first_token_at_answer_position(tiny_llm):
    fever = get_template("fever")
    tokens = verdict_tokens(tiny_llm.tokenizer, fever, tiny_llm.format_prompt)
    assert tokens.multi_token  # the tiny BPE splits SUPPORTS / REFUTES
    assert tokens.true_id == tokens.true_pieces[0] != tokens.false_id == tokens.false_pieces[0]
    same_start = fever.__class__(**{**fever.__dict__, "true_word": "SUPPORTS", "false_word": "SUPPORTED"})
    with pytest.raises(RagsieveError, match="share their first token"):
        verdict_tokens(tiny_llm.tokenizer, same_start, tiny_llm.format_prompt)


def test_smollm2_label_words_take_the_no_space_variant_after_the_chat_template(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)

    def fmt(text):
        return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)

    ids = {n: verdict_tokens(tok, t, fmt) for n, t in load_templates().items()}
    assert (ids["hotpotqa-distractor"].true_id, ids["hotpotqa-distractor"].false_id) == (
        tok.convert_tokens_to_ids("True"), tok.convert_tokens_to_ids("False"))
    assert tok.convert_tokens_to_ids("ĠTrue") != ids["hotpotqa-distractor"].true_id  # not the leading-space token
    single = {n for n, t in ids.items() if not t.multi_token}
    assert single == {"hotpotqa-distractor", "multirc", "pubmedqa", "bioasq", "relevance"}
    assert tok.decode([ids["fever"].true_id, ids["fever"].false_id]) == "SREF"  # first tokens of SUPPORTS / REFUTES


def test_rounds_are_balanced_sequential_and_seeded():
    items = synthetic_examples(60)
    a = build_task_rounds("pubmedqa", initial_size=12, round_size=8, rounds=4, seed=3, examples=items)
    b = build_task_rounds("pubmedqa", initial_size=12, round_size=8, rounds=4, seed=3, examples=list(reversed(items)))
    assert [x.id for x in a.initial] == [x.id for x in b.initial]
    assert [[x.id for x in r] for r in a.rounds] == [[x.id for x in r] for r in b.rounds]
    ids = [x.id for x in a.initial] + [x.id for r in a.rounds for x in r]
    assert len(ids) == len(set(ids)) == 12 + 4 * 8
    assert all(sum(x.label for x in r) == 4 for r in a.rounds)
    c = build_task_rounds("pubmedqa", initial_size=12, round_size=8, rounds=4, seed=4, examples=items)
    assert [x.id for x in c.initial] != [x.id for x in a.initial]
    with pytest.raises(DataError, match="round 4 needs"):
        build_task_rounds("pubmedqa", initial_size=24, round_size=10, rounds=4, examples=items)
    held = build_task_rounds("pubmedqa", initial_size=4, round_size=4, rounds=1, held_out_queries=5, examples=items)
    assert len(held.held_out_query_ids) == 5
    assert not {x.query_id for x in held.initial + held.rounds[0]} & set(held.held_out_query_ids)


def test_test_set_takes_whole_queries_balanced_and_disjoint_from_every_split():
    # 30 queries with 3 examples each (labels 1, 0, 0): a query must never straddle test and training
    items = [
        LabeledPair(f"q{q:02d}:{j}", f"q{q:02d}", "q", "p", int(j == 0), {"question": "q", "context": "p"})
        for q in range(30) for j in range(3)
    ]
    task = build_task_rounds("pubmedqa", initial_size=6, round_size=4, rounds=2, test_size=10, examples=items)
    assert len(task.test) == 10 and sum(x.label for x in task.test) == 5
    test_queries = {x.query_id for x in task.test}
    assert not test_queries & {x.query_id for split in task.splits() for x in split}
    assert task.sizes()["test"] == {"n": 10, "positives": 5}
    with pytest.raises(DataError, match="test set of 80 needs more"):
        build_task_rounds("pubmedqa", initial_size=2, round_size=2, rounds=1, test_size=80, examples=items)
    # the dev set (for choosing M0's recipe): whole unused queries, none in the test set or any split
    from ragsieve.evolve.tasks import select_dev

    in_splits = {x.id for split in task.splits() for x in split}
    assert {x.id for x in task.unused} == {x.id for x in items if x.query_id not in test_queries and x.id not in in_splits}
    dev = select_dev(task, 6)
    assert len(dev) == 6 and sum(x.label for x in dev) == 3
    taken = test_queries | {x.query_id for split in task.splits() for x in split}
    assert not {x.query_id for x in dev} & taken
    assert {x.query_id for x in dev} == {x.query_id for x in task.unused if x.query_id in {d.query_id for d in dev}}
    with pytest.raises(DataError, match="dev set of 40 needs more"):
        select_dev(task, 40)


@requires_data
def test_real_tasks_have_the_issue_binary_labels():
    bio = build_task_rounds("bioasq", initial_size=8, round_size=8, rounds=4)
    assert [{x.group for x in r} for r in [bio.initial, *bio.rounds]] == [{"7"}, {"8"}, {"9"}, {"10"}, {"11"}]
    neg = next(x for x in bio.rounds[0] if x.label == 0)
    assert neg.fields["content"] and neg.fields["question"] == neg.query
    hot = build_task_rounds("hotpotqa-distractor", initial_size=16, round_size=8, rounds=4, held_out_queries=10)
    assert set(hot.initial[0].fields) == {"question", "sentence"} and len(hot.held_out_query_ids) == 10
    mrc = build_task_rounds("multirc", initial_size=8, round_size=4, rounds=1)
    assert all(x.group == "val" and x.fields["question"] == x.query for x in mrc.initial)


# --------------------------------------------------------------------------- reranker and losses


def test_reranker_scores_batched_like_single_and_ranks(tiny_llm_dir):
    from ragsieve.rerank.pointwise import PointwiseLLMReranker

    ranker = PointwiseLLMReranker("pubmedqa", str(tiny_llm_dir), max_prompt_tokens=300, batch_size=4)
    items = synthetic_examples(6)
    items[0] = LabeledPair("long", "q", "is it?", "x", 1, {"question": "is it?", "context": "the dog " * 200}, dataset="pubmedqa")
    batched = ranker.predict(items)
    single = [ranker.predict([x]).logp_true[0] for x in items]
    assert np.allclose(batched.logp_true, single, atol=1e-4)
    assert ranker.prompter.truncated >= 1  # the long context was cut to fit 300 tokens
    assert ranker.llm.count_tokens(ranker.prompts([items[0]])[0]) <= 300
    s = batched.score
    assert np.all((s > 0) & (s < 1)) and np.allclose(batched.confidence, np.maximum(s, 1 - s))
    ranked = ranker.rank("is it the fox?", ["the dog sleeps", "the fox jumps"])
    assert len(ranked) == 2 and sorted(r.index for r in ranked.results) == [0, 1]


def test_fast_verdict_dpo_loss_equals_trl_sigmoid_loss(tiny_llm_dir, tmp_path):
    """TRL's DPOTrainer.compute_loss and ours on the same batch, policy ≠ reference."""
    import torch

    from ragsieve.models.lora import LoraSettings
    from ragsieve.models.verdict import left_pad_prompts
    from ragsieve.rerank.pointwise import PointwiseLLMReranker
    from ragsieve.evolve.train import VerdictTrainConfig, build_trl_dpo_trainer
    from ragsieve.evolve.train import VerdictDPOTrainer

    ranker = PointwiseLLMReranker("pubmedqa", str(tiny_llm_dir), max_prompt_tokens=300)
    assert not ranker.tokens.multi_token  # yes / no are single tokens here, as for SmolLM2
    items = synthetic_examples(4)
    prompts, labels = ranker.prompts(items), [1, 0, 0, 1]
    config = VerdictTrainConfig(beta=0.2, batch_size=4, lora=LoraSettings(r=4, alpha=8))
    with torch.no_grad():  # random tiny embeddings give logits of ~0.1: scale them so verdicts can move
        ranker.llm.model.get_input_embeddings().weight.mul_(50.0)
    trl = build_trl_dpo_trainer(ranker.llm, ranker.tokens, prompts, labels, config, tmp_path / "trl")
    model = trl.model
    torch.manual_seed(1)
    with torch.no_grad():  # B = 0 at init makes policy == reference and both losses log 2
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 2.0)
    model.eval()
    with torch.no_grad():
        trl_loss = float(trl.compute_loss(model, trl.data_collator([trl.train_dataset[i] for i in range(4)])))
        ours = VerdictDPOTrainer(ranker.llm, ranker.tokens, config)
        ours.prepare(model, prompts, labels, ref=None)  # reference = adapter disabled
        fast_loss = float(ours.loss(model, left_pad_prompts(ranker.llm.tokenizer, prompts), [0, 1, 2, 3], labels))
    assert abs(trl_loss - math.log(2)) > 1e-3, trl_loss
    assert fast_loss == pytest.approx(trl_loss, abs=1e-6)


def test_verdict_dpo_loss_formula_and_doc_example():
    import doctest

    import torch

    from ragsieve.evolve import verdict_dpo
    from ragsieve.evolve.verdict_dpo import verdict_dpo_loss
    from ragsieve.models import training, verdict
    from studies import evolve_m0_sweep, evolve_stats, evolve_tables

    for module in (verdict_dpo, verdict, training, evolve_stats, evolve_tables, evolve_m0_sweep):
        assert doctest.testmod(module).failed == 0
    out = verdict_dpo_loss(torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0]), torch.tensor([-1.5, -2.0]),
                           torch.tensor([-1.5, -2.0]), beta=0.5)
    expected = [-math.log(1 / (1 + math.exp(-0.5 * (0.5 + 0.5)))), -math.log(1 / (1 + math.exp(-0.5 * (-1 - 1))))]
    assert out.losses.tolist() == pytest.approx(expected)


def test_sft_and_fast_dpo_rounds_learn_and_save_mergeable_deltas(tiny_llm_dir, tmp_path):
    from ragsieve.rerank.pointwise import PointwiseLLMReranker
    from ragsieve.evolve.train import VerdictTrainConfig, train_round

    import torch

    ranker = PointwiseLLMReranker("pubmedqa", str(tiny_llm_dir), max_prompt_tokens=300)
    with torch.no_grad():  # logits of ~0.1 from random tiny embeddings barely move: scale them
        ranker.llm.model.get_input_embeddings().weight.mul_(20.0)
    ranker.llm.model.save_pretrained(tmp_path / "base")
    ranker.llm.tokenizer.save_pretrained(tmp_path / "base")
    items = synthetic_examples(8)
    prompts, labels = ranker.prompts(items), [x.label for x in items]
    before = ranker.predict(items)
    config = VerdictTrainConfig(lr=5e-3, epochs=4, batch_size=4)
    sft = train_round(ranker.llm, ranker.tokens, "sft", prompts, labels, config, save_dir=tmp_path / "d0")
    after_sft = ranker.predict(items)
    assert sft.steps == 8 and sft.losses[-1] < sft.losses[0]
    dpo = train_round(ranker.llm, ranker.tokens, "dpo", prompts, labels, config, ref=after_sft, save_dir=tmp_path / "d1")
    after = ranker.predict(items)
    assert dpo.losses[0] == pytest.approx(math.log(2), abs=1e-3)  # starts at the reference
    margin = lambda s: np.mean(np.where(np.array(labels) == 1, 1, -1) * (s.logp_true - s.logp_false))  # noqa: E731
    assert margin(after) > margin(after_sft) > margin(before)
    rebuilt = PointwiseLLMReranker(
        "pubmedqa", str(tmp_path / "base"), max_prompt_tokens=300, adapters=[tmp_path / "d0", tmp_path / "d1"]
    )
    assert np.allclose(rebuilt.predict(items).logp_true, after.logp_true, atol=1e-4)



def _kill_at(args: list[str], marker: str, env: dict, timeout: float = 120) -> tuple[list[str], int]:
    """Run a child, read its stdout up to the line starting with ``marker`` (or ``timeout``), then
    ``kill -9`` it, as a user would; its stdout lines so far and its return code."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO)
    seen = []
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            seen.append(line.strip())
            if line.startswith(marker) or time.monotonic() > deadline:
                break
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    return seen, proc.returncode


_TRAIN_KILL_SCRIPT = """
import sys, time
sys.path.insert(0, sys.argv[3])
from tests.test_evolve import synthetic_examples
from ragsieve.evolve.train import VerdictTrainConfig, train_round
from ragsieve.models.training import TrainingCheckpoint
from ragsieve.rerank.pointwise import PointwiseLLMReranker
save = TrainingCheckpoint.save
def save_then_hang(self, model, optimizer, result):
    save(self, model, optimizer, result)
    if result.steps == 3:  # steps 1-3 saved, step 4 not started
        print("SAVED", flush=True)
        time.sleep(600)
TrainingCheckpoint.save = save_then_hang
ranker = PointwiseLLMReranker("pubmedqa", sys.argv[1], max_prompt_tokens=300)
items = synthetic_examples(8)
train_round(ranker.llm, ranker.tokens, "sft", ranker.prompts(items), [x.label for x in items],
            VerdictTrainConfig(lr=5e-3, epochs=3, batch_size=4), checkpoint=TrainingCheckpoint(sys.argv[2], every=1))
"""


def test_a_training_killed_mid_way_resumes_from_its_checkpoint(tiny_llm_dir, tmp_path):
    """kill -9 after step 3 of 6: the rerun trains steps 4-6 only and ends with the weights,
    losses and verdicts of an uninterrupted training; the checkpoint is removed once saved."""
    from ragsieve.evolve.train import VerdictSFTTrainer, VerdictTrainConfig, train_round
    from ragsieve.models.training import TrainingCheckpoint
    from ragsieve.rerank.pointwise import PointwiseLLMReranker

    folder = tmp_path / "m0.checkpoint"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    _kill_at([sys.executable, "-c", _TRAIN_KILL_SCRIPT, str(tiny_llm_dir), str(folder), str(REPO)], "SAVED", env)
    assert (folder / "state.pt").is_file()

    items = synthetic_examples(8)
    config = VerdictTrainConfig(lr=5e-3, epochs=3, batch_size=4)

    def train(checkpoint, save_dir):
        ranker = PointwiseLLMReranker("pubmedqa", str(tiny_llm_dir), max_prompt_tokens=300)
        calls = []
        loss = VerdictSFTTrainer.loss
        VerdictSFTTrainer.loss = lambda self, *a: calls.append(1) or loss(self, *a)
        try:
            result = train_round(ranker.llm, ranker.tokens, "sft", ranker.prompts(items), [x.label for x in items],
                                 config, save_dir=save_dir, checkpoint=checkpoint)
        finally:
            VerdictSFTTrainer.loss = loss
        return result, len(calls), ranker.predict(items)

    resumed, resumed_steps, resumed_scores = train(TrainingCheckpoint(folder, every=1), tmp_path / "a")
    fresh, fresh_steps, fresh_scores = train(None, tmp_path / "b")
    assert (resumed_steps, fresh_steps) == (3, 6)
    assert resumed.steps == fresh.steps == 6
    assert np.allclose(resumed.losses, fresh.losses, atol=1e-5)
    assert np.allclose(resumed_scores.logp_true, fresh_scores.logp_true, atol=1e-5)
    assert not folder.exists()


def test_a_checkpoint_of_another_training_is_discarded(tiny_llm_dir, tmp_path, monkeypatch):
    """Other data in the same folder, or another start model's tag: start over, never resume."""
    from ragsieve.evolve.train import VerdictSFTTrainer, VerdictTrainConfig
    from ragsieve.models.training import TrainingCheckpoint
    from ragsieve.rerank.pointwise import PointwiseLLMReranker

    calls = []
    loss = VerdictSFTTrainer.loss
    monkeypatch.setattr(VerdictSFTTrainer, "loss", lambda self, *a: calls.append(1) or loss(self, *a))
    items = synthetic_examples(8)
    config = VerdictTrainConfig(lr=5e-3, epochs=1, batch_size=4)
    folder = tmp_path / "ckpt"

    def steps_run(tag: str, reverse: bool = False) -> int:
        ranker = PointwiseLLMReranker("pubmedqa", str(tiny_llm_dir), max_prompt_tokens=300)
        prompts = ranker.prompts(items)
        calls.clear()
        result = VerdictSFTTrainer(ranker.llm, ranker.tokens, config).fit(
            prompts[::-1] if reverse else prompts, [x.label for x in items],
            checkpoint=TrainingCheckpoint(folder, every=1, tag=tag))
        assert result.steps == 2
        return len(calls)

    assert steps_run("m0-a") == 2 and (folder / "state.pt").is_file()  # step 1 saved, the last step never
    assert steps_run("m0-a") == 1  # the same training resumes
    assert steps_run("m0-b") == 2  # another start model
    assert steps_run("m0-b", reverse=True) == 2  # other data
    with pytest.raises(RagsieveError, match="interval"):
        TrainingCheckpoint(folder, every=0)

def test_the_model_after_epoch_k_is_the_k_epoch_model_and_a_kill_in_the_hook_repeats_only_that_epoch(
        tiny_llm_dir, tmp_path):
    """The M0 sweep scores epochs 1..E of one run: after epoch 1 of a 2-epoch training the verdicts
    are those of a 1-epoch training; a crash while epoch 2 is scored resumes at that epoch's end."""
    from ragsieve.evolve.train import VerdictSFTTrainer, VerdictTrainConfig
    from ragsieve.models.training import TrainingCheckpoint
    from ragsieve.rerank.pointwise import PointwiseLLMReranker

    items = synthetic_examples(8)

    def train(epochs: int, hook=None, checkpoint=None):
        ranker = PointwiseLLMReranker("pubmedqa", str(tiny_llm_dir), max_prompt_tokens=300)
        config = VerdictTrainConfig(lr=5e-3, epochs=epochs, batch_size=4)
        seen = {}

        def on_epoch_end(epoch, so_far):
            seen[epoch] = (ranker.predict(items).logp_true, len(so_far.losses))
            if hook:
                hook(epoch)

        VerdictSFTTrainer(ranker.llm, ranker.tokens, config).fit(
            ranker.prompts(items), [x.label for x in items], checkpoint=checkpoint, on_epoch_end=on_epoch_end)
        return seen, ranker.predict(items).logp_true

    by_epoch, _ = train(2)
    _, one_epoch = train(1)
    assert np.allclose(by_epoch[1][0], one_epoch, atol=1e-5) and by_epoch[1][1] == 2 and by_epoch[2][1] == 4

    def crash(epoch):
        if epoch == 2:
            raise KeyboardInterrupt

    folder = tmp_path / "ckpt"
    with pytest.raises(KeyboardInterrupt):
        train(2, crash, TrainingCheckpoint(folder, every=1))
    resumed, final = train(2, None, TrainingCheckpoint(folder, every=1))
    assert set(resumed) == {2}  # epoch 1 was scored before the crash; epoch 2 is scored again
    assert np.allclose(resumed[2][0], by_epoch[2][0], atol=1e-5)


def test_two_m0s_are_paired_on_the_test_examples_both_scored():
    """A run that held downstream questions out has a partly different test set: pair the shared ones."""
    from studies.evolve_stats import paired_m0

    a = {"m0": "mixed", "test_ids": ["x", "y", "z", "w"], "test_query_ids": ["q1", "q1", "q2", "q3"],
         "test": {"correct": "1101", "pred": "1100", "margins": [2.0, 1.0, -1.0, -2.0]}}
    b = {"m0": "per-dataset", "test_ids": ["v", "w", "y", "x"],
         "test": {"correct": "0100", "pred": "1000", "margins": [0.5, 1.5, -0.5, 0.1]}}
    r = paired_m0(a, b)
    assert r["n"] == 3 and (r["a_only"], r["b_only"]) == (2, 0)  # x, y right only in A; w right in both
    assert (r["a_only_examples"], r["b_only_examples"]) == (1, 1)
    assert r["auroc"]["n"] == 3
    assert paired_m0(a, {**b, "test_ids": ["p", "q", "r", "s"]}) is None


def test_test_sets_with_repeated_queries_are_tested_by_query():
    """HotpotQA's 300 test sentences come from 61 questions: intervals and paired tests resample questions."""
    from studies.evolve_stats import m0_vs_chance, paired_outcomes

    queries = [f"q{i // 5}" for i in range(100)]
    a, b = [1] * 70 + [0] * 30, [1] * 60 + [0] * 40
    by_query, single = paired_outcomes(a, b, queries), paired_outcomes(a, b, [f"x{i}" for i in range(100)])
    assert by_query["test"] == "paired bootstrap over queries" and by_query["queries"] == 20
    assert single["test"] == "exact McNemar" and single["p_value"] == by_query["p_mcnemar"]
    assert by_query["diff"] == single["diff"] == 0.1
    m0 = {"test_ids": [str(i) for i in range(100)], "test_query_ids": queries, "test": {"correct": "1" * 65 + "0" * 35}}
    s = m0_vs_chance(m0)
    assert s["queries"] == 20 and s["test"].startswith("bootstrap") and s["ci95"][0] < 0.6
    assert s["target_met"] and not s["target_met_with_ci"] and s["verdict"] == "met at the point estimate, not shown"


class KnownVerdicts:
    """Stands in for the LLM reranker in the forgetting evaluation: a fixed P(true) per example id."""

    def __init__(self, p_true: dict[str, float]):
        self.p_true = p_true

    def predict(self, examples):
        p = np.array([self.p_true[x.id] for x in examples])
        return VerdictScores(np.log(p), np.log(1 - p))


def test_forgetting_keeps_each_outcome_and_query_so_intervals_resample_queries():
    """Forgetting samples share queries (a question's sentences, a passage's answers): each outcome and the
    samples' query ids are recorded, every interval resamples whole queries, and the report recomputes them;
    an older record (summaries only) is widened to query level by the worst-case design effect when the
    samples' query ids can be rebuilt, else marked "by example" in metrics and TABLES.md."""
    from ragsieve.eval import accuracy_interval
    from ragsieve.eval.stats import bootstrap_ci, conservative_query_interval
    from studies.evolve import forgetting_eval, forgetting_ids
    from studies.evolve_stats import CONSERVATIVE_BY_QUERY, forgetting_curve
    from studies.evolve_tables import markdown_tables

    # two splits (the SFT set, D_1) of 6 examples, 2 per query; M_1 is right on the first 4 of each split
    samples = [[LabeledPair(f"s{s}x{i}", f"s{s}q{i // 2}", "q", "p", i % 2, {}) for i in range(6)] for s in range(2)]
    p_true = {x.id: (0.9 if x.label else 0.1) if i < 4 else (0.1 if x.label else 0.9)
              for split in samples for i, x in enumerate(split)}
    cache: dict = {}
    row = forgetting_eval(KnownVerdicts(p_true), samples, 1, cache, version=1)
    assert [row["splits"][s]["correct"] for s in ("0", "1")] == ["111100", "111100"]
    queries = [x.query_id for split in samples for x in split]
    _, low, high = bootstrap_ci([1, 1, 1, 1, 0, 0] * 2, groups=queries)
    assert row["seen"] == {"n": 12, "accuracy": round(8 / 12, 4), "ci95": [round(low, 4), round(high, 4)], "queries": 6}
    assert row["earlier"]["n"] == 6 and row["earlier"]["queries"] == 3 and row["interval_by"] == "query"
    # the same model version again: outcomes come from the cache, nothing is scored
    assert forgetting_eval(KnownVerdicts({}), samples, 1, cache, version=1) == row
    # the report summarises a record afresh from its outcomes and the samples' query ids
    cell = {"rounds": [{"round": 1, "forgetting": row}], **forgetting_ids(samples)}
    assert cell["forgetting_query_ids"] == [[x.query_id for x in split] for split in samples]
    assert forgetting_curve(cell, {}) == [{"round": 1, **row}]
    # an older record kept summaries only: its Wilson interval is by example, and the tables say so
    old = {"rounds": [{"round": 1, "forgetting": {k: {**row[k], "queries": None} for k in ("seen", "earlier")}}]}
    (legacy,) = forgetting_curve(old, {})
    assert legacy["interval_by"] == "example"
    # ... unless the samples' query ids are rebuilt (from the seed): then each interval is widened to query
    # level by the worst-case design effect (2 examples per query: deff 2, Wilson at n / 2)
    summaries = {k: {f: row[k][f] for f in ("n", "accuracy", "ci95")} for k in ("seen", "earlier")}
    summaries["splits"] = {s: {f: row["splits"][s][f] for f in ("n", "accuracy", "ci95")} for s in ("0", "1")}
    older = {"rounds": [{"round": 1, "forgetting": summaries}]}
    (widened,) = forgetting_curve(older, {}, [[x.query_id for x in split] for split in samples])
    _, low, high = conservative_query_interval(8, [2] * 6)
    assert widened["interval_by"] == CONSERVATIVE_BY_QUERY and widened["seen"]["design_effect"] == 2.0
    assert widened["seen"]["ci95"] == [round(low, 4), round(high, 4)] and widened["seen"]["queries"] == 6
    by_example = accuracy_interval(8, 12)
    assert high - low > by_example[1] - by_example[0]
    assert widened["splits"]["1"]["queries"] == 3 and widened["earlier"]["n"] == 6
    assert forgetting_curve(older, {}, [["q"] * 5, ["q"] * 6])[0]["interval_by"] == "example"  # not this sample
    metrics = {"forgetting": {"multirc": {"dpo": [legacy], "sft": [{"round": 1, **row}], "replay-dpo": [widened]}},
               "sizes": {"multirc": {"forgetting_sample": {"seen": {"n": 12, "queries": 6}}}}}
    tables = markdown_tables(metrics)
    assert "(n 12, 6 queries, by example)" in tables and "(n 12, 6 queries, by query)" in tables
    assert "(n 12, 6 queries, by query, conservative)" in tables


# --------------------------------------------------------------------------- methods


class FixedJudge:
    def __init__(self, votes):
        self.vote_of = votes
        self.name = "fixed"

    def votes(self, examples):
        return [self.vote_of.get(x.id) for x in examples]


def test_cautious_labels_gate_vote_skip_ties_and_ablations():
    from ragsieve.evolve.methods import MethodConfig, build_method

    items = synthetic_examples(4)  # gold labels 0, 1, 0, 1
    # model scores: confident 1, confident 0 (wrong), unsure 0.6, unsure 0.45
    p = np.array([0.95, 0.05, 0.6, 0.45])
    verdicts = VerdictScores(np.log(p), np.log(1 - p))
    judges = [FixedJudge({"ex002": 0, "ex003": 1}), FixedJudge({"ex002": 0, "ex003": None})]
    cautious = build_method(MethodConfig(kind="cautious-dpo", tau=0.9), judges)
    out = cautious.label(items, verdicts, 1, {})
    got = {pr.example.id: (pr.label, pr.source) for pr in out.pairs}
    # ex002: votes 0, 0 + model 1 → 0; ex003: votes 1 (+ abstain) + model 0 → tie, skipped
    assert got == {"ex000": (1, "self"), "ex001": (0, "self"), "ex002": (0, "jury")}
    assert out.stats["ties_skipped"] == 1 and out.stats["accuracy"] == pytest.approx(1 / 3)
    assert out.stats["self"] == {"n": 2, "accuracy": 0.0, "accepted_true": 1, "gold_true": 1}
    assert out.stats["jury"] == {"n": 1, "accuracy": 1.0, "accepted_true": 0, "gold_true": 0}
    assert (out.stats["accepted_true"], out.stats["gold_true"]) == (1, 1)  # the verdict mix of the accepted labels
    no_jury = build_method(MethodConfig(kind="cautious-dpo", tau=0.9, jury=False), judges).label(items, verdicts, 1, {})
    assert {pr.example.id for pr in no_jury.pairs} == {"ex000", "ex001"}
    no_gate = build_method(MethodConfig(kind="cautious-dpo", tau=0.9, gating=False), judges).label(items, verdicts, 1, {})
    assert all(pr.source == "jury" for pr in no_gate.pairs)
    fed = cautious.label(items, verdicts, 1, {"ex001": 1})
    assert ("ex001", 1, "gold") in {(pr.example.id, pr.label, pr.source) for pr in fed.pairs}


def test_balanced_acceptance_stops_a_one_verdict_round_and_keeps_the_prior():
    import doctest

    from ragsieve.evolve import methods
    from ragsieve.evolve.methods import MethodConfig, Pair, build_method

    assert doctest.testmod(methods).failed == 0
    items = synthetic_examples(6)
    history = [Pair(x, x.label, "gold", 0) for x in synthetic_examples(4)]  # prior 0.5
    balanced = build_method(MethodConfig(kind="cautious-dpo", tau=0.9, jury=False, balance=True))
    # an over-confident model that says "true" to everything: no pairs rather than a constant classifier
    p = np.full(6, 0.99)
    out = balanced.label(items, VerdictScores(np.log(p), np.log(1 - p)), 2, {}, history)
    assert out.pairs == [] and out.stats["dropped_for_balance"] == 6
    # four confident 1s, two confident 0s → the two most confident 1s and both 0s
    p = np.array([0.99, 0.93, 0.97, 0.02, 0.95, 0.05])
    out = balanced.label(items, VerdictScores(np.log(p), np.log(1 - p)), 2, {}, history)
    assert {(pr.example.id, pr.label) for pr in out.pairs} == {("ex000", 1), ("ex002", 1), ("ex003", 0), ("ex005", 0)}
    # gold feedback is never dropped, and a skewed gold prior keeps a skewed share
    out = balanced.label(items, VerdictScores(np.log(p), np.log(1 - p)), 2, {"ex001": 1}, history)
    assert ("ex001", 1, "gold") in {(pr.example.id, pr.label, pr.source) for pr in out.pairs}
    skewed = [Pair(x, 1, "gold", 0) for x in synthetic_examples(3)] + [Pair(synthetic_examples(4)[3], 0, "gold", 0)]
    out = balanced.label(items, VerdictScores(np.log(p), np.log(1 - p)), 2, {}, skewed)  # prior 0.75
    assert sorted(pr.label for pr in out.pairs) == [0, 1, 1, 1, 1]  # 4 : 1, the most confident 0 (ex003)
    assert ("ex003", 0) in {(pr.example.id, pr.label) for pr in out.pairs}


def test_judge_specs_factory_and_calibration():
    from ragsieve.evolve.judges import JUDGES, EndpointJudge, JudgeSpec, ScoreJudge, build_judges
    from ragsieve.prompts.verdicts import get_template

    assert set(JUDGES) == {"llm", "cross-encoder", "reranker", "openai"}
    spec = JudgeSpec.model_validate("openai:http://localhost:8000/v1#llama3")
    assert (spec.kind, spec.model) == ("openai", "openai:http://localhost:8000/v1#llama3")
    template = get_template("pubmedqa")
    args = ScoreJudge.reranker_args
    assert args(JudgeSpec.model_validate("cross-encoder:embedded:base"), template) == ("embedded:base", {})
    assert args(JudgeSpec.model_validate("cross-encoder:models/ce"), template) == ("cross-encoder:models/ce", {})
    assert args(JudgeSpec.model_validate("llm:tiny"), template) == (
        "pointwise", {"template": template, "llm": "tiny", "max_prompt_tokens": 384})
    (bm25,) = build_judges(["reranker:bm25"], "pubmedqa")
    with pytest.raises(RagsieveError, match="never calibrated"):
        bm25.votes(synthetic_examples(2))
    items = synthetic_examples(12)
    bm25.calibrate(items)
    assert bm25.threshold is not None and set(bm25.votes(items)) <= {0, 1}
    with pytest.raises(RagsieveError, match="unknown judge kind 'nope'"):
        build_judges(["nope:x"], "pubmedqa")
    endpoint = EndpointJudge.__new__(EndpointJudge)
    endpoint.template = get_template("fever")
    assert [endpoint.parse(a) for a in ("SUPPORTS.", "refutes because", "NOT ENOUGH INFO")] == [1, 0, None]


def test_replay_share_and_method_registry():
    from ragsieve.evolve.methods import METHODS, MethodConfig, Pair, build_method

    assert set(METHODS) == {"sft-only", "sft", "dpo", "replay-dpo", "cautious-dpo", "checked-cautious-dpo"}
    new = [Pair(x, x.label, "gold", 2) for x in synthetic_examples(14, prefix="n")]
    history = [Pair(x, x.label, "gold", 1) for x in synthetic_examples(40, prefix="h")]
    replay = build_method(MethodConfig(kind="replay-dpo", alpha=0.7))
    train = replay.training_set(new, history, random.Random(0))
    assert len(train) == 20 and train[:14] == new  # 14 new = 70 % of 20
    assert build_method(MethodConfig(kind="dpo", alpha=0.5)).training_set(new, history, random.Random(0)) == new
    assert len(build_method(MethodConfig(kind="replay-dpo", alpha=0.1)).training_set(new, history, random.Random(0))) == 54
    with pytest.raises(RagsieveError, match="unknown method 'x'"):
        build_method(MethodConfig(kind="x"))


# --------------------------------------------------------------------------- deployment store


def _store_config(tiny_llm_dir):
    from ragsieve.evolve.store import EvolveStoreConfig

    return EvolveStoreConfig(
        llm=str(tiny_llm_dir), template="pubmedqa", max_prompt_tokens=300, judges=[f"llm:{tiny_llm_dir}"],
        method={"kind": "cautious-dpo", "tau": 0.501, "alpha": 0.5},
        m0_train={"lr": 2e-2, "epochs": 2, "batch_size": 4}, train={"lr": 1e-2, "batch_size": 4},
        judge_check=False,  # no feedback here to check the judges on: the unguarded loop is what is tested
    )


_KILL_SCRIPT = """
import sys, time
from ragsieve.evolve import store as st
insert = st.EvolveStore._insert_pairs
def insert_then_hang(self, conn, pairs):
    insert(self, conn, pairs)
    if pairs and pairs[0].round == 1:  # inside round 1's transaction, before COMMIT
        print("INSERTED", flush=True)
        time.sleep(600)
st.EvolveStore._insert_pairs = insert_then_hang
print("ROUND", st.run_step(sys.argv[1]).round, flush=True)
st.run_step(sys.argv[1])
"""


def _pairs(store_dir):
    from ragsieve.evolve.store import EvolveStore

    store = EvolveStore(store_dir)
    try:
        return sorted((p.example.id, p.round, p.label, p.source) for p in store.pairs())
    finally:
        store.close()


def test_store_resumes_after_sigkill_without_duplicated_or_lost_pairs(tiny_llm_dir, tmp_path):
    from ragsieve.evolve.store import init_store, run_step, store_status

    items = synthetic_examples(20)
    initial, rounds = items[:8], [items[8:14], items[14:20]]
    killed, reference = tmp_path / "killed", tmp_path / "reference"
    for target in (killed, reference):
        init_store(target, _store_config(tiny_llm_dir), initial, rounds)

    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1"}
    seen, returncode = _kill_at([sys.executable, "-c", _KILL_SCRIPT, str(killed)], "INSERTED", env)
    assert seen[-1] == "INSERTED", seen
    assert returncode == -signal.SIGKILL
    after_kill = store_status(killed)
    assert [r["round"] for r in after_kill["rounds"]] == [0]
    assert {p[1] for p in _pairs(killed)} == {0}  # round 1's inserted pairs were rolled back
    assert (killed / "adapters" / "round-001").exists()  # renamed into place, never registered

    report = run_step(killed)  # resumes: redoes round 1 from M0
    assert report.round == 1 and report.mode == "cautious"
    for _ in range(2):
        run_step(reference)
    pairs = _pairs(killed)
    assert len(pairs) == len({(p[0], p[1]) for p in pairs})
    assert pairs == _pairs(reference)
    log = store_status(killed)["rounds"]
    assert [r["round"] for r in log] == [0, 1]
    assert sum(1 for p in pairs if p[1] == 1) == log[1]["n_new_pairs"]
    assert log[1]["labels"]["n"] == 6 and log[1]["accuracy"] is not None


@requires_data
def test_cli_init_step_feedback_ingest_status(tiny_llm_dir, tmp_path, cli):
    from ragsieve.evolve.store import EvolveStore

    store = tmp_path / "store"

    def invoke(*args):
        result = cli("evolve", *args)
        assert result.code == 0, result.err
        return result.out

    invoke("init", "--store", store, "--dataset", "pubmedqa", "--llm", tiny_llm_dir, "--initial-size", 8,
           "--round-size", 4, "--rounds", 2, "--judge", "reranker:bm25", "--max-prompt-tokens", 300)
    s = EvolveStore(store)
    assert s.config.method.balance  # the collapse guard is a deployed store's default
    s.close()
    assert "round 0 (sft)" in invoke("step", "--store", store)
    skipped = invoke("step", "--store", store)  # no labelled feedback yet: no labeller is checked, the round skips
    assert "round 1 (skipped)" in skipped and "no labelled feedback yet" in skipped, skipped
    s = EvolveStore(store)
    round2 = s.examples(2)
    s.close()
    fb = tmp_path / "fb.jsonl"
    fb.write_text("".join(json.dumps({"id": x.id, "label": ["no", "yes"][x.label]}) + "\n" for x in round2))
    assert "round 2: 4" in invoke("feedback", fb, "--store", store)
    assert "round 2 (feedback)" in invoke("step", "--store", store)
    assert "no queued round" in invoke("step", "--store", store)
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps({"id": "new1", "fields": {"question": "q?", "context": "c"}}) + "\n")
    assert "round 3" in invoke("ingest", batch, "--store", store)
    status = json.loads(invoke("status", "--store", store, "--json"))
    assert [r["mode"] for r in status["rounds"]] == ["sft", "skipped", "feedback"]
    assert {b["source"] for b in status["replay_buffer"] if b["round"] == 2} == {"gold"}
    assert status["queued"] == [{"round": 3, "examples": 1, "feedback": 0}]
    assert "round" in invoke("status", "--store", store)
    bad = cli("evolve", "feedback", fb, "--store", store)
    assert bad.code == 2 and "finished round 2" in bad.err


# --------------------------------------------------------------------------- experiment smoke


def test_full_experiment_config_validates_and_plans_every_cell():
    from ragsieve.config import build_config, read_mapping
    from studies.evolve import EvolveExperimentConfig, plan_cells

    spec = read_mapping(REPO / "experiments" / "evolve_small.yaml")
    assert spec["experiment"] == "evolve" and spec["out_dir"] == "results/evolve_small"
    cfg = build_config(EvolveExperimentConfig, spec["params"])
    names = {(c.dataset, c.name) for c in plan_cells(cfg)}
    # 6 datasets x 5 methods, + α 0.5/0.6/0.8/0.9 (0.7 = replay-dpo, 1.0 = dpo), + 2 ablations + balanced
    assert len(names) == 30 + 4 + 3
    assert ("bioasq", "replay-dpo@0.5") in names and ("bioasq", "cautious-dpo:no-jury") in names



def test_scale_configs_share_one_out_dir_and_plan_the_issue_matrix():
    """Stage 0 (M0s) → stage 1 (3 datasets) → full matrix reuse each other's cells, so their settings must agree."""
    from ragsieve.config import build_config, read_mapping
    from studies.evolve import EvolveExperimentConfig, plan_cells

    plans, params = {}, {}
    for name in ("evolve_scale_m0", "evolve_scale_stage1", "evolve_scale"):
        spec = read_mapping(REPO / "experiments" / f"{name}.yaml")
        assert spec["out_dir"] == "results/evolve"
        cfg = build_config(EvolveExperimentConfig, spec["params"])
        plans[name], params[name] = {(c.dataset, c.name) for c in plan_cells(cfg)}, cfg
        assert cfg.train.dpo_backend == "fast" and cfg.test_size >= 300 and cfg.rounds == 4
        assert all(cfg.sizes_for(ds).initial >= 500 and cfg.sizes_for(ds).per_round >= 200
                   for ds in cfg.datasets if ds != "pubmedqa")  # PubMedQA has 890 examples in all
    sft_only = {(d, "sft-only") for d in params["evolve_scale"].datasets}
    assert plans["evolve_scale_m0"] <= plans["evolve_scale_stage1"] | sft_only
    assert plans["evolve_scale_stage1"] < plans["evolve_scale"]
    assert len(plans["evolve_scale_stage1"]) == 26 and len(plans["evolve_scale"]) == 43
    # the guard alone (no ablations) on the two datasets whose CautiousDPO collapsed from round 1
    assert {("anli", "cautious-dpo:balanced"), ("pubmedqa", "cautious-dpo:balanced")} < plans["evolve_scale"]
    assert ("pubmedqa", "cautious-dpo:no-jury") not in plans["evolve_scale"]
    assert ("bioasq", "cautious-dpo@tau=0.8") in plans["evolve_scale_stage1"]
    shared = ("sizes", "size_overrides", "test_size", "forgetting_per_split", "m0", "m0_train", "train", "llm", "seed",
              "max_prompt_tokens", "hotpot_source", "judges", "alpha", "tau", "cautious_alpha")
    for key in shared:
        assert len({repr(getattr(c, key)) for c in params.values()}) == 1, key
    # one M0 recipe per dataset: each config carries the full matrix's overrides for the datasets it runs
    full = params["evolve_scale"].m0_train_overrides
    for c in params.values():
        assert c.m0_train_overrides == {ds: r for ds, r in full.items() if ds in c.datasets}
    assert len({c.downstream.held_out_questions for c in params.values()}) == 1  # the same HotpotQA splits
    # the mixed-M0 twin of stage 0 differs in m0 (and out_dir) only: its test outcomes pair with stage 0's
    mixed = read_mapping(REPO / "experiments" / "evolve_scale_m0_mixed.yaml")
    assert mixed["out_dir"] == "results/evolve_scale_m0_mixed" and mixed["params"]["m0"] == "mixed"
    stage0 = read_mapping(REPO / "experiments" / "evolve_scale_m0.yaml")["params"]
    assert {k: v for k, v in mixed["params"].items() if k not in ("m0", "downstream", "compare_m0_to")} == {
        k: v for k, v in stage0.items() if k not in ("m0", "downstream", "m0_train_overrides")}
    build_config(EvolveExperimentConfig, mixed["params"])
    # the M0 recipe sweep trains on the scale run's SFT sets: its task settings are stage 0's
    sweep = read_mapping(REPO / "experiments" / "evolve_m0_sweep.yaml")["params"]
    grid = ("lrs", "lrs_by_dataset", "max_epochs", "dev_size", "fit_sample", "datasets", "m0_train_overrides")
    assert {k: v for k, v in sweep.items() if k not in grid} == {k: stage0[k] for k in sweep if k not in grid}
    assert set(sweep["datasets"]) <= set(stage0["datasets"]) and stage0["m0_train"]["lr"] in sweep["lrs"]
    # PubMedQA has no dev set: its recipe is the committed sweep's pooled choice (README of the sweep)
    pooled = json.loads((REPO / "results" / "evolve_m0_sweep" / "metrics.json").read_text())["pooled"]["chosen"]
    scale = read_mapping(REPO / "experiments" / "evolve_scale.yaml")["params"]
    assert scale["m0_train_overrides"]["pubmedqa"] == {"lr": pooled["lr"], "epochs": pooled["epochs"]}


@requires_data
def test_experiment_smoke_config_on_tiny_model_resumes_per_cell(tiny_llm_dir, tmp_path, monkeypatch):
    """experiments/evolve_smoke.yaml with the tiny LLM: every output key, plots, per-cell resume."""
    from studies import runner as experiments
    from studies.evolve import PAIRED_TESTS, EvolveExperiment
    out = tmp_path / "out"
    cfg = tmp_path / "evolve_smoke.yaml"
    raw = (REPO / "experiments" / "evolve_smoke.yaml").read_text()
    cfg.write_text(raw.replace("out_dir: /tmp/ragsieve-evolve-smoke", f"out_dir: {out}"))
    downstream = {"held_out_questions": 2, "generator": str(tiny_llm_dir), "max_new_tokens": 2,
                  "max_prompt_tokens": 400, "base_reranker": "bm25"}
    overrides = {
        "llm": str(tiny_llm_dir), "judges": [f"llm:{tiny_llm_dir}", "reranker:bm25"], "downstream": downstream,
        "m0_train": {"lr": 1e-2, "batch_size": 8}, "train": {"lr": 1e-2, "batch_size": 8},
    }
    metrics = experiments.run_experiment_file(cfg, overrides=overrides)
    for key in ("by_dataset", "alpha_sweep", "tau_sweep", "ablation", "pseudo_label_accuracy", "pseudo_labels",
                "downstream", "targets", "test_curves", "forgetting", "m0_test", "paired", "scale_targets"):
        assert key in metrics
    # the fixed test set: M0 once, then M_t after every round, same examples for every cell
    m0 = json.loads((out / "cells" / "pubmedqa" / "_m0.json").read_text())
    assert len(m0["test_ids"]) == 8 and len(m0["test"]["correct"]) == 8
    assert len(m0["test"]["margins"]) == 8 and len(m0["test_query_ids"]) == 8  # the ranking view: AUROC
    assert {"auroc", "ci95", "queries"} <= set(metrics["m0_test"]["pubmedqa"]["auroc"])
    for name in ("sft", "replay-dpo", "cautious-dpo"):
        cell = json.loads((out / "cells" / "pubmedqa" / f"{name}.json").read_text())
        assert cell["test_ids"] == m0["test_ids"]
        assert [len(r["test"]["correct"]) for r in cell["rounds"]] == [8, 8]
        assert all(set(r["test"]["correct"]) <= {"0", "1"} for r in cell["rounds"])
        assert [sorted(r["forgetting"]["splits"]) for r in cell["rounds"]] == [["0", "1"], ["0", "1", "2"]]
    test_curve = metrics["test_curves"]["pubmedqa"]["dpo"]
    assert [r["round"] for r in test_curve] == [0, 1, 2] and all(r["n"] == 8 and r["ci95"] for r in test_curve)
    assert all("auroc" in r for r in test_curve)
    assert set(metrics["paired"]["pubmedqa"]) == {f"{a} vs {b}" for a, b in PAIRED_TESTS}
    for name in ("replay-dpo vs dpo", "cautious-dpo vs sft-only"):
        paired = metrics["paired"]["pubmedqa"][name]
        assert paired["n"] == 8 and 0 <= paired["p_value"] <= 1 and paired["verdict"]
        assert paired["p_value"] <= paired["p_holm"] <= 1 and paired["holm_family"] == len(PAIRED_TESTS)
        assert paired["a_only"] + paired["b_only"] <= 8
        assert {"diff", "low", "high", "p_value"} <= set(paired["auroc"])  # the ranking view, paired
    targets = metrics["scale_targets"]
    assert set(targets) == {"m0_above_chance_plus_10pp", "replay_ge_dpo_last_round", "cautious_gt_sft_only"}
    assert "p_value" in targets["replay_ge_dpo_last_round"]["per_dataset"]["pubmedqa"]
    assert "p_value_vs_chance" in metrics["m0_test"]["pubmedqa"]
    labels = metrics["pseudo_labels"]["pubmedqa"]["cautious-dpo"]
    assert [r["round"] for r in labels] == [1, 2] and all("accepted_true" in r and "self" in r for r in labels)
    assert set(metrics["tau_sweep"]["pubmedqa"]) == {"0.8", "0.9"}
    assert not (out / "cells" / "pubmedqa" / "dpo").exists()  # per-round files dropped once the cell is done
    qa = metrics["downstream_stats"]
    assert qa["vs"] == "base-reranker" and {"em", "f1", "containment", "n"} <= set(qa["intervals"]["replay-dpo"])
    assert qa["paired"]["replay-dpo"]["f1"]["n"] == 2 and "verdict" in qa["paired"]["replay-dpo"]["em"]
    # the reranker's own share of supporting sentences in its top k, paired with the base reranker's
    assert 0 <= qa["intervals"]["replay-dpo"]["support_recall"]["mean"] <= 1
    assert "support_recall" in qa["paired"]["replay-dpo"] and "support_recall" not in qa["intervals"]["gold-support"]
    curve = metrics["by_dataset"]["pubmedqa"]["replay-dpo"]
    assert [r["round"] for r in curve] == [1, 2] and all(r["n"] == 4 for r in curve)
    assert all(lo <= r["accuracy"] <= hi for r in curve for lo, hi in [r["accuracy_ci95"]])
    assert set(metrics["alpha_sweep"]["pubmedqa"]) == {"0.5", "0.7", "1"}
    assert set(metrics["ablation"]["pubmedqa"]) == {"cautious-dpo", "no-gating", "no-jury", "balanced"}
    assert metrics["pseudo_label_accuracy"]["pubmedqa"]["cautious-dpo"][0]["round"] == 1
    assert {"sft-only", "replay-dpo", "gold-support", "closed-book"} <= set(metrics["downstream"])
    assert metrics["downstream"]["dpo"]["n"] == 2
    assert (out / "accuracy_pubmedqa.png").stat().st_size > 0
    assert (out / "alpha_sweep_pubmedqa.png").stat().st_size > 0 and (out / "ablation_pubmedqa.png").stat().st_size > 0
    assert json.loads((out / "metrics.json").read_text())["sizes"]["pubmedqa"]["initial"]["n"] == 8
    tables = (out / "TABLES.md").read_text()  # generated with metrics.json: every section of the study
    for heading in ("## M0 on the test set", "### pubmedqa", "## Paired comparisons on the last round",
                    "## The issue's targets", "### ReplayDPO: share α of new pairs, pubmedqa",
                    "### CautiousDPO: gate τ, pubmedqa", "### CautiousDPO variants, pubmedqa",
                    "## Accepted pseudo-labels per round", "## Forgetting", "## Downstream QA"):
        assert heading in tables
    assert "| pubmedqa | replay-dpo vs dpo | 8 |" in tables and "p (Holm)" in tables
    # every sweep cell is paired with its reference cells (SWEEP_REFERENCES), Holm within each sweep
    sweeps = metrics["sweep_paired"]
    assert set(sweeps["alpha_sweep"]["pubmedqa"]) == {"0.5 vs dpo", "0.7 vs dpo"}
    assert set(sweeps["tau_sweep"]["pubmedqa"]) == {"0.8 vs cautious-dpo", "0.8 vs sft-only", "0.9 vs sft-only"}
    assert set(sweeps["ablation"]["pubmedqa"]) == {f"{v} vs {ref}" for v in ("no-gating", "no-jury", "balanced")
                                                   for ref in ("cautious-dpo", "sft-only")} | {"cautious-dpo vs sft-only"}
    assert all(r["n"] == 8 and r["holm_family"] == 7 for r in sweeps["ablation"]["pubmedqa"].values())
    assert tables.count("Paired on the last round (p (Holm) over these") == 3
    assert "| pubmedqa | 0.5 vs dpo | 8 |" in tables

    monkeypatch.setattr(EvolveExperiment, "_run_cell", lambda *a, **k: pytest.fail("finished cells must be skipped"))
    again = experiments.run_experiment_file(cfg, overrides=overrides)
    assert again["by_dataset"] == metrics["by_dataset"]
    # --report-only rebuilds the report from the finished cells and runs nothing, even with cells pending
    (out / "metrics.json").unlink()
    (out / "TABLES.md").unlink()
    dpo_cell = (out / "cells" / "pubmedqa" / "dpo.json").read_bytes()
    (out / "cells" / "pubmedqa" / "dpo.json").unlink()
    ensure_m0 = EvolveExperiment._ensure_m0
    monkeypatch.setattr(EvolveExperiment, "_ensure_m0", lambda *a, **k: pytest.fail("report-only trains nothing"))
    report = experiments.run_experiment_file(cfg, overrides=overrides, report_only=True)
    assert report["cells"]["finished"] == metrics["cells"]["finished"] - 1
    assert "dpo" not in report["test_curves"]["pubmedqa"]
    assert "alpha_sweep" not in report["sweep_paired"]  # every α is paired with DPO, which is pending
    assert json.loads((out / "metrics.json").read_text())["cells"] == report["cells"] and (out / "TABLES.md").exists()
    (out / "cells" / "pubmedqa" / "dpo.json").write_bytes(dpo_cell)
    report = experiments.run_experiment_file(cfg, overrides=overrides, report_only=True)
    same = lambda key: json.dumps(report[key], sort_keys=True) == json.dumps(metrics[key], sort_keys=True)  # noqa: E731
    assert same("sweep_paired") and same("paired")  # (as JSON: a NaN equals itself there)
    monkeypatch.setattr(EvolveExperiment, "_ensure_m0", ensure_m0)

    # Records name the M0 weights they were scored with: a record older than that is re-scored and kept
    # only if M0's verdicts come out the same; a record or cell of other weights stops the run.
    record_path = out / "cells" / "pubmedqa" / "_m0.json"
    weights = m0["m0_weights"]
    assert weights and json.loads((out / "cells" / "pubmedqa" / "sft.json").read_text())["m0_weights"] == weights
    # M0's weights stay out of git (work/ is ignored but for the small records); their sha256 is recorded
    assert "work/pubmedqa/m0/adapter_model.safetensors" in json.loads((out / "artifacts.json").read_text())
    assert "m0/" not in (out / "work" / ".gitignore").read_text()
    assert json.loads((out / "work" / "pubmedqa" / "m0_d1.json").read_text())["m0_weights"] == weights
    legacy = {k: v for k, v in m0.items() if k != "m0_weights"}
    record_path.write_text(json.dumps(legacy))
    experiments.run_experiment_file(cfg, overrides=overrides)
    assert json.loads(record_path.read_text())["m0_weights"] == weights
    (out / "cells" / "pubmedqa" / "dpo.json").unlink()  # a pending cell: M0 is loaded and checked
    record_path.write_text(json.dumps({**m0, "m0_weights": "retrained"}))
    with pytest.raises(RagsieveError, match="scored with M0 weights retrained"):
        experiments.run_experiment_file(cfg, overrides=overrides)
    record_path.write_text(json.dumps(m0))
    sft_path = out / "cells" / "pubmedqa" / "sft.json"
    sft_path.write_text(json.dumps({**json.loads(sft_path.read_text()), "m0_weights": "retrained"}))
    with pytest.raises(RagsieveError, match="started from M0 weights retrained"):
        experiments.run_experiment_file(cfg, overrides=overrides)


_CELL_KILL_SCRIPT = """
import sys, time
from studies import evolve as ev
from studies import runner
write = ev.write_json
def write_then_hang(path, data, indent=1):
    write(path, data, indent)
    if path.name == "round-2.json" and path.parent.name == "dpo":  # round 2 checkpointed, round 3 not started
        print("CHECKPOINTED", flush=True)
        time.sleep(600)
ev.write_json = write_then_hang
runner.run_experiment_file(sys.argv[1], overrides={"llm": sys.argv[2]})
"""


@requires_data
def test_a_killed_cell_resumes_after_its_last_checkpointed_round(tiny_llm_dir, tmp_path, monkeypatch):
    """kill -9 inside a cell: the rerun rebuilds M_2 from M0 + saved deltas and trains round 3 only,
    ending where an uninterrupted run ends."""
    from ragsieve.evolve import methods
    from studies import runner

    def config(out, methods="[dpo]"):
        path = tmp_path / f"{out.name}.yaml"
        path.write_text(
            f"experiment: evolve\nout_dir: {out}\nparams:\n  datasets: [pubmedqa]\n  methods: {methods}\n  rounds: 3\n"
            "  sizes: {initial: 8, per_round: 4}\n  test_size: 8\n  forgetting_per_split: 2\n"
            "  max_prompt_tokens: 300\n  m0_train: {lr: 1.0e-2, batch_size: 8}\n  train: {lr: 1.0e-2, batch_size: 4}\n"
            "  downstream: {enabled: false}\n  threads: 1\n"
        )
        return path

    killed, reference = tmp_path / "killed", tmp_path / "reference"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1"}
    _kill_at([sys.executable, "-c", _CELL_KILL_SCRIPT, str(config(killed, "[sft-only, dpo]")), str(tiny_llm_dir)],
             "CHECKPOINTED", env)
    # the cell finished before the kill is already in metrics.json (committed part-way in a long run)
    partial = json.loads((killed / "metrics.json").read_text())
    assert partial["cells"] == {"finished": 1, "planned": 2} and set(partial["test_curves"]["pubmedqa"]) == {"sft-only"}
    assert (killed / "accuracy_pubmedqa.png").exists()
    part = killed / "cells" / "pubmedqa" / "dpo"
    assert sorted(p.name for p in part.iterdir()) == ["round-1.json", "round-2.json"]
    assert (killed / "work" / "pubmedqa" / "dpo" / "round-2" / "adapter_config.json").exists()
    assert not (killed / "cells" / "pubmedqa" / "dpo.json").exists()
    # What a commit takes along to the next session's fresh clone: M0's record and its D_1 verdicts; no weights
    # (M0's adapter is a training output: its sha256 is in artifacts.json), no round adapters.
    subprocess.run(["git", "init", "-q", str(killed)], check=True)
    ignored = lambda rel: subprocess.run(["git", "-C", str(killed), "check-ignore", "-q", rel]).returncode == 0  # noqa: E731
    work = killed / "work" / "pubmedqa"
    assert not any(ignored(str(p.relative_to(killed))) for p in [work / "m0.json", work / "m0_d1.json"])
    assert all(ignored(str(p.relative_to(killed))) for p in [*(work / "m0").iterdir(),
                                                           *(work / "dpo" / "round-2").iterdir()])

    calls = []
    real_round = methods.evolve_round
    monkeypatch.setattr(methods, "evolve_round", lambda *a, **k: calls.append(k["round_id"]) or real_round(*a, **k))
    resumed = runner.run_experiment_file(config(killed, "[sft-only, dpo]"), overrides={"llm": str(tiny_llm_dir)})
    assert calls == [3]  # rounds 1 and 2 came from their checkpoints
    calls.clear()
    fresh = runner.run_experiment_file(config(reference), overrides={"llm": str(tiny_llm_dir)})
    assert calls == [1, 2, 3]
    cell = lambda out: json.loads((out / "cells" / "pubmedqa" / "dpo.json").read_text())  # noqa: E731
    a, b = cell(killed), cell(reference)
    assert [r["test"]["correct"] for r in a["rounds"]] == [r["test"]["correct"] for r in b["rounds"]]
    assert [r["pairs"] for r in a["rounds"]] == [r["pairs"] for r in b["rounds"]]
    assert resumed["test_curves"]["pubmedqa"]["dpo"] == fresh["test_curves"]["pubmedqa"]["dpo"]
    assert resumed["cells"] == {"finished": 2, "planned": 2}
    assert not part.exists() and not (killed / "work" / "pubmedqa" / "dpo").exists()


@requires_data
def test_m0_sweep_scores_every_epoch_on_a_dev_set_chooses_and_skips_what_is_done(tiny_llm_dir, tmp_path, monkeypatch):
    from ragsieve.config import build_config
    from rich.console import Console

    from ragsieve.evolve.tasks import select_dev
    from ragsieve.evolve.train import VerdictSFTTrainer
    from studies.evolve import EvolveExperiment, EvolveExperimentConfig, plan_cells
    from studies.evolve_m0_sweep import EvolveM0Sweep, EvolveM0SweepConfig

    params = {"llm": str(tiny_llm_dir), "datasets": ["bioasq"], "rounds": 1, "sizes": {"initial": 8, "per_round": 4},
              "test_size": 6, "max_prompt_tokens": 300, "m0_train": {"lr": 1e-2, "epochs": 2, "batch_size": 4},
              "lrs": [1e-2, 3e-2], "max_epochs": 2, "dev_size": 6, "fit_sample": 4, "threads": 1}
    cfg = build_config(EvolveM0SweepConfig, params)
    metrics = EvolveM0Sweep().run(cfg, tmp_path, Console(quiet=True))
    r = metrics["by_dataset"]["bioasq"]
    assert [(g["lr"], g["epochs"]) for g in r["grid"]] == [(1e-2, 1), (1e-2, 2), (3e-2, 1), (3e-2, 2)]
    assert {k: r["dev"][k] for k in ("n", "positives")} == {"n": 6, "positives": 3} and r["configured"]["lr"] == 1e-2
    assert r["dev"]["interval"] == "bootstrap over queries" and 1 <= r["dev"]["queries"] <= 6  # dev shares questions
    best = max(g["accuracy"] for g in r["grid"])
    assert r["chosen"]["dev_accuracy"] == best
    assert (r["override"] == {}) == (r["chosen"] == {**r["chosen"], "lr": 1e-2, "epochs": 2})
    cell = json.loads((tmp_path / "cells" / "bioasq" / "lr=0.01.json").read_text())
    task = EvolveExperiment()._task(cfg, "bioasq")
    dev_ids = {x.id for x in select_dev(task, 6)}
    assert set(cell["key"]["dev"]) == dev_ids and not dev_ids & {x.id for x in task.test}
    assert cell["epochs"]["2"]["fit_sample"]["n"] == 4 and len(cell["epochs"]["1"]["dev"]["correct"]) == 6
    # a rerun trains nothing; other settings in the same out_dir stop with a one-line error
    monkeypatch.setattr(VerdictSFTTrainer, "loss", lambda *a: pytest.fail("a finished sweep trained again"))
    assert EvolveM0Sweep().run(cfg, tmp_path, Console(quiet=True))["by_dataset"]["bioasq"]["chosen"] == r["chosen"]
    with pytest.raises(RagsieveError, match="other settings"):
        EvolveM0Sweep().run(build_config(EvolveM0SweepConfig, {**params, "dev_size": 4}), tmp_path, Console(quiet=True))
    # a dataset's own, smaller grid reuses the finished learning rates; a stray dataset name is an error
    own = EvolveM0Sweep().run(build_config(EvolveM0SweepConfig, {**params, "lrs_by_dataset": {"bioasq": [1e-2]}}),
                              tmp_path, Console(quiet=True))["by_dataset"]["bioasq"]
    assert [(g["lr"], g["epochs"]) for g in own["grid"]] == [(1e-2, 1), (1e-2, 2)]
    with pytest.raises(RagsieveError, match="not in datasets"):
        EvolveM0Sweep().run(build_config(EvolveM0SweepConfig, {**params, "lrs_by_dataset": {"anli": [1e-2]}}),
                            tmp_path, Console(quiet=True))
    # the chosen recipe is a per-dataset override of the scale run: only that dataset's M0 and cells change
    scale = {"datasets": ["bioasq", "fever"], "m0_train": {"lr": 2e-4, "epochs": 2}, "test_size": 6}
    plain = build_config(EvolveExperimentConfig, scale)
    tuned = build_config(EvolveExperimentConfig, {**scale, "m0_train_overrides": {"bioasq": {"lr": 5e-4}}})
    assert tuned.m0_train_for("bioasq").epochs == 2 and tuned.m0_train_for("bioasq").lr == 5e-4
    assert tuned.m0_train_for("fever") == plain.m0_train_for("fever")
    for bad, match in (({"anli": {"lr": 1e-3}}, "not in datasets"), ({"bioasq": {"lrr": 1e-3}}, "lrr")):
        with pytest.raises(Exception, match=match):
            plan_cells(build_config(EvolveExperimentConfig, {**scale, "m0_train_overrides": bad}))


@requires_data
def test_m0_sweep_report_only_rebuilds_metrics_from_the_cells_with_intervals_over_queries(tmp_path):
    """--report-only trains nothing: the dev set is rebuilt for its query ids, every dev accuracy gets an
    interval over whole queries (MultiRC: a passage's answers), chosen vs configured a paired bootstrap
    over queries, Holm-adjusted; a missing cell or one of other settings is a one-line error."""
    from ragsieve.config import build_config
    from rich.console import Console

    from ragsieve.eval.stats import bootstrap_ci
    from ragsieve.evolve.tasks import select_dev
    from studies import runner
    from studies.evolve import EvolveExperiment
    from studies.evolve_m0_sweep import EvolveM0Sweep, EvolveM0SweepConfig

    params = {"llm": "not-loaded", "datasets": ["multirc"], "rounds": 1, "sizes": {"initial": 8, "per_round": 4},
              "test_size": 6, "m0_train": {"lr": 1e-2, "epochs": 2, "batch_size": 4}, "lrs": [1e-2, 3e-2],
              "max_epochs": 2, "dev_size": 40}
    cfg = build_config(EvolveM0SweepConfig, params)
    task = EvolveExperiment()._task(cfg, "multirc")
    dev = select_dev(task, cfg.dev_size, cfg.seed)
    queries = [x.query_id for x in dev]
    assert len(set(queries)) < len(dev)  # MultiRC: several answers per passage
    n = len(dev)
    outcomes = {(1e-2, 1): "01" * (n // 2), (1e-2, 2): "0011" * (n // 4), (3e-2, 1): "1" * (n // 2) + "0" * (n // 2),
                (3e-2, 2): "1" * (n - 4) + "0" * 4}
    for lr in cfg.lrs:
        epochs = {str(e): {"dev": {"correct": outcomes[(lr, e)], "auroc": 0.6, "auroc_ci95": [0.5, 0.7],
                                   "positive_rate": 0.5},
                           "fit_sample": None, "loss_last_epoch": 0.5} for e in (1, 2)}
        path = EvolveM0Sweep._cell(tmp_path, "multirc", lr)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": EvolveM0Sweep._key(cfg, task, dev, lr), "epochs": epochs}))
    spec = tmp_path / "sweep.yaml"
    spec.write_text(json.dumps({"experiment": "evolve_m0_sweep", "out_dir": str(tmp_path), "params": params}))
    metrics = runner.run_experiment_file(spec, Console(quiet=True), report_only=True)
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    r = metrics["by_dataset"]["multirc"]
    assert r["dev"] == {"n": n, "positives": n // 2, "interval": "bootstrap over queries", "queries": len(set(queries))}
    assert (r["chosen"]["lr"], r["chosen"]["epochs"]) == (3e-2, 2) and r["override"] == {"lr": 3e-2}
    _, low, high = bootstrap_ci([int(c) for c in outcomes[(3e-2, 2)]], groups=queries)
    assert r["chosen"]["ci95"] == [round(low, 4), round(high, 4)]
    paired = r["chosen_vs_configured"]
    assert paired["test"] == "paired bootstrap over queries" and paired["queries"] == len(set(queries))
    assert paired["chosen_only"] - paired["configured_only"] == round(paired["diff"] * n)
    assert paired["holm_family"] == 1 and paired["p_holm"] == paired["p_value"] and paired["verdict_holm"]
    with pytest.raises(RagsieveError, match="other settings"):
        EvolveM0Sweep().report(build_config(EvolveM0SweepConfig, {**params, "max_epochs": 3}), tmp_path,
                               Console(quiet=True))
    EvolveM0Sweep._cell(tmp_path, "multirc", 3e-2).unlink()
    with pytest.raises(RagsieveError, match="is missing"):
        EvolveM0Sweep().report(cfg, tmp_path, Console(quiet=True))


@requires_data
def test_mixed_m0_is_one_adapter_for_every_dataset_scored_on_each_test_set(tiny_llm_dir, tmp_path):
    from ragsieve.config import build_config
    from rich.console import Console

    from studies.evolve import EvolveExperiment, EvolveExperimentConfig, plan_cells

    cfg = build_config(EvolveExperimentConfig, {
        "llm": str(tiny_llm_dir), "datasets": ["pubmedqa", "hotpotqa-distractor"], "methods": ["sft-only"],
        "rounds": 1, "sizes": {"initial": 6, "per_round": 4}, "test_size": 6, "m0": "mixed", "max_prompt_tokens": 300,
        "m0_train": {"lr": 1e-2, "batch_size": 4}, "downstream": {"enabled": False}, "threads": 1,
    })
    metrics = EvolveExperiment().run(cfg, tmp_path, Console(quiet=True))
    info = json.loads((tmp_path / "work" / "_mixed" / "m0.json").read_text())
    assert info["m0"] == "mixed" and info["train"]["examples"] == 12  # both SFT sets, each in its own template
    assert info["train"]["truncated_passages"] == sum(info["truncated_prompts"].values())  # counted, not a default 0
    assert not (tmp_path / "work" / "pubmedqa" / "m0").exists()
    assert set(metrics["m0_test"]) == {"pubmedqa", "hotpotqa-distractor"}
    assert all(json.loads((tmp_path / "cells" / ds / "_m0.json").read_text())["m0"] == "mixed" for ds in cfg.datasets)
    # against another run's M0 on the same test examples (here: the same file with every outcome flipped)
    mine = json.loads((tmp_path / "cells" / "pubmedqa" / "_m0.json").read_text())
    flipped = {**mine, "m0": "per-dataset", "test": {**mine["test"], "correct": "".join(
        "1" if c == "0" else "0" for c in mine["test"]["correct"])}}
    (tmp_path / "other" / "cells" / "pubmedqa").mkdir(parents=True)
    (tmp_path / "other" / "cells" / "pubmedqa" / "_m0.json").write_text(json.dumps(flipped))
    # a record committed before margins and weights were kept gets them on the next run (same verdicts)
    old = {**{k: v for k, v in mine.items() if k != "m0_weights"},
           "test": {k: v for k, v in mine["test"].items() if k not in ("margins", "auroc")}}
    (tmp_path / "cells" / "pubmedqa" / "_m0.json").write_text(json.dumps(old))
    again = EvolveExperiment().run(cfg.model_copy(update={"compare_m0_to": str(tmp_path / "other")}), tmp_path,
                                   Console(quiet=True))  # every cell is finished: only the metrics are redone
    restored = json.loads((tmp_path / "cells" / "pubmedqa" / "_m0.json").read_text())
    assert restored["test"]["margins"] == pytest.approx(mine["test"]["margins"], abs=1e-3)
    assert restored["m0_weights"] == mine["m0_weights"]
    vs = again["m0_vs_other"]
    assert set(vs) == {"other", "pubmedqa"} and vs["pubmedqa"]["a_only"] + vs["pubmedqa"]["b_only"] == 6
    assert vs["pubmedqa"]["a"] == "mixed" and vs["pubmedqa"]["b"] == "per-dataset"
    assert vs["pubmedqa"]["auroc"]["diff"] == pytest.approx(0, abs=1e-3)  # the same margins: no AUROC difference
    bad = build_config(EvolveExperimentConfig,
                       {"datasets": ["fever"], "tau_sweep": [0.8], "tau_sweep_datasets": ["anli"]})
    with pytest.raises(RagsieveError, match="tau_sweep_datasets"):
        plan_cells(bad)
    with pytest.raises(RagsieveError, match="m0: mixed"):
        plan_cells(build_config(EvolveExperimentConfig, {"m0": "mixed"}))


@requires_data
def test_a_step_reports_scoring_and_training_progress(tiny_llm_dir, tmp_path, cli):
    """`evolve step` used to be silent for minutes: scoring batches and training steps are reported."""
    from ragsieve.evolve.store import run_step
    from ragsieve.progress import reporting

    store = tmp_path / "store"
    result = cli("evolve", "init", "--store", store, "--dataset", "pubmedqa", "--llm", tiny_llm_dir,
                 "--initial-size", 8, "--round-size", 4, "--rounds", 1, "--judge", "reranker:bm25",
                 "--max-prompt-tokens", 300)
    assert result.code == 0, result.err
    events: list[tuple[str, int, int]] = []
    with reporting(lambda task, done, total: events.append((task, done, total))):
        run_step(store)  # round 0: SFT → M0
        run_step(store)  # round 1: score the batch, label, train
    tasks = {task for task, _, _ in events}
    assert {"score", "train"} <= tasks
    train = [(d, t) for task, d, t in events if task == "train"]
    assert train[-1][0] == train[-1][1]  # the last training step reported is the last one
