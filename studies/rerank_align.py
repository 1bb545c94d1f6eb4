"""``rerank_align``: the knowledge-boundary paper's Tables 1–3: confidence-shift
preferences, the LLM-aligned cross-encoder fine-tuned on them, ranking quality on the
preference test set, end-to-end RAG accuracy, and CBDR with the aligned reranker."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import Field, field_validator
from rich.console import Console

from ragsieve.config import StrictConfig
from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.eval.stats import bootstrap_ci
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.prefs.build import PreferenceBuildConfig
from ragsieve.rerank.base import BaseRanker
from ragsieve.benchmarks.base_reranker import BaseRerankerConfig
from ragsieve.benchmarks.relevance import RankingQuery
from ragsieve.rerank.training.trainer import CrossEncoderTrainConfig
from ragsieve.rerank.base import RetrievalOrder
from ragsieve.eval.tables import metrics_table
from studies.common import baseline_rankers, plot_sweep, progress_bar


# --- rerank_align -----------------------------------------------------------------------------


def _aligned_train_config() -> CrossEncoderTrainConfig:
    # init "" = the base reranker; 1 positive vs the 5 negatives a preference record has
    return CrossEncoderTrainConfig(init="", group_size=6)


class RAGEvalConfig(StrictConfig):
    nq_questions: int = 150  # held-out NQ questions (never in preference training)
    # "<split.json>:<key>": take the NQ questions from a probe study's split (e.g. the scale run's
    # NQ-oracle test ids, so Tables 2 and 3 share questions); None = held_out_questions(prefs)
    nq_question_split: str | None = None
    # a grader spec (e.g. embedded:default): adds the "aligned+grader" row, the sieve's rerank → grade
    # stages without its gate (a question whose passages are all graded out is answered closed-book)
    grader: str | None = None
    # result folders (generations.jsonl + metrics.json) whose answers to the same question and contexts
    # are copied instead of generated, when their LLM and token budgets match (e.g. cbdr_nq's
    # retriever top-3 = this table's retriever row)
    reuse_from: list[str] = []
    hotpotqa_questions: int = 50  # the half of the distractor sample the base reranker did not train on
    # Two reference orders that bound what a reranker can do here (rag → upper_bounds, not Table 2
    # rows): "gold-first" (the gold passages first, then the retriever's order) on every question, and
    # "shift-order" (the candidates by the probe's own Inc, what the aligned reranker learns to
    # imitate) on the questions whose shifts the preference test set holds.
    upper_bounds: bool = False
    candidates: int = 20
    top_ks: list[int] = [1, 3]
    max_new_tokens: int = 16
    max_prompt_tokens: int = 1024
    batch_size: int = 16


class RerankAlignConfig(StrictConfig):
    prefs: PreferenceBuildConfig = Field(default_factory=PreferenceBuildConfig)
    base: BaseRerankerConfig = Field(default_factory=BaseRerankerConfig)
    train: CrossEncoderTrainConfig = Field(default_factory=_aligned_train_config)
    table1_ks: list[int] = [1, 3, 5]
    rag: RAGEvalConfig = Field(default_factory=RAGEvalConfig)
    betas: list[float] = [0.0, 0.9, 0.95, 0.98]
    # The paper's β grid assumes a 7B model's confidence; a small LLM's Conf(Q) can sit far below
    # 0.9, so Table 3 also sweeps β at these quantiles of the observed Conf(Q).
    beta_quantiles: list[float] = [0.25, 0.5, 0.75, 0.9]
    encoder: str = DEFAULT_ENCODER
    # The start reranker as a user gets it (a spec, e.g. embedded:base: its cosine mix included), for
    # "base" and as the aligned training's init; None = the study's own base (`base`, trained if absent).
    init: str | None = None
    # keep the questions the start reranker trained on (its card's mining recipe) out of every test set
    exclude_base_trained: bool = False
    # aligned training once per seed: the first is the "aligned" row, the others "aligned-seed<s>"
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)

    @field_validator("train")
    @classmethod
    def _start_from_base(cls, train: CrossEncoderTrainConfig) -> CrossEncoderTrainConfig:
        # The paper fine-tunes the off-the-shelf reranker: unless `init` is given, start from
        # the base reranker (a `train:` block in YAML would otherwise bring back the MiniLM default).
        return train if "init" in train.model_fields_set else train.model_copy(update={"init": ""})


class RerankAlignExperiment:
    Config = RerankAlignConfig

    def run(self, cfg: RerankAlignConfig, out_dir: Path, console: Console) -> dict:
        from ragsieve.data import load_dataset
        from ragsieve.prefs.build import build_preference_set
        from ragsieve.prefs.preferences import read_preferences
        from ragsieve.benchmarks.base_reranker import ensure_base_reranker
        from ragsieve.rerank.neural import CrossEncoderRanker
        from ragsieve.registry import load_reranker

        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        if cfg.init:
            from ragsieve.registry import reranker_folder

            base_dir = Path(reranker_folder(cfg.init, "init"))
        else:
            base_dir = ensure_base_reranker(cfg.base, cfg.prefs.data_dir)
        excluded: set[str] = set()
        if cfg.exclude_base_trained:
            from ragsieve.benchmarks.mining import trained_question_ids

            excluded = trained_question_ids(cfg.prefs.dataset, base_dir, cfg.prefs.data_dir)
            console.print(f"{len(excluded)} {cfg.prefs.dataset} questions the start reranker trained on stay out of "
                          "the test sets")
        with progress_bar(console) as bar:
            n = cfg.prefs.train_questions + cfg.prefs.test_questions
            task = bar.add_task("confidence shifts (21 probe passes / question)", total=n)
            # the text-bearing preference files stay in the git-ignored work/; prefs/ gets ids and scores
            prefs_stats = build_preference_set(cfg.prefs, out_dir / "work" / "prefs", lambda k: bar.advance(task, k),
                                               exclude_from_test=excluded, commit_dir=out_dir / "prefs")
        timings["prefs"] = time.perf_counter() - t0
        console.print(f"preference set: {json.dumps(prefs_stats)}")

        t = time.perf_counter()
        train_records = read_preferences(out_dir / "work" / "prefs" / "prefs_train.jsonl")
        aligned_dirs = {
            aligned_row(i, seed): self._train_aligned(cfg, out_dir / aligned_folder(i, seed), base_dir, train_records,
                                                      seed, console)
            for i, seed in enumerate(cfg.seeds)
        }
        timings["train_aligned"] = time.perf_counter() - t

        def load(folder: Path) -> BaseRanker:
            # with `init`, every cross-encoder scores as a user gets it (a card's cosine mix included)
            return load_reranker(str(folder), whole_passages=False) if cfg.init else CrossEncoderRanker(str(folder))

        rankers: dict[str, BaseRanker] = {
            **baseline_rankers(cfg.encoder),
            "base": load(base_dir),
            **{name: load(folder) for name, folder in aligned_dirs.items()},
        }
        ds = load_dataset(cfg.prefs.dataset, data_dir=cfg.prefs.data_dir)
        test_queries = preference_ranking_queries(
            read_preferences(out_dir / "work" / "prefs" / "prefs_test.jsonl"), out_dir / "prefs" / "shifts.jsonl"
        )
        rank_keys = ranker_keys(cfg, base_dir, aligned_dirs)
        per_pref = {name: cached_per_query(r, rank_keys[name], test_queries, cfg.table1_ks,
                                           out_dir / "work" / "prefs_test")
                    for name, r in rankers.items()}
        table1 = {name: preference_means(per) for name, per in per_pref.items()}
        table1_stats = {
            "ci95": {name: {m: list(bootstrap_ci(list(v.values()), seed=cfg.prefs.seed)[1:]) for m, v in per.items()}
                     for name, per in per_pref.items()},
            # P@1: exact McNemar, P@3: paired bootstrap, each aligned row against base on the same questions
            "vs_base": {name: compare_preferences(per_pref[name], per_pref["base"], seed=cfg.prefs.seed)["vs_base"]
                        for name in aligned_dirs},
        }
        console.print(metrics_table(f"Table 1: {len(test_queries)} preference test questions", table1,
                                    ["P@1", "R@3", "MRR@5"]))

        t = time.perf_counter()
        table2, table3, rag_info = self._rag_tables(cfg, out_dir, ds, {"retriever": RetrievalOrder(), **rankers},
                                                    {"retriever": f"retriever-{cfg.prefs.retriever}", **rank_keys},
                                                    excluded, console)
        timings["rag"] = time.perf_counter() - t
        result = {
            "table1": table1,
            "table1_stats": table1_stats,
            "table2": table2,
            "table2_stats": rag_info.pop("stats"),
            "table3": table3,
            "preference_set": prefs_stats,
            "table1_queries": len(test_queries),
            "rag": rag_info,
            "targets": {
                "aligned_minus_base_P@1": table1["aligned"]["P@1"] - table1["base"]["P@1"],
                "aligned_minus_base_nq_top1": table2["aligned"]["nq_top1"] - table2["base"]["nq_top1"],
                "aligned_minus_base_nq_top3": table2["aligned"]["nq_top3"] - table2["base"]["nq_top3"],
            },
            "seed_spread": seed_spread(table1, table2, list(aligned_dirs)),
            "excluded_base_trained": len(excluded),
            "models": {"base": str(base_dir), **{name: str(folder) for name, folder in aligned_dirs.items()}},
            "timings_seconds": timings,
            "seconds": time.perf_counter() - t0,
            "config": cfg.model_dump(),
        }
        (out_dir / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
        (out_dir / "tables.md").write_text(tables_markdown(result) + "\n")
        plot_tables(result, out_dir)
        return result

    @staticmethod
    def _train_aligned(cfg: RerankAlignConfig, model_dir: Path, base_dir: Path, records, seed: int,
                       console: Console) -> Path:
        """Fine-tune the base reranker on the preference groups (kept if already trained with this config)."""
        import shutil

        from ragsieve.atomic import atomic_directory
        from ragsieve.rerank.training.trainer import train_cross_encoder

        train_cfg = cfg.train.model_copy(update={"init": cfg.train.init or str(base_dir), "seed": seed})
        card = {"train": train_cfg.model_dump(), "records": len(records), "groups": sum(len(r.pos) for r in records)}
        card_path = model_dir / "ragsieve_aligned.json"
        if card_path.exists() and json.loads(card_path.read_text()) == card:
            return model_dir
        console.print(f"aligned reranker, seed {seed}: training on {len(records)} preference records → {model_dir}")
        # a killed training leaves no half-written folder: it appears when complete
        # with train.checkpoint_steps, a killed training resumes from its last save under work/
        checkpoints = model_dir.parent / "work" / f"{model_dir.name}-checkpoints"
        with atomic_directory(model_dir, overwrite=True) as tmp:
            # every seed distils from the same start model over mostly the same pairs: scored once
            train_cross_encoder(records, train_cfg, tmp, checkpoint_dir=checkpoints,
                                start_logits_cache=model_dir.parent / "work" / "start-logits.sqlite")
            shutil.rmtree(tmp / "checkpoints", ignore_errors=True)
            (tmp / "ragsieve_aligned.json").write_text(json.dumps(card, indent=2))
        shutil.rmtree(checkpoints, ignore_errors=True)  # the model is complete: its checkpoints are not needed
        from ragsieve.artifacts import record_training_outputs

        for line in record_training_outputs(model_dir.parent, sorted(model_dir.glob("*.safetensors"))):  # git-ignored
            console.print(f"[dim]{line}[/]")
        return model_dir

    def _rag_tables(self, cfg, out_dir: Path, nq, rankers: dict[str, BaseRanker], rank_keys: dict[str, str],
                    excluded: set[str], console: Console):
        """Table 2 (RAG accuracy per reranker) and Table 3 (CBDR + aligned reranker)."""
        from ragsieve.models import load_local_llm
        from ragsieve.probe.model import load_head
        from ragsieve.prompts import load_qa_prompts
        from ragsieve.prompts.builder import PromptBuilder

        rc = cfg.rag
        probe_config, _ = load_head(cfg.prefs.probe)
        llm = load_local_llm(probe_config.llm_spec)
        builder = PromptBuilder(llm, load_qa_prompts(probe_config.prompts), rc.max_prompt_tokens)
        sets, nq_questions = _rag_sets(cfg, nq, excluded)
        grader = None
        rows = list(rankers)
        if rc.grader:
            from ragsieve.registry import load_grader

            grader = load_grader(rc.grader)
            rows.append("aligned+grader")
        table2: dict[str, dict[str, float]] = {name: {} for name in rows}
        correct: dict[tuple[str, str, int], np.ndarray] = {}
        info = {}
        for set_name, (ds, questions, find_candidates) in sets.items():
            if not questions:
                continue
            cands = find_candidates(ds, questions, rc.candidates)
            by_id = {p.id: p for c in cands for p in c}
            reqs = _ranker_requests(rc, set_name, questions, cands, by_id, rows, rankers, rank_keys, grader,
                                    out_dir / "work" / "rankings", console)
            if rc.upper_bounds:
                shifts = read_test_shifts(out_dir / "prefs" / "shifts.jsonl") if set_name == "nq" else {}
                _add_upper_bounds(rc, reqs, questions, cands, by_id, shifts)
            gens = _answer_requests(rc, llm, builder, probe_config.llm_spec, reqs.requests, set_name,
                                    out_dir / f"generations_{set_name}.jsonl", console)
            by_slot: dict[tuple[str, int], list[int]] = {}
            for rname, k, i in reqs.slots:
                by_slot.setdefault((rname, k), []).append(gens[i].correct)
            for (rname, k), vals in by_slot.items():
                correct[(set_name, rname, k)] = np.asarray(vals)
                table2[rname][f"{set_name}_top{k}"] = float(np.mean(vals))
            if set_name == "nq":
                correct[("nq", "closed", 0)] = np.asarray([g.correct for g in gens[: len(questions)]])
            bounds = upper_bound_stats(reqs.bound_slots, gens, correct, set_name) if rc.upper_bounds else None
            info[set_name] = _set_info(rc, questions, cands, reqs, bounds)
        info["stats"] = table2_stats(correct, rows, rc.top_ks, [s for s in sets if s in info])
        table3 = _table3(cfg, llm, nq_questions, correct, info)
        console.print(metrics_table("Table 2: RAG accuracy (containment)", table2, list(next(iter(table2.values())))))
        return table2, table3, info


@dataclass
class _SetRequests:
    """One evaluation set's generation requests and what their answers count for."""

    requests: list  # LabelRequests; on NQ the closed-book ones first, one per question
    slots: list[tuple[str, int, int]] = field(default_factory=list)  # (row, k, index into requests)
    # (order, k, question index, index into requests) of the upper bounds' requests
    bound_slots: list[tuple[str, int, int, int]] = field(default_factory=list)
    gold_at_1: dict[str, float] = field(default_factory=dict)  # why a ranker helps or hurts: gold passage first?
    graded_out: dict[int, list[int]] = field(default_factory=dict)  # k → passages the grader dropped per question
    # k → per question with gold in the top k: did the grader drop it?
    gold_dropped: dict[int, list[bool]] = field(default_factory=dict)


def _rag_sets(cfg: RerankAlignConfig, nq, excluded: set[str]) -> tuple[dict, list]:
    """Table 2's sets, name → (dataset, questions, how candidates are found), and the NQ questions."""
    from ragsieve.benchmarks.relevance import CANDIDATES, default_sources, retrieved_candidates, split_questions
    from ragsieve.data import load_dataset

    hotpot = load_dataset("hotpotqa-distractor", data_dir=cfg.prefs.data_dir)
    # the held-out half of the distractor sample (the base reranker trained on the other half)
    hotpot_source = cfg.base.sources.get("hotpotqa-distractor") or default_sources()["hotpotqa-distractor"]
    _, hotpot_questions = split_questions(hotpot, hotpot_source, cfg.base.seed)
    nq_questions = _nq_questions(cfg, nq, excluded)
    sets = {  # (dataset, questions, how candidates are found)
        "nq": (nq, nq_questions, retrieved_candidates(cfg.prefs.retriever)),  # the preference set's retriever
        "hotpotqa": (hotpot, hotpot_questions[: cfg.rag.hotpotqa_questions], CANDIDATES["hotpotqa-distractor"]),
    }
    return sets, nq_questions


def _ranker_requests(rc: RAGEvalConfig, set_name: str, questions, cands, by_id: dict, rows: list[str],
                     rankers: dict[str, BaseRanker], rank_keys: dict[str, str], grader, rankings_dir: Path,
                     console: Console) -> _SetRequests:
    """A request per (row, question, k): the row's top k of the candidates; "aligned+grader" keeps those the
    grader calls relevant and answers closed-book when it drops them all. On NQ, closed-book requests first."""
    from ragsieve.probe.labels import LabelRequest

    closed = [LabelRequest(q.id, q.text, q.answers, "closed") for q in questions]
    reqs = _SetRequests(list(closed) if set_name == "nq" else [])
    for rname in rows:
        source = "aligned" if rname == "aligned+grader" else rname
        order = ranked_ids(rankers[source], rank_keys[source], set_name, questions, cands, rankings_dir, console)
        firsts = []
        for i, (q, ids) in enumerate(zip(questions, order)):
            ranked = [by_id[pid] for pid in ids]
            firsts.append(bool(ranked) and ranked[0].id in set(q.gold_passage_ids))
            if rname == "aligned+grader":  # one verdict per passage serves every top-k
                relevant = [r.relevant for r in grader.grade(q.text, ranked[: max(rc.top_ks)])]
            for k in rc.top_ks:
                reqs.slots.append((rname, k, len(reqs.requests)))
                top = ranked[:k]
                if rname == "aligned+grader":
                    kept = [p for p, ok in zip(top, relevant) if ok]
                    reqs.graded_out.setdefault(k, []).append(len(top) - len(kept))
                    gold = set(q.gold_passage_ids)
                    if gold & {p.id for p in top}:
                        reqs.gold_dropped.setdefault(k, []).append(not gold & {p.id for p in kept})
                    if not kept:  # the sieve answers closed-book when the grader drops every passage
                        reqs.requests.append(closed[i])
                        continue
                    top = kept
                reqs.requests.append(LabelRequest(q.id, q.text, q.answers, "rag", top))
        reqs.gold_at_1[rname] = float(np.mean(firsts))
    return reqs


def _add_upper_bounds(rc: RAGEvalConfig, reqs: _SetRequests, questions, cands, by_id: dict,
                      shifts: dict[str, dict[str, float]]) -> None:
    """The requests of the reference orders that bound a reranker (gold-first; shift-order where ``shifts``
    has the question), appended to ``reqs`` with their slots."""
    from ragsieve.probe.labels import LabelRequest

    retriever_order = [[p.id for p in c] for c in cands]  # the candidates come in the retriever's order
    for name, orders in upper_bound_orders(questions, retriever_order, shifts).items():
        for i, (q, ids) in enumerate(zip(questions, orders)):
            if ids is None:  # no shifts for this question
                continue
            for k in rc.top_ks:
                reqs.bound_slots.append((name, k, i, len(reqs.requests)))
                reqs.requests.append(LabelRequest(q.id, q.text, q.answers, "rag", [by_id[p] for p in ids[:k]]))


def _answer_requests(rc: RAGEvalConfig, llm, builder, llm_spec: str, requests: list, set_name: str, out_path: Path,
                     console: Console) -> list:
    """The LLM's labelled answers to the requests (``out_path``, resumable; duplicates answered once), first
    copying those ``reuse_from`` holds when they were made with the same LLM and token budgets."""
    from ragsieve.probe.labels import label_generations, reuse_generations
    from studies.probe_nq import answer_settings_differ

    for folder in rc.reuse_from:
        problem = answer_settings_differ(Path(folder), llm_spec, rc.max_new_tokens, rc.max_prompt_tokens)
        if problem:  # other settings give other answers: mixing them in would mix two runs
            console.print(f"[yellow]reuse_from: {problem}; not reused[/]")
            continue
        served = reuse_generations(requests, out_path, [Path(folder) / "generations.jsonl"])
        console.print(f"{set_name}: {served} answers available from {folder}")
    with progress_bar(console) as bar:
        task = bar.add_task(f"answer {set_name} ({len(requests)} requests, duplicates answered once)",
                            total=len(requests))
        return label_generations(llm, builder, requests, out_path,
                                 max_new_tokens=rc.max_new_tokens, batch_size=rc.batch_size,
                                 progress=lambda k: bar.advance(task, k))


def _set_info(rc: RAGEvalConfig, questions, cands, reqs: _SetRequests, bounds: dict | None) -> dict:
    """``rag.<set>`` of metrics.json: the questions, distinct generations, gold recall of the candidates and
    at rank 1, the upper bounds, and what the grader dropped per top k."""
    info = {
        "questions": len(questions),
        "question_ids": [q.id for q in questions],
        "unique_generations": len({r.key for r in reqs.requests}),
        "gold_in_candidates": float(np.mean([bool(set(q.gold_passage_ids) & {p.id for p in c})
                                             for q, c in zip(questions, cands)])),
        "gold_at_1": reqs.gold_at_1,
    }
    if bounds:
        info["upper_bounds"] = bounds
    if reqs.graded_out:
        gold_dropped = reqs.gold_dropped
        info["grader"] = {
            "spec": rc.grader,
            **{f"top{k}": {"graded_out_per_question": float(np.mean(v)),
                           "all_graded_out_rate": float(np.mean([d == k for d in v])),
                           # the reason a sieve cell falls below its ranker: gold passages dropped
                           "gold_in_top_k": len(gold_dropped.get(k, [])),
                           "gold_dropped_rate": float(np.mean(gold_dropped[k])) if gold_dropped.get(k) else None}
               for k, v in reqs.graded_out.items()}}
    return info


def _table3(cfg: RerankAlignConfig, llm, nq_questions, correct: dict, info: dict) -> list[dict]:
    """Table 3: Conf(Q) from the probe gates the aligned reranker's answers, on the β grid and at quantiles of
    Conf(Q); the NQ closed-book accuracy and Conf(Q)'s quantiles go to ``info["nq"]``."""
    from ragsieve.gate.cbdr import sweep_cbdr
    from ragsieve.prefs.build import state_cache_path
    from ragsieve.probe.cache import StateCache
    from ragsieve.probe.model import ConfidenceProbe

    probe = ConfidenceProbe.load(cfg.prefs.probe, llm, cache=StateCache(state_cache_path(cfg.prefs)))
    conf_q = probe.score_batch([q.text for q in nq_questions])
    closed = correct[("nq", "closed", 0)]
    aligned_correct = {k: correct[("nq", "aligned", k)] for k in cfg.rag.top_ks}
    table3 = sweep_cbdr(conf_q, closed, aligned_correct, cfg.betas)
    for q in cfg.beta_quantiles:
        for row in sweep_cbdr(conf_q, closed, aligned_correct, [float(np.quantile(conf_q, q))]):
            table3.append({**row, "beta_quantile": q})
    info["nq"]["closed_book_accuracy"] = float(closed.mean())
    info["nq"]["conf_q_quantiles"] = {str(p): float(np.quantile(conf_q, p)) for p in (0.1, 0.5, 0.9)}
    return table3


def _nq_questions(cfg: RerankAlignConfig, nq, excluded: set[str] = frozenset()) -> list:
    """Table 2's NQ questions: from ``rag.nq_question_split`` ("<split.json>:<key>") or the held-out split,
    minus ``excluded`` (the questions the start reranker trained on)."""
    from ragsieve.data import held_out_questions, read_split_file

    spec = cfg.rag.nq_question_split
    if not spec:
        held = held_out_questions(nq.questions, cfg.prefs.test_fraction, cfg.prefs.seed)
        return [q for q in held if q.id not in excluded][: cfg.rag.nq_questions]
    path, _, key = spec.rpartition(":")
    if not path:
        raise RagsieveError(f"rag.nq_question_split '{spec}': want '<split.json>:<key>'")
    ids = read_split_file(path, (key,))[key]
    by_id = {q.id: q for q in nq.questions}
    questions = [by_id[i] for i in ids if i in by_id and i not in excluded][: cfg.rag.nq_questions]
    if not questions:
        raise RagsieveError(f"rag.nq_question_split: none of the {len(ids)} '{key}' ids of {path} is in the dataset")
    return questions


def ranker_keys(cfg: RerankAlignConfig, base_dir: Path, aligned_dirs: dict[str, Path]) -> dict[str, str]:
    """Cache key per ranker: its name for the fixed baselines, its weights (and cosine mix) for cross-encoders."""
    from ragsieve.rerank.shipped import scoring_key, weights_key

    def key(folder: Path) -> str:
        return scoring_key(folder) if cfg.init else f"plain-{weights_key(folder)}"

    return {"bm25": "bm25", "bi-encoder": f"bi-encoder-{cfg.encoder.replace('/', '_')}", "base": key(base_dir),
            **{name: key(folder) for name, folder in aligned_dirs.items()}}


def cached_per_query(ranker: BaseRanker, key: str, queries, ks, cache_dir: Path) -> dict:
    """Per-question P@k / R@k / MRR@k on ``queries`` (:func:`per_query`), cached per ranker key and question set."""
    import hashlib

    from ragsieve.benchmarks.relevance import per_query
    from studies.common import write_json

    ids = hashlib.sha1("|".join(q.query_id for q in queries).encode()).hexdigest()[:10]
    path = cache_dir / f"{key}.{ids}.k{'-'.join(map(str, ks))}.json"
    if path.is_file():
        return json.loads(path.read_text())
    per = per_query(ranker, queries, ks=tuple(ks), measures=("P", "R", "MRR"))
    write_json(path, per)
    return per


def ranked_ids(ranker: BaseRanker, key: str, set_name: str, questions, candidates, cache_dir: Path,
               console: Console) -> list[list[str]]:
    """Each question's candidate ids in ``ranker``'s order, cached per ranker key (a rerun ranks nothing again)."""
    from studies.common import write_json

    path = cache_dir / f"{set_name}.{key}.json"
    done: dict[str, list[str]] = json.loads(path.read_text()) if path.is_file() else {}
    todo = [i for i, q in enumerate(questions)
            if sorted(done.get(q.id, [])) != sorted(p.id for p in candidates[i])]
    if todo:
        console.print(f"{set_name}: ranking {len(todo)} questions with {key}")
        for n, i in enumerate(todo, 1):
            done[questions[i].id] = [p.id for p in ranker.rank(questions[i].text, candidates[i]).passages()]
            if n % 50 == 0 or n == len(todo):  # a killed run keeps what it ranked
                write_json(path, done, indent=0)
    return [done[q.id] for q in questions]


def accuracy_cell(correct: np.ndarray) -> dict:
    """n, right, accuracy and Wilson 95 % interval of 0/1 outcomes: one table cell."""
    from ragsieve.eval.classification import accuracy_interval

    k, n = int(correct.sum()), int(correct.size)
    return {"n": n, "correct": k, "accuracy": float(correct.mean()), "ci95": [float(x) for x in accuracy_interval(k, n)]}


def table2_stats(correct: dict[tuple[str, str, int], np.ndarray], rows: list[str], ks: list[int],
                 sets: list[str]) -> dict:
    """Wilson 95 % intervals per cell; exact McNemar of every aligned row vs base, and of the sieve
    (aligned+grader) vs the best plain row (retriever order, BM25, cosine, base) per cell, vs the best
    plain row at any k (what a user would otherwise deploy) and vs aligned alone (the grader's effect)."""
    from ragsieve.eval.stats import mcnemar_exact

    cells: dict[str, dict] = {}
    paired: dict[str, dict] = {}
    plain = [r for r in ("retriever", "bm25", "bi-encoder", "base") if r in rows]
    for s in sets:
        for k in ks:
            cell = f"{s}_top{k}"
            for r in rows:
                v = correct[(s, r, k)]
                cells.setdefault(r, {})[cell] = accuracy_cell(v)
            for r in rows:
                if r.startswith("aligned") and r != "aligned+grader":
                    paired.setdefault(f"{r}_vs_base", {})[cell] = mcnemar_exact(correct[(s, r, k)],
                                                                                correct[(s, "base", k)]).to_dict()
            if "aligned+grader" in rows and plain:
                # the best plain row is chosen on these same questions, which favours it: a conservative test
                best = max(plain, key=lambda r: correct[(s, r, k)].mean())
                paired.setdefault("sieve_vs_best_plain", {})[cell] = {
                    "best_plain": best, **mcnemar_exact(correct[(s, "aligned+grader", k)], correct[(s, best, k)]).to_dict()}
                best_r, best_k = max(((r, j) for r in plain for j in ks), key=lambda rk: correct[(s, *rk)].mean())
                paired.setdefault("sieve_vs_best_plain_any_k", {})[cell] = {
                    "best_plain": f"{best_r} top{best_k}",
                    **mcnemar_exact(correct[(s, "aligned+grader", k)], correct[(s, best_r, best_k)]).to_dict()}
                paired.setdefault("sieve_vs_aligned", {})[cell] = mcnemar_exact(
                    correct[(s, "aligned+grader", k)], correct[(s, "aligned", k)]).to_dict()
    return {"cells": cells, "paired": paired}


def read_test_shifts(path: Path) -> dict[str, dict[str, float]]:
    """The preference test questions' Inc per candidate id (question id → {passage id: Inc})."""
    from ragsieve.data import read_jsonl

    if not path.is_file():
        return {}
    return {row["question_id"]: dict(zip(row["candidate_ids"], row["inc"]))
            for row in read_jsonl(path) if row.get("split") == "test"}


def upper_bound_orders(questions, retriever_order: list[list[str]], shifts: dict[str, dict[str, float]]
                       ) -> dict[str, list[list[str] | None]]:
    """Reference orders of each question's candidates: ``gold-first`` (gold passages first, each part in
    the retriever's order) and, where ``shifts`` holds the question, ``shift-order`` (highest Inc first;
    candidates without an Inc after them, in the retriever's order). None = not defined for that question.

    >>> from types import SimpleNamespace as Q
    >>> qs = [Q(id="a", gold_passage_ids=["p3"]), Q(id="b", gold_passage_ids=[])]
    >>> upper_bound_orders(qs, [["p1", "p2", "p3"], ["p4", "p5"]], {"a": {"p1": -0.1, "p2": 0.4, "p3": 0.2}})
    {'gold-first': [['p3', 'p1', 'p2'], ['p4', 'p5']], 'shift-order': [['p2', 'p3', 'p1'], None]}
    """
    gold_first, shift_order = [], []
    for q, ids in zip(questions, retriever_order):
        gold = set(q.gold_passage_ids)
        gold_first.append([p for p in ids if p in gold] + [p for p in ids if p not in gold])
        inc = shifts.get(q.id)
        if inc is None:
            shift_order.append(None)
        else:  # sorted() is stable: ties and unscored candidates keep the retriever's order
            shift_order.append(sorted(ids, key=lambda p: -inc[p] if p in inc else float("inf")))
    orders = {"gold-first": gold_first}
    if any(o is not None for o in shift_order):
        orders["shift-order"] = shift_order
    return orders


def upper_bound_stats(slots, gens, correct: dict, set_name: str) -> dict:
    """Per reference order and k: accuracy with its Wilson interval on the questions it is defined for,
    base and aligned on the same questions, and exact McNemar of the order vs base and of aligned vs base."""
    from ragsieve.eval.stats import mcnemar_exact

    out: dict[str, dict] = {}
    by: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
    for name, k, qi, ri in slots:
        idx, vals = by.setdefault((name, k), ([], []))
        idx.append(qi)
        vals.append(gens[ri].correct)
    for (name, k), (idx, vals) in by.items():
        v = np.asarray(vals)
        row = accuracy_cell(v)
        for other in ("base", "aligned"):
            if (set_name, other, k) in correct:
                row[other] = accuracy_cell(correct[(set_name, other, k)][idx])
        if (set_name, "base", k) in correct:
            base = correct[(set_name, "base", k)][idx]
            row["vs_base"] = mcnemar_exact(v, base).to_dict()
            if (set_name, "aligned", k) in correct:
                row["aligned_vs_base"] = mcnemar_exact(correct[(set_name, "aligned", k)][idx], base).to_dict()
        out.setdefault(name, {"questions": len(idx)})[f"top{k}"] = row
    return out


def aligned_row(index: int, seed: int) -> str:
    """Table row of the aligned reranker trained with the ``index``-th seed of ``seeds``."""
    return "aligned" if index == 0 else f"aligned-seed{seed}"


def aligned_folder(index: int, seed: int) -> str:
    return "model" if index == 0 else f"model-seed{seed}"


def seed_spread(table1: dict, table2: dict, rows: list[str]) -> dict:
    """Across the aligned trainings (one per seed): each metric's values, mean, min, max and − base."""
    out: dict[str, dict] = {}
    for name, table in (("table1", table1), ("table2", table2)):
        for metric in table["base"]:
            values = [table[r][metric] for r in rows]
            out[f"{name}:{metric}"] = {"values": values, "mean": float(np.mean(values)), "min": min(values),
                                      "max": max(values), "minus_base": [v - table["base"][metric] for v in values]}
    return out


def preference_ranking_queries(records, shifts_path: Path) -> list[RankingQuery]:
    """Table 1's ranking sets: each test question's pos ∪ neg in retrieval order, relevant = pos."""
    from ragsieve.data import read_jsonl

    order = {row["question_id"]: row["candidate_ids"] for row in read_jsonl(shifts_path, skip_bad=True)}
    queries = []
    for r in records:
        texts = dict(zip(r.pos_ids, r.pos)) | dict(zip(r.neg_ids, r.neg))
        rank = {pid: i for i, pid in enumerate(order.get(r.query_id, []))}
        ids = sorted(texts, key=lambda pid: rank.get(pid, len(rank)))
        queries.append(RankingQuery(r.query_id, r.query, tuple(Passage(pid, texts[pid]) for pid in ids),
                                    frozenset(r.pos_ids)))
    return queries


def compare_preferences(pref: dict, base: dict, n_boot: int = 2000, seed: int = 0) -> dict:
    """Means of a ranker's per-question preference metrics, and P@1 (exact McNemar) / P@3 (paired bootstrap) vs base."""
    from ragsieve.eval.stats import mcnemar_exact, paired_bootstrap

    qids = list(pref["P@1"])
    return {
        "n": len(qids),
        "means": preference_means(pref),
        "base_means": preference_means(base),
        "vs_base": {
            "P@1": {"test": "exact McNemar", **mcnemar_exact([pref["P@1"][q] for q in qids],
                                                             [base["P@1"][q] for q in qids]).to_dict()},
            "P@3": {"test": "paired bootstrap", **paired_bootstrap([pref["P@3"][q] for q in qids],
                                                                   [base["P@3"][q] for q in qids],
                                                                   n_boot=n_boot, seed=seed).to_dict()},
        },
    }


def preference_means(per: dict) -> dict[str, float]:
    """Mean of each per-question preference metric (``{"P@1": {qid: v}}`` → ``{"P@1": mean}``)."""
    return {metric: float(np.mean(list(values.values()))) for metric, values in per.items()}


def tables_markdown(result: dict) -> str:
    """Tables 1 and 2, the reference orders and the seed spread as Markdown (``tables.md``), every
    cell with its 95 % interval and every comparison with its paired test, for the README."""

    def pct(v: float) -> str:
        return f"{100 * v:.1f}"

    def acc(c: dict) -> str:
        return f"{pct(c['accuracy'])} [{pct(c['ci95'][0])}, {pct(c['ci95'][1])}]"

    def mcn(m: dict) -> str:
        return f"{100 * m['diff']:+.1f} pp (p = {m['p_value']:.3f}; {m['a_only']} vs {m['b_only']})"

    lines = [f"### Table 1: preference test ({result['table1_queries']} questions), mean [95 % CI]", ""]
    # the paper's columns and P@3 (the bootstrap's metric); metrics.json holds every k
    shown = ("P@1", "P@3", "R@3", "MRR@5")
    metrics = [m for m in shown if m in next(iter(result["table1"].values()))]
    stats = result["table1_stats"]
    lines += ["| reranker | " + " | ".join(metrics) + " | − base P@1 (McNemar) | − base P@3 [95 % CI] (bootstrap p) |",
              "|---" * (len(metrics) + 3) + "|"]
    for name, row in result["table1"].items():
        cells = [f"{row[m]:.3f} [{stats['ci95'][name][m][0]:.3f}, {stats['ci95'][name][m][1]:.3f}]" for m in metrics]
        vs = stats["vs_base"].get(name)
        extra = ["", ""]
        if vs:
            p3 = vs["P@3"]
            extra = [f"{vs['P@1']['diff']:+.3f} (p = {vs['P@1']['p_value']:.3f})",
                     f"{p3['diff']:+.3f} [{p3['low']:+.3f}, {p3['high']:+.3f}] (p = {p3['p_value']:.3f})"]
        lines.append(f"| {name} | " + " | ".join(cells + extra) + " |")
    t2 = result["table2_stats"]
    cells = list(next(iter(t2["cells"].values())))
    n = {c: next(iter(t2["cells"].values()))[c]["n"] for c in cells}
    lines += ["", "### Table 2: RAG accuracy (containment, %) [Wilson 95 % CI]", "",
              "| row | " + " | ".join(f"{c} (n = {n[c]})" for c in cells) + " |", "|---" * (len(cells) + 1) + "|"]
    for name, row in t2["cells"].items():
        lines.append(f"| {name} | " + " | ".join(acc(row[c]) for c in cells) + " |")
    lines += ["", "Paired, exact McNemar (A − B; questions only A / only B got right):", "",
              "| comparison | " + " | ".join(cells) + " |", "|---" * (len(cells) + 1) + "|"]
    for name, by_cell in t2["paired"].items():
        label = name.replace("_vs_", " vs ").replace("_", " ")
        out = []
        for c in cells:
            m = by_cell.get(c)
            out.append("" if m is None else mcn(m) + (f" vs {m['best_plain']}" if "best_plain" in m else ""))
        lines.append(f"| {label} | " + " | ".join(out) + " |")
    for set_name, info in result["rag"].items():
        bounds = info.get("upper_bounds") if isinstance(info, dict) else None
        if not bounds:
            continue
        lines += ["", f"### Reference orders, {set_name}: what reranking these candidates can reach", "",
                  "| order (questions) | k | order | base | aligned | order − base (McNemar) "
                  "| aligned − base (McNemar) |", "|---|---|---|---|---|---|---|"]
        for order, by_k in bounds.items():
            for k, row in by_k.items():
                if k == "questions":
                    continue
                lines.append(f"| {order} ({by_k['questions']}) | {k} | {acc(row)} | "
                             f"{acc(row['base']) if 'base' in row else ''} | "
                             f"{acc(row['aligned']) if 'aligned' in row else ''} | "
                             f"{mcn(row['vs_base']) if 'vs_base' in row else ''} | "
                             f"{mcn(row['aligned_vs_base']) if 'aligned_vs_base' in row else ''} |")
    graders = {s: i["grader"] for s, i in result["rag"].items() if isinstance(i, dict) and "grader" in i}
    if graders:
        lines += ["", "### The sieve's grader: what it drops from the aligned reranker's top k", "",
                  "| set | k | passages dropped per question | all dropped (answered closed-book) "
                  "| gold passage dropped (questions with gold in the top k) |", "|---|---|---|---|---|"]
        for set_name, g in graders.items():
            for key, row in g.items():
                if not key.startswith("top"):
                    continue
                rate = row.get("gold_dropped_rate")
                gold = "" if rate is None else f"{pct(rate)} % ({row['gold_in_top_k']})"
                lines.append(f"| {set_name} | {key[3:]} | {row['graded_out_per_question']:.2f} | "
                             f"{pct(row['all_graded_out_rate'])} % | {gold} |")
    spread = result.get("seed_spread", {})
    if spread:
        lines += ["", "### Seed spread of the aligned reranker (one training per seed)", "",
                  "| metric | values | mean | − base |", "|---|---|---|---|"]
        for metric, v in spread.items():
            if metric.startswith("table1:") and metric.split(":", 1)[1] not in shown:
                continue
            lines.append(f"| {metric} | " + ", ".join(f"{x:.3f}" for x in v["values"]) + f" | {v['mean']:.3f} | "
                         + ", ".join(f"{x:+.3f}" for x in v["minus_base"]) + " |")
    gold = {s: i["gold_at_1"] for s, i in result["rag"].items() if isinstance(i, dict) and "gold_at_1" in i}
    if gold:
        sets = list(gold)
        lines += ["", "### Gold passage ranked first (share of questions)", "",
                  "| row | " + " | ".join(sets) + " |", "|---" * (len(sets) + 1) + "|"]
        for name in gold[sets[0]]:
            lines.append(f"| {name} | " + " | ".join(f"{gold[s].get(name, float('nan')):.3f}" for s in sets) + " |")
    return "\n".join(lines)


def plot_tables(result: dict, out_dir: Path) -> None:
    """``rag_accuracy.png`` (Table 2 as grouped bars) and ``cbdr_aligned.png`` (Table 3)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    table2 = result["table2"]
    columns = list(next(iter(table2.values())))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(table2)
    for i, (name, row) in enumerate(table2.items()):
        ax.bar(np.arange(len(columns)) + i * width, [row[c] for c in columns], width, label=name)
    ax.set_xticks(np.arange(len(columns)) + 0.4 - width / 2, columns)
    ax.set_ylabel("containment accuracy")
    ax.set_title("RAG accuracy by reranker (SmolLM2-135M)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "rag_accuracy.png", dpi=120)
    plt.close(fig)
    plot_sweep(result["table3"], out_dir / "cbdr_aligned.png", result["rag"]["nq"]["closed_book_accuracy"])
