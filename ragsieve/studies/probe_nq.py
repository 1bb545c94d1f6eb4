"""`ragsieve run experiments/probe_nq.yaml`: train and evaluate the confidence probe on NQ.

Per question (split by id into train / dev / test, so no question is on both sides):
prompts closed-book (Q), with the gold passage (Q+C) and with retrieved non-gold
passages (Q+C). SmolLM2 rarely answers closed-book, so Q+C prompts supply most of
the positives; Conf() is applied to both kinds, so the probe trains on both.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

import numpy as np
from rich.console import Console
from rich.table import Table

from ragsieve.config import StrictConfig
from ragsieve.models.specs import DEFAULT_ENCODER, DEFAULT_LLM
from ragsieve.probe.train import ProbeTrainConfig
from ragsieve.studies.common import progress_bar


class ProbeExperimentConfig(StrictConfig):
    dataset: str = "nq-oracle"
    llm: str = DEFAULT_LLM
    encoder: str = DEFAULT_ENCODER
    retriever: str = "hybrid"  # bm25 | dense | hybrid
    layer: float | int = 0.5
    n_questions: int = 1000  # 0 = every question
    retrieved_per_question: int = 1  # retrieved non-gold contexts per question
    retrieval_depth: int = 10
    split: dict[str, float] = {"train": 0.6, "dev": 0.15, "test": 0.25}
    per_class: dict[str, int] = {"train": 1000, "dev": 300, "test": 500}  # the paper's balanced sizes
    max_new_tokens: int = 16
    max_prompt_tokens: int = 1024
    batch_size: int = 16
    seed: int = 0
    train: ProbeTrainConfig = ProbeTrainConfig()
    # Learning rates to try (train.lr is replaced by the one with the best dev AUROC);
    # empty = train once with train.lr.
    lr_grid: list[float] = []
    # How the train split is used: "balanced" = the paper's equal-size subsample;
    # "oversample" = every state, positives resampled to match the negatives (more
    # negatives seen when positives are scarce). dev / test stay balanced either way.
    train_sampling: Literal["balanced", "oversample"] = "balanced"
    data_dir: str | None = None


def select_questions(questions, split: dict[str, float], n_questions: int, seed: int) -> dict[str, list]:
    """Split all questions by id, then keep each split's share of ``n_questions``."""
    from ragsieve.data import split_by_id

    by_id = {q.id: q for q in questions}
    ids = split_by_id(list(by_id), split, seed=seed)
    out = {}
    for name, frac in split.items():
        chosen = ids[name] if not n_questions else ids[name][: max(1, round(n_questions * frac))]
        out[name] = [by_id[i] for i in chosen]
    return out


def balanced_indices(labels: np.ndarray, per_class: int, rng: np.random.Generator) -> np.ndarray:
    """Up to ``per_class`` positives and as many negatives (as close as the data allows)."""
    pos, neg = np.flatnonzero(labels == 1), np.flatnonzero(labels == 0)
    n = min(per_class, len(pos), len(neg))
    return np.sort(np.concatenate([rng.choice(pos, n, replace=False), rng.choice(neg, n, replace=False)]))


class ProbeExperiment:
    Config = ProbeExperimentConfig

    def run(self, cfg: ProbeExperimentConfig, out_dir: Path, console: Console) -> dict:
        from ragsieve.data import load_dataset
        from ragsieve.eval.calibration import expected_calibration_error, plot_reliability_diagram
        from ragsieve.eval.classification import classification_metrics
        from ragsieve.models import load_local_llm
        from ragsieve.paths import cache_dir
        from ragsieve.probe.cache import StateCache
        from ragsieve.probe.hidden import HiddenStateExtractor
        from ragsieve.probe.labels import LabelRequest, label_generations
        from ragsieve.probe.model import ConfidenceProbe, ProbeConfig
        from ragsieve.probe.train import train_probe_head
        from ragsieve.prompts import load_qa_prompts
        from ragsieve.prompts.builder import PromptBuilder
        from ragsieve.retrieve.cached import build_or_load_index

        t0 = time.perf_counter()
        ds = load_dataset(cfg.dataset, data_dir=cfg.data_dir)
        splits = select_questions(ds.questions, cfg.split, cfg.n_questions, cfg.seed)
        (out_dir / "split.json").write_text(
            json.dumps({k: [q.id for q in v] for k, v in splits.items()}, indent=1) + "\n"
        )
        retriever, _ = build_or_load_index(cfg.dataset, ds.passages, cfg.retriever, cfg.encoder)
        passages = ds.passage_by_id()
        llm = load_local_llm(cfg.llm)
        builder = PromptBuilder(llm, load_qa_prompts(), cfg.max_prompt_tokens)

        # -- prompts: Q, Q+gold, Q+retrieved non-gold --------------------------------
        requests, split_of = [], []
        all_questions = [q for name in cfg.split for q in splits[name]]
        hits = retriever.search_batch([q.text for q in all_questions], k=cfg.retrieval_depth)
        question_split = {q.id: name for name in cfg.split for q in splits[name]}
        for q, row in zip(all_questions, hits):
            variants = [("closed", [])]
            variants += [("gold", [passages[pid]]) for pid in q.gold_passage_ids[:1] if pid in passages]
            non_gold = [h.passage for h in row if h.passage.id not in set(q.gold_passage_ids)]
            variants += [("retrieved", [p]) for p in non_gold[: cfg.retrieved_per_question]]
            for variant, ctx in variants:
                requests.append(LabelRequest(q.id, q.text, q.answers, variant, ctx))
                split_of.append(question_split[q.id])

        # States are captured while answering and cached; the extractor below then only
        # computes what an interrupted earlier run did not store.
        cache = StateCache(cache_dir() / "states.sqlite")
        extractor = HiddenStateExtractor(llm, cfg.layer, batch_size=cfg.batch_size, cache=cache)
        with progress_bar(console) as bar:
            task = bar.add_task("answer + label", total=len(requests))
            generations = label_generations(
                llm, builder, requests, out_dir / "generations.jsonl",
                max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
                progress=lambda n: bar.advance(task, n), state_layer=extractor.layer, state_cache=cache,
            )
        t_label = time.perf_counter() - t0

        prompts = [builder.chat_prompt(r.question, r.contexts) for r in requests]
        states = np.zeros((len(prompts), extractor.dim), dtype=np.float32)
        with progress_bar(console) as bar:
            task = bar.add_task(f"hidden states (layer {extractor.layer})", total=len(prompts))
            step = 256
            for lo in range(0, len(prompts), step):
                states[lo : lo + step] = extractor.extract(prompts[lo : lo + step])
                bar.advance(task, len(prompts[lo : lo + step]))
        t_states = time.perf_counter() - t0 - t_label

        labels = np.array([g.correct for g in generations], dtype=np.int64)
        kinds = np.array(["q" if r.variant == "closed" else "qc" for r in requests])
        split_arr = np.array(split_of)
        rng = np.random.default_rng(cfg.seed)
        chosen = {}
        for name in cfg.split:
            idx = np.flatnonzero(split_arr == name)
            chosen[name] = idx[balanced_indices(labels[idx], cfg.per_class.get(name, 10**9), rng)]

        train_idx = chosen["train"]
        if cfg.train_sampling == "oversample":
            every = np.flatnonzero(split_arr == "train")
            pos, neg = every[labels[every] == 1], every[labels[every] == 0]
            train_idx = np.sort(np.concatenate([neg, rng.choice(pos, len(neg), replace=True)]))

        def fit(lr: float):
            return train_probe_head(
                states[train_idx], labels[train_idx], states[chosen["dev"]], labels[chosen["dev"]],
                cfg.train.model_copy(update={"lr": lr}),
            )

        lr_search = {}
        if cfg.lr_grid:
            fits = {lr: fit(lr) for lr in cfg.lr_grid}
            lr_search = {str(lr): max(h["dev_auroc"] for h in r.history) for lr, r in fits.items()}
            best_lr = max(fits, key=lambda lr: lr_search[str(lr)])
            result = fits[best_lr]
        else:
            best_lr, result = cfg.train.lr, fit(cfg.train.lr)
        probe_cfg = ProbeConfig(
            llm_spec=llm.spec, layer=extractor.layer, num_layers=llm.num_layers, hidden_size=llm.hidden_size,
            probe_hidden=cfg.train.hidden, dropout=cfg.train.dropout, max_prompt_tokens=cfg.max_prompt_tokens,
        )
        probs = result.head.predict_proba(states)

        # -- evaluation on held-out questions ----------------------------------------
        test_idx = np.flatnonzero(split_arr == "test")
        balanced_test = chosen["test"]
        metrics: dict = {"test_balanced": _cls(classification_metrics, labels, probs, balanced_test)}
        for kind in ("q", "qc"):
            idx = test_idx[kinds[test_idx] == kind]
            natural = _cls(classification_metrics, labels, probs, idx)
            bal = idx[balanced_indices(labels[idx], 10**9, np.random.default_rng(cfg.seed))]
            metrics[f"auroc_{kind}"] = natural["auroc"]
            metrics[f"accuracy_{kind}"] = _cls(classification_metrics, labels, probs, bal)["accuracy"] if len(bal) else None
            metrics[f"test_{kind}_natural"] = natural
            metrics[f"test_{kind}_balanced_n"] = int(len(bal))
        metrics["ece_test_balanced"] = expected_calibration_error(labels[balanced_test], probs[balanced_test])
        plot_reliability_diagram(
            labels[balanced_test], probs[balanced_test], out_dir / "calibration.png",
            title=f"Probe, balanced test (n={len(balanced_test)})", xlabel="probe P(correct)",
        )

        counts = {}
        for name in cfg.split:
            idx = np.flatnonzero(split_arr == name)
            counts[name] = {
                "questions": len(splits[name]),
                "states": int(len(idx)),
                "positives_available": {k: int(((labels[idx] == 1) & (kinds[idx] == k)).sum()) for k in ("q", "qc")},
                "negatives_available": {k: int(((labels[idx] == 0) & (kinds[idx] == k)).sum()) for k in ("q", "qc")},
                "balanced_positive": int(labels[chosen[name]].sum()),
                "balanced_negative": int((labels[chosen[name]] == 0).sum()),
                "target_per_class": cfg.per_class.get(name),
            }
        accuracy_by_variant = {
            v: float(np.mean([g.correct for g, r in zip(generations, requests) if r.variant == v]))
            for v in sorted({r.variant for r in requests})
        }
        probe_cfg.metrics = {k: metrics[k] for k in ("auroc_q", "auroc_qc", "accuracy_q", "accuracy_qc")}
        ConfidenceProbe(llm, result.head, probe_cfg).save(out_dir / "probe")

        out = {
            **{k: metrics[k] for k in ("auroc_q", "auroc_qc", "accuracy_q", "accuracy_qc")},
            "counts": counts,
            "llm_accuracy_by_variant": accuracy_by_variant,
            "details": metrics,
            "layer": extractor.layer,
            "best_epoch": result.best_epoch,
            "lr": best_lr,
            "lr_search_dev_auroc": lr_search,
            "train_sampling": cfg.train_sampling,
            "train_states_used": int(len(train_idx)),
            "history": result.history,
            "truncated_contexts": int(sum(g.truncated_contexts for g in generations)),
            "seconds": {"label": t_label, "states": t_states, "total": time.perf_counter() - t0},
            "config": cfg.model_dump(),
        }
        (out_dir / "metrics.json").write_text(json.dumps(out, indent=2) + "\n")
        table = Table(title=f"probe on {cfg.dataset} (layer {extractor.layer}), held-out questions")
        for col in ("states", "AUROC", "accuracy (balanced)"):
            table.add_column(col)
        table.add_row("Q (closed-book)", _fmt(out["auroc_q"]), _fmt(out["accuracy_q"]))
        table.add_row("Q+C (with context)", _fmt(out["auroc_qc"]), _fmt(out["accuracy_qc"]))
        console.print(table)
        console.print(f"LLM accuracy by prompt kind: {accuracy_by_variant}")
        console.print(f"wrote {out_dir / 'metrics.json'} in {out['seconds']['total']:.0f}s")
        return out


def _cls(fn, labels: np.ndarray, probs: np.ndarray, idx: np.ndarray) -> dict:
    if len(idx) == 0:
        return {"n": 0, "auroc": None, "accuracy": None}
    return fn(labels[idx], (probs[idx] > 0.5).astype(int), probs[idx])


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"
