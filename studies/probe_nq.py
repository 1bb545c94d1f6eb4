"""`ragsieve run experiments/probe_nq.yaml`: train and evaluate the confidence probe on NQ.

Per question (split by id into train / dev / test, so no question is on both sides):
prompts closed-book (Q), with the gold passage (Q+C) and with retrieved non-gold
passages (Q+C). SmolLM2 rarely answers closed-book, so Q+C prompts supply most of
the positives; Conf() is applied to both kinds, so the probe trains on both.

For real sample sizes (``experiments/probe_nq.yaml``, issue #15) three options join:

* ``extra_datasets: [nq-open]`` adds the NQ-open questions the oracle file lacks (ids
  agree across the two files); they have no gold passage, so they get the closed-book and
  retrieved prompts only. ``hotpotqa-distractor-1517`` is accepted as ``dataset`` (the
  1,517-question distractor file, ``gold_per_question: 2`` for its two supporting paragraphs).
* ``layer_sweep: all`` captures the states of every listed layer during the same
  generation (one prefill), caches them in SQLite (``state_cache``) batch by batch, trains a
  head per layer, picks the layer on dev and reports dev and held-out test AUROC per layer.
  Finished layers are written to ``layer_sweep.json`` (and their heads to ``work/heads``)
  as they finish, so a killed sweep resumes at the next layer.
* ``n_boot > 0`` adds 95 % bootstrap intervals, resampling questions (a question's
  prompts stay together, since they share what the model knows).

Example::

    ragsieve run experiments/probe_nq.yaml   # resumable; see results/probe_nq/PLAN.md
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from rich.console import Console
from rich.table import Table

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER, DEFAULT_LLM
from ragsieve.eval.stats import auroc_difference, auroc_interval
from ragsieve.probe.train import ProbeTrainConfig
from studies.common import progress_bar, write_json

if TYPE_CHECKING:
    from ragsieve.data.records import Dataset, Question

#: datasets the probe studies load beyond the registry's (name → loader)
HOTPOT_1517 = "hotpotqa-distractor-1517"


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
    # -- scale options (issue #15); every default keeps the 1,000-question study as it was --
    # Datasets whose questions missing from `dataset` join it (same ids across NQ files);
    # without a gold passage they get the closed-book and retrieved prompts only.
    extra_datasets: list[str] = []
    gold_per_question: int = 1  # passages in the gold prompt (HotpotQA: its 2 supporting paragraphs)
    # [] = read `layer` only; else these layers (or "all") are captured in the same
    # forward as the answer, a head is trained per layer and the layer is chosen on dev.
    layer_sweep: list[int | float] | Literal["all"] = []
    # Dev AUROC that picks the layer: "mean" of the Q and Q+C AUROCs (each within its kind, so
    # telling a bare question from one with a passage earns nothing), "qc", "q", or "all" states.
    layer_criterion: Literal["mean", "qc", "q", "all"] = "mean"
    n_boot: int = 0  # bootstrap resamples for 95 % intervals (0 = none, as before)
    # SQLite file of hidden states; None = $RAGSIEVE_CACHE/states.sqlite (shared by studies).
    state_cache: str | None = None
    # Result folders of earlier runs (same LLM, max_new_tokens, max_prompt_tokens; checked against
    # their metrics.json) whose stored answers to identical prompts are copied instead of regenerated.
    reuse_generations_from: list[str] = []
    # Saved probes for the same LLM (folders or embedded:<name>, e.g. the shipped one) scored on the
    # same held-out prompts as this run's probe: AUROC difference with a question-level paired bootstrap.
    compare_to: list[str] = []


def load_study_dataset(name: str, data_dir: str | None = None) -> "Dataset":
    """A registry dataset, or ``hotpotqa-distractor-1517`` (the 1,517-question distractor file, paragraph ids =
    titles, gold = the supporting paragraphs), which the registry's ``hotpotqa-distractor`` (100 questions) lacks.

    Example::

        ds = load_study_dataset("hotpotqa-distractor-1517")   # 1,517 questions, their 10 paragraphs each
    """
    if name == HOTPOT_1517:
        from ragsieve.benchmarks.mining import hotpot_1517

        return hotpot_1517(data_dir)
    from ragsieve.data import load_dataset

    return load_dataset(name, data_dir=data_dir)


def _canonical_spec(spec: str) -> str:
    from ragsieve.errors import ModelNotAvailable
    from ragsieve.models.specs import ModelSpec

    try:
        return str(ModelSpec.parse(spec))
    except ModelNotAvailable:
        return spec


def answer_settings_differ(folder: Path, llm: str, max_new_tokens: int, max_prompt_tokens: int) -> str | None:
    """Why the answers stored in a result folder cannot stand for this run's (None = they can).

    An answer depends on the LLM, the answer length and the prompt's token budget (which cuts
    long contexts); the folder's ``metrics.json`` records the settings it was made with.
    """
    metrics, gens = folder / "metrics.json", folder / "generations.jsonl"
    if not gens.is_file() or not metrics.is_file():
        return f"{folder} has no generations.jsonl or no metrics.json (its settings cannot be checked)"
    made = dict(json.loads(metrics.read_text()).get("config", {}))
    if made.get("llm") and _canonical_spec(made["llm"]) == _canonical_spec(llm):
        made["llm"] = llm  # "path" and "hf:path" name one model
    wanted = {"llm": llm, "max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens}
    differ = [f"{k}={made.get(k)!r} there, {v!r} here" for k, v in wanted.items() if made.get(k, v) != v]
    return f"{folder} answered with other settings: {'; '.join(differ)}" if differ else None


def study_questions(cfg: ProbeExperimentConfig) -> tuple["Dataset", list["Question"], dict[str, str]]:
    """(the main dataset, its questions plus the extra datasets' new ones, question id → source name)."""
    ds = load_study_dataset(cfg.dataset, cfg.data_dir)
    questions = list(ds.questions)
    source = {q.id: cfg.dataset for q in questions}
    for name in cfg.extra_datasets:
        for q in load_study_dataset(name, cfg.data_dir).questions:
            if q.id not in source:
                questions.append(q)
                source[q.id] = name
    return ds, questions, source


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
        from ragsieve.models import load_local_llm
        from ragsieve.paths import cache_dir
        from ragsieve.probe.cache import StateCache
        from ragsieve.probe.hidden import HiddenStateExtractor
        from ragsieve.prompts import load_qa_prompts
        from ragsieve.prompts.builder import PromptBuilder
        from ragsieve.retrieve.cached import build_or_load_index

        t0 = time.perf_counter()
        ds, questions, source = study_questions(cfg)
        splits = select_questions(questions, cfg.split, cfg.n_questions, cfg.seed)
        (out_dir / "split.json").write_text(
            json.dumps({k: [q.id for q in v] for k, v in splits.items()}, indent=1) + "\n"
        )
        retriever, _ = build_or_load_index(cfg.dataset, ds.passages, cfg.retriever, cfg.encoder)
        passages = ds.passage_by_id()
        llm = load_local_llm(cfg.llm)
        builder = PromptBuilder(llm, load_qa_prompts(), cfg.max_prompt_tokens)
        requests, split_of = _label_requests(cfg, splits, retriever, passages)

        # States are captured while answering and cached; the extractor below then only
        # computes what an interrupted earlier run did not store.
        cache = StateCache(Path(cfg.state_cache) if cfg.state_cache else cache_dir() / "states.sqlite")
        extractor = HiddenStateExtractor(llm, cfg.layer, batch_size=cfg.batch_size, cache=cache)
        sweep_layers = _sweep_layers(cfg, llm.num_layers)
        reused, generations = _answer_and_label(cfg, out_dir, console, llm, builder, requests, extractor, cache,
                                                sweep_layers)
        t_label = time.perf_counter() - t0

        prompts = [builder.chat_prompt(r.question, r.contexts) for r in requests]
        labels = np.array([g.correct for g in generations], dtype=np.int64)
        kinds = np.array(["q" if r.variant == "closed" else "qc" for r in requests])
        split_arr = np.array(split_of)
        groups = np.array([r.question_id for r in requests])
        if sweep_layers:
            layer, states, sweep, t_states = self._sweep_states(cfg, out_dir, console, llm, cache, extractor, prompts,
                                                                sweep_layers, labels, kinds, split_arr, groups,
                                                                t0, t_label)
        else:
            layer, sweep = extractor.layer, {}
            states = _extract_states(console, extractor, prompts)
            t_states = time.perf_counter() - t0 - t_label

        fit = _swept_fit(cfg, out_dir, sweep, layer, states, labels, split_arr) if sweep \
            else _fit_head(cfg, states, labels, split_arr)
        out = self._evaluate(cfg, out_dir, console, llm, layer, fit, labels, kinds, split_arr, groups,
                             splits, requests, generations, source, sweep, cache)
        if cfg.reuse_generations_from:
            out["generations_reused"] = reused
        out["seconds"] = {"label": t_label, "states": t_states, "total": time.perf_counter() - t0}
        out["config"] = cfg.model_dump()
        (out_dir / "metrics.json").write_text(json.dumps(out, indent=2) + "\n")
        _print_summary(cfg, out_dir, layer, out, console)
        return out

    def _sweep_states(self, cfg, out_dir: Path, console: Console, llm, cache, extractor, prompts, sweep_layers,
                      labels, kinds, split_arr, groups, t0: float, t_label: float) -> tuple:
        """Every swept layer's states (cached; only what answering did not capture is computed), a head per
        layer: the chosen layer, its states, the sweep's record and the seconds the states took."""
        from ragsieve.probe.hidden import fill_layer_cache, read_layer_states

        with progress_bar(console) as bar:
            task = bar.add_task(f"hidden states ({len(sweep_layers)} layers)", total=len(prompts))
            recomputed = fill_layer_cache(extractor, prompts, sweep_layers,
                                          progress=lambda n: bar.advance(task, n))
        t_states = time.perf_counter() - t0 - t_label
        sweep = self._layer_sweep(cfg, out_dir, console, llm, cache, prompts, sweep_layers,
                                  labels, kinds, split_arr, groups)
        sweep["seconds"] = time.perf_counter() - t0 - t_label - t_states  # this run's part only
        layer = sweep["chosen_layer"]
        states = read_layer_states(cache, llm.spec, layer, prompts)
        sweep["states_recomputed"] = recomputed
        return layer, states, sweep, t_states

    # -- the layer sweep -------------------------------------------------------------------
    def _layer_sweep(self, cfg, out_dir: Path, console: Console, llm, cache, prompts, layers, labels, kinds,
                     split_arr, groups) -> dict:
        """A head per layer (same data, same lr grid); the layer is chosen on dev, test only reported.

        Each finished layer is written to ``layer_sweep.json`` and its head to
        ``work/heads/layer-NN``; a rerun with the same labels and settings skips them.
        """
        from ragsieve.probe.hidden import read_layer_states
        from ragsieve.probe.model import ConfidenceProbe, ProbeConfig

        dev = split_arr == "dev"
        kinds_needed = {"mean": ("q", "qc"), "q": ("q",), "qc": ("qc",), "all": ("q", "qc")}[cfg.layer_criterion]
        pools = [dev & (kinds == k) for k in kinds_needed] if cfg.layer_criterion != "all" else [dev]
        if not any(len(set(labels[m].tolist())) == 2 for m in pools):
            # say so before 30 layers are trained for nothing
            raise RagsieveError(f"the dev split has no right and wrong answers to compare ({cfg.layer_criterion} "
                                "states), so no layer can be chosen; give more questions")
        path = out_dir / "layer_sweep.json"
        # Rows made from other labels or settings must not be mixed in: they are keyed by a fingerprint.
        fingerprint = hashlib.sha1(json.dumps({
            "labels": labels.tolist(), "split": split_arr.tolist(), "groups": groups.tolist(), "llm": llm.spec,
            "train": cfg.train.model_dump(), "lr_grid": cfg.lr_grid, "sampling": cfg.train_sampling,
            "per_class": cfg.per_class, "seed": cfg.seed, "n_boot": cfg.n_boot,
        }, sort_keys=True).encode()).hexdigest()[:16]
        saved = json.loads(path.read_text()) if path.is_file() else {}
        rows: dict[str, dict] = saved.get("layers", {}) if saved.get("fingerprint") == fingerprint else {}
        if saved and not rows:
            console.print(f"{path}: made from other labels or settings; the sweep starts again")
        for layer in layers:
            if str(layer) in rows and (_head_dir(out_dir, layer) / "probe_config.json").is_file():
                continue
            states = read_layer_states(cache, llm.spec, layer, prompts)
            fit = _fit_head(cfg, states, labels, split_arr)
            probs = fit["probs"]
            row = {"layer": layer, "lr": fit["lr"], "lr_search": fit["lr_search"],
                   "best_epoch": fit["result"].best_epoch, "history": fit["result"].history}
            for name in ("dev", "test"):
                idx = np.flatnonzero(split_arr == name)
                row[name] = {"all": auroc_interval(labels[idx], probs[idx], groups[idx], cfg.n_boot, cfg.seed)}
                for kind in ("q", "qc"):
                    sub = idx[kinds[idx] == kind]
                    row[name][kind] = auroc_interval(labels[sub], probs[sub], groups[sub], cfg.n_boot, cfg.seed)
            row["criterion"] = _criterion(row["dev"], cfg.layer_criterion)
            probe_cfg = ProbeConfig(
                llm_spec=llm.spec, layer=layer, num_layers=llm.num_layers, hidden_size=llm.hidden_size,
                probe_hidden=cfg.train.hidden, dropout=cfg.train.dropout, max_prompt_tokens=cfg.max_prompt_tokens,
            )
            ConfidenceProbe(llm, fit["result"].head, probe_cfg).save(_head_dir(out_dir, layer))
            rows[str(layer)] = row
            write_json(path, {"fingerprint": fingerprint, "criterion": cfg.layer_criterion, "layers": rows})
            console.print(f"layer {layer}: dev {cfg.layer_criterion} AUROC {_fmt(row['criterion'])}, "
                          f"test Q {_fmt(row['test']['q']['auroc'])} / Q+C {_fmt(row['test']['qc']['auroc'])}")
        for r in rows.values():  # the criterion may have changed since a row was written: read it afresh
            r["criterion"] = _criterion(r["dev"], cfg.layer_criterion)
        scored = [int(k) for k, r in rows.items() if int(k) in layers and r["criterion"] is not None]
        if not scored:
            raise RagsieveError("no layer has a dev AUROC (dev needs right and wrong answers of each kind)")
        # ties go to the layer nearest the middle, the paper's default
        chosen = max(scored, key=lambda k: (rows[str(k)]["criterion"], -abs(k - llm.num_layers / 2)))
        return {"chosen_layer": chosen, "criterion": cfg.layer_criterion,
                "by_layer": [rows[str(k)] for k in layers if str(k) in rows]}

    # -- evaluation on held-out questions --------------------------------------------------
    def _evaluate(self, cfg, out_dir: Path, console: Console, llm, layer: int, fit: dict, labels, kinds,
                  split_arr, groups, splits, requests, generations, source, sweep: dict, cache) -> dict:
        from ragsieve.eval.calibration import expected_calibration_error, plot_reliability_diagram
        from ragsieve.eval.classification import classification_metrics
        from ragsieve.probe.model import ConfidenceProbe, ProbeConfig

        result, probs, chosen = fit["result"], fit["probs"], fit["chosen"]
        probe_cfg = ProbeConfig(
            llm_spec=llm.spec, layer=layer, num_layers=llm.num_layers, hidden_size=llm.hidden_size,
            probe_hidden=cfg.train.hidden, dropout=cfg.train.dropout, max_prompt_tokens=cfg.max_prompt_tokens,
        )
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
            if cfg.n_boot:
                ci = auroc_interval(labels[idx], probs[idx], groups[idx], cfg.n_boot, cfg.seed)
                metrics[f"auroc_{kind}_ci95"] = [ci["low"], ci["high"]]
        if cfg.compare_to:
            metrics["compared"] = _compare_probes(cfg, llm, cache, probs, test_idx, kinds, labels, groups, requests)
        metrics["diagnostics"] = _diagnostics(cfg, labels, probs, test_idx, kinds, groups, requests)
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
            if cfg.extra_datasets:
                counts[name]["questions_by_source"] = {
                    s: sum(source[q.id] == s for q in splits[name]) for s in [cfg.dataset, *cfg.extra_datasets]
                }
        accuracy_by_variant = {
            v: float(np.mean([g.correct for g, r in zip(generations, requests) if r.variant == v]))
            for v in sorted({r.variant for r in requests})
        }
        keys = ["auroc_q", "auroc_qc", "accuracy_q", "accuracy_qc"]
        keys += [k for k in ("auroc_q_ci95", "auroc_qc_ci95") if k in metrics]
        probe_cfg.metrics = {k: metrics[k] for k in keys}
        if sweep:
            probe_cfg.metrics["dev_auroc_by_layer"] = {r["layer"]: r["criterion"] for r in sweep["by_layer"]}
        ConfidenceProbe(llm, result.head, probe_cfg).save(out_dir / "probe")  # git-ignored: its sha256 is recorded
        from ragsieve.artifacts import record_training_outputs

        for line in record_training_outputs(out_dir, [out_dir / "probe" / "probe.safetensors"]):
            console.print(f"[dim]{line}[/]")
        out = {
            **{k: metrics[k] for k in keys},
            "counts": counts,
            "llm_accuracy_by_variant": accuracy_by_variant,
            "details": metrics,
            "layer": layer,
            "best_epoch": result.best_epoch,
            "lr": fit["lr"],
            "lr_search_dev_auroc": fit["lr_search"],
            "train_sampling": cfg.train_sampling,
            "train_states_used": int(len(fit["train_idx"])),
            "history": result.history,
            "truncated_contexts": int(sum(g.truncated_contexts for g in generations)),
            "diagnostics": metrics["diagnostics"],
        }
        if cfg.compare_to:
            out["compared"] = metrics["compared"]
        if sweep:
            out["layer_sweep"] = sweep
        return out



def _compare_probes(cfg: ProbeExperimentConfig, llm, cache, probs, test_idx, kinds, labels, groups,
                    requests) -> dict:
    """Each probe of ``compare_to`` on this run's held-out prompts, against this run's probe (A);
    its states come from the run's cache when its layer was swept."""
    from ragsieve.eval.stats import verdict
    from ragsieve.probe.model import ConfidenceProbe

    out = {}
    for spec in cfg.compare_to:
        other = ConfidenceProbe.load(spec, llm, cache=cache, batch_size=cfg.batch_size)
        theirs = other.score_batch([requests[i].question for i in test_idx], [requests[i].contexts for i in test_idx])
        row = {"layer": other.config.layer}
        for kind in ("q", "qc"):
            mask = kinds[test_idx] == kind
            idx = test_idx[mask]
            d = auroc_difference(labels[idx], probs[idx], theirs[mask], groups[idx], cfg.n_boot, cfg.seed)
            d["verdict"] = verdict(d["p_value"], d["diff"], d["low"], d["high"]) if d["p_value"] is not None else None
            row[kind] = d
        out[spec] = row
    return out


def _diagnostics(cfg: ProbeExperimentConfig, labels, probs, test_idx, kinds, groups, requests) -> dict:
    """What each test AUROC is made of: the probe within sub-groups, and references that read no
    hidden state at all, on the same held-out prompts.

    References (0 / 1 scores): ``answer_in_question`` (a gold answer is written in the question:
    an answer that echoes the question is counted right, e.g. "which is older, X or Y?"),
    ``context_is_gold`` and ``answer_in_context`` (Q+C only). A probe whose AUROC is near a
    reference's has learnt that reference; its AUROC *within* a group (gold prompts, questions that
    do not contain their answer) is what it knows beyond it.
    """
    from ragsieve.eval.qa import contains_answer

    def auroc(y, g, scores, rows=None):
        rows = np.ones(len(y), bool) if rows is None else rows
        return auroc_interval(y[rows], np.asarray(scores, dtype=float)[rows], g[rows], cfg.n_boot, cfg.seed)

    def rate(y, rows):
        return float(y[rows].mean()) if rows.any() else None

    out = {}
    for kind in ("q", "qc"):
        idx = test_idx[kinds[test_idx] == kind]
        y, g, p = labels[idx], groups[idx], probs[idx]
        in_question = np.array([contains_answer(requests[i].question, requests[i].answers) for i in idx], bool)
        row = {
            "probe": auroc(y, g, p),
            "answer_in_question": auroc(y, g, in_question),
            "probe_within_answer_not_in_question": auroc(y, g, p, ~in_question),
            "share_answer_in_question": float(in_question.mean()) if len(idx) else None,
            "llm_accuracy": {"answer_in_question": rate(y, in_question),
                             "answer_not_in_question": rate(y, ~in_question)},
        }
        if kind == "qc":
            variant = np.array([requests[i].variant for i in idx])
            in_context = np.array([any(contains_answer(c.text, requests[i].answers) for c in requests[i].contexts)
                                   for i in idx], bool)
            row.update({
                "context_is_gold": auroc(y, g, variant == "gold"),
                "answer_in_context": auroc(y, g, in_context),
                "probe_within": {v: auroc(y, g, p, variant == v) for v in sorted(set(variant.tolist()))},
                "probe_within_answer_in_context": auroc(y, g, p, in_context),
                "share_answer_in_context": float(in_context.mean()) if len(idx) else None,
            })
            row["llm_accuracy"].update({"answer_in_context": rate(y, in_context),
                                        "answer_not_in_context": rate(y, ~in_context)})
        out[kind] = row
    return out


def _label_requests(cfg: ProbeExperimentConfig, splits: dict[str, list], retriever, passages: dict) -> tuple:
    """Per question, split by split: closed-book (Q), with its gold passages (Q+gold) when it has them, and with
    retrieved non-gold passages (Q+C); each request's split alongside."""
    from ragsieve.probe.labels import LabelRequest

    requests, split_of = [], []
    all_questions = [q for name in cfg.split for q in splits[name]]
    hits = retriever.search_batch([q.text for q in all_questions], k=cfg.retrieval_depth)
    question_split = {q.id: name for name in cfg.split for q in splits[name]}
    for q, row in zip(all_questions, hits):
        variants = [("closed", [])]
        gold = [passages[pid] for pid in q.gold_passage_ids[: cfg.gold_per_question] if pid in passages]
        if gold:  # NQ-open questions have none: closed-book and retrieved only
            variants.append(("gold", gold))
        non_gold = [h.passage for h in row if h.passage.id not in set(q.gold_passage_ids)]
        variants += [("retrieved", [p]) for p in non_gold[: cfg.retrieved_per_question]]
        for variant, ctx in variants:
            requests.append(LabelRequest(q.id, q.text, q.answers, variant, ctx))
            split_of.append(question_split[q.id])
    return requests, split_of


def _sweep_layers(cfg: ProbeExperimentConfig, num_layers: int) -> list[int]:
    """The layers ``layer_sweep`` names (``all``: every one), resolved and sorted; [] without a sweep."""
    from ragsieve.probe.hidden import resolve_layer

    if not cfg.layer_sweep:
        return []
    wanted = range(1, num_layers + 1) if cfg.layer_sweep == "all" else cfg.layer_sweep
    return sorted({resolve_layer(x, num_layers) for x in wanted})


def _answer_and_label(cfg: ProbeExperimentConfig, out_dir: Path, console: Console, llm, builder, requests,
                      extractor, cache, sweep_layers: list[int]) -> tuple:
    """Every request answered and labelled (``generations.jsonl``, resumable), the states captured meanwhile;
    first the answers ``reuse_generations_from`` holds are copied. How many were copied, and the generations."""
    from ragsieve.probe.labels import label_generations

    reused = 0
    if cfg.reuse_generations_from:
        from ragsieve.probe.labels import reuse_generations

        sources = []
        for folder in map(Path, cfg.reuse_generations_from):
            if problem := answer_settings_differ(folder, cfg.llm, cfg.max_new_tokens, cfg.max_prompt_tokens):
                raise RagsieveError(f"reuse_generations_from: {problem}")
            sources.append(folder / "generations.jsonl")
        reused = reuse_generations(requests, out_dir / "generations.jsonl", sources)
        console.print(f"{reused} of {len(requests)} answers come from {', '.join(map(str, sources))}")
    with progress_bar(console) as bar:
        task = bar.add_task("answer + label", total=len(requests))
        generations = label_generations(
            llm, builder, requests, out_dir / "generations.jsonl",
            max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size,
            progress=lambda n: bar.advance(task, n), state_layer=extractor.layer, state_cache=cache,
            state_layers=sweep_layers or None,
        )
    return reused, generations


def _extract_states(console: Console, extractor, prompts: list[str]) -> np.ndarray:
    """The extractor's layer's states of every prompt (cached ones read, the rest computed)."""
    states = np.zeros((len(prompts), extractor.dim), dtype=np.float32)
    with progress_bar(console) as bar:
        task = bar.add_task(f"hidden states (layer {extractor.layer})", total=len(prompts))
        step = 256
        for lo in range(0, len(prompts), step):
            states[lo : lo + step] = extractor.extract(prompts[lo : lo + step])
            bar.advance(task, len(prompts[lo : lo + step]))
    return states


def _swept_fit(cfg: ProbeExperimentConfig, out_dir: Path, sweep: dict, layer: int, states: np.ndarray,
               labels: np.ndarray, split_arr: np.ndarray) -> dict:
    """The chosen layer's head as the sweep kept it (not a retrained copy), in :func:`_fit_head`'s form."""
    from ragsieve.probe.model import load_head
    from ragsieve.probe.train import ProbeTrainResult

    row = next(r for r in sweep["by_layer"] if r["layer"] == layer)
    _, head = load_head(_head_dir(out_dir, layer))
    chosen, train_idx = _subsamples(cfg, labels, split_arr)
    return {"result": ProbeTrainResult(head, row["best_epoch"], row["history"]), "lr": row["lr"],
            "lr_search": row["lr_search"], "chosen": chosen, "train_idx": train_idx,
            "probs": head.predict_proba(states)}


def _print_summary(cfg: ProbeExperimentConfig, out_dir: Path, layer: int, out: dict, console: Console) -> None:
    """The held-out AUROC and balanced accuracy of Q and Q+C states, and the LLM's accuracy per prompt kind."""
    table = Table(title=f"probe on {cfg.dataset} (layer {layer}), held-out questions")
    for col in ("states", "AUROC", "accuracy (balanced)"):
        table.add_column(col)
    table.add_row("Q (closed-book)", _fmt(out["auroc_q"], out.get("auroc_q_ci95")), _fmt(out["accuracy_q"]))
    table.add_row("Q+C (with context)", _fmt(out["auroc_qc"], out.get("auroc_qc_ci95")), _fmt(out["accuracy_qc"]))
    console.print(table)
    console.print(f"LLM accuracy by prompt kind: {out['llm_accuracy_by_variant']}")
    console.print(f"wrote {out_dir / 'metrics.json'} in {out['seconds']['total']:.0f}s")


def _fit_head(cfg: ProbeExperimentConfig, states: np.ndarray, labels: np.ndarray, split_arr: np.ndarray) -> dict:
    """Balanced (or oversampled) train, balanced dev for early stopping, the lr grid on dev; one layer's states.

    The same seed gives every layer the same subsamples, so the layers compete on equal data.
    """
    from ragsieve.probe.train import train_probe_head

    chosen, train_idx = _subsamples(cfg, labels, split_arr)

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
    return {"result": result, "lr": best_lr, "lr_search": lr_search, "chosen": chosen, "train_idx": train_idx,
            "probs": result.head.predict_proba(states)}


def _subsamples(cfg: ProbeExperimentConfig, labels: np.ndarray, split_arr: np.ndarray) -> tuple[dict, np.ndarray]:
    """(balanced indices per split, train indices): a function of the labels and the seed only."""
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
    return chosen, train_idx


def _criterion(dev: dict, criterion: str) -> float | None:
    if criterion != "mean":
        return dev[criterion]["auroc"]
    values = [dev[k]["auroc"] for k in ("q", "qc") if dev[k]["auroc"] is not None]
    return float(np.mean(values)) if values else None


def _head_dir(out_dir: Path, layer: int) -> Path:
    return out_dir / "work" / "heads" / f"layer-{layer:02d}"


def _cls(fn, labels: np.ndarray, probs: np.ndarray, idx: np.ndarray) -> dict:
    if len(idx) == 0:
        return {"n": 0, "auroc": None, "accuracy": None}
    return fn(labels[idx], (probs[idx] > 0.5).astype(int), probs[idx])


def _fmt(x, ci=None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.3f}" if not ci or ci[0] is None else f"{x:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"
