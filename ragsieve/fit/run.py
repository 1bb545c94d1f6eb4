"""``ragsieve fit``: the knowledge-boundary method end to end for one LLM, on your corpus and questions.

Phases (each writes its result under ``<out>/work`` or ``<out>`` and is skipped when
rerun, so a fit killed at any point resumes where it stopped):

1. **split** the QA file into train / dev / test by id;
2. **retrieve** the top ``candidates`` passages per question;
3. **label** closed-book and top-k answers (greedy, answer containment), every generation kept;
4. **probe**: hidden states at each candidate layer, an MLP per layer, the best on dev kept;
5. **gate**: β for the policy, chosen on dev (``parity`` must be shown at ``parity_confidence``:
   the upper bound of the accuracy lost by skipping stays within the tolerance);
6. **prefs**: Inc = Conf(Q+C) − Conf(Q) over the candidates; top-5 / bottom-5 per train question.
   An endpoint LLM (``openai:URL#model``, no local copy) has no hidden states: the probe and the
   gate are skipped, and a passage is preferred when the LLM answers right with it alone and
   wrong closed-book (negatives: the passages it answers wrong with);
7. **rerank**: the reranker fine-tuned on those preferences (InfoNCE) from the shipped base, kept
   only if it ranks the dev candidates that contain an answer no worse (MRR@10, paired bootstrap)
   than the reranker it started from (else the sieve keeps that one, and says so);
8. **grade**: the reranker's score threshold calibrated on dev (a passage that contains a gold
   answer counts as relevant);
9. **select** the configuration by the LLM's answers on dev (:mod:`ragsieve.fit.select`): k ∈ {0 (closed
   book), 1, 2, 3, 5} × order (retriever / the start reranker / the aligned one if kept) × grade (off /
   thresholds) × passage placement × gate β; most accurate wins, ties go to fewer prompt tokens
   (``select.objective: tokens=<budget>`` trades accuracy for context). Do no harm: on test the
   choice is compared with closed book and with the best plain configuration (chosen on dev), by
   exact McNemar and a paired-bootstrap interval; if it is measurably worse, the plain one ships;
10. **evaluate**: ``sieve.json`` with the whole grid, the frontier (accuracy against prompt tokens and
   LLM seconds; also plotted to ``frontier.png``), the choice, the test comparison with Wilson
   intervals, and the probe's AUROC with a bootstrap interval.

Example::

    from ragsieve.fit import FitConfig, fit_sieve
    fit_sieve(FitConfig(index="index/mine", questions="qa.jsonl", out="sieves/mine"))
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from ragsieve.atomic import write_json_atomic
from ragsieve.data.records import Passage, Question
from ragsieve.errors import RagsieveError
from ragsieve.fit.config import FitConfig, gate_budget
from ragsieve.pipeline.sieve_config import SieveConfig

if TYPE_CHECKING:
    from ragsieve.fit.select import Choice
    from ragsieve.models.llm import LocalLLM
    from ragsieve.probe.model import ConfidenceProbe
    from ragsieve.prompts.builder import PromptBuilder
    from ragsieve.retrieve.base import Retriever

log = logging.getLogger(__name__)

#: phase name → what it does, in order (progress reports use these names)
PHASES = ("split", "retrieve", "label", "probe", "gate", "prefs", "rerank", "grade", "select", "evaluate")
Progress = Callable[[str, int, int], None]  # (phase, done, total)


def _write_json(path: Path, data: Any) -> None:
    write_json_atomic(path, data)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


class Fit:
    """One fit run: the loaded parts and each phase as a method (resumable from ``config.work``)."""

    def __init__(self, config: FitConfig, progress: Optional[Progress] = None):
        from ragsieve.models.specs import ModelSpec

        # an endpoint only: answers, no hidden states (no probe, no gate, preferences from answers)
        self.endpoint_only = ModelSpec.parse(config.llm).scheme == "openai"
        self.config = config
        self.progress = progress or (lambda phase, done, total: None)
        self.out = Path(config.out)
        self.work = config.work
        self.timings: dict[str, float] = {}
        self._bearing: dict[str, set[int]] = {}  # question id → answer-bearing candidate indices
        self._rankers: dict[str, Any] = {}  # reranker spec → loaded reranker
        self._rankings: dict[str, dict[str, list[tuple[int, float]]]] = {}  # spec → question id → ranking
        self._score_stores: dict[str, Any] = {}  # spec → PairScores of its candidate scores, or None

    # -- shared parts, loaded once ---------------------------------------------------------------
    def load(self) -> None:
        from ragsieve.data.qa_files import read_qa_file
        from ragsieve.models import load_llm, load_local_llm
        from ragsieve.prompts.builder import PromptBuilder
        from ragsieve.retrieve import load_index

        self.questions = read_qa_file(self.config.questions)
        if self.config.max_questions:
            self.questions = self.questions[: self.config.max_questions]
        self.retriever: "Retriever" = load_index(self.config.index)
        if self.endpoint_only:
            self.llm = self.generator = load_llm(self.config.llm)
            ignored = [name for name in ("generator", "ray") if getattr(self.config, name)]
            if ignored:
                log.warning("fit: %s ignored: the LLM is an endpoint, which answers every prompt",
                            " and ".join(ignored))
        else:
            self.llm: "LocalLLM" = load_local_llm(self.config.llm)
            self.generator = load_llm(self.config.generator) if self.config.generator else self.llm
        self.builder: "PromptBuilder" = PromptBuilder(self.llm, None, self.config.max_prompt_tokens)
        self.work.mkdir(parents=True, exist_ok=True)
        from ragsieve.fit.select import AnswerCache

        # every answer the selection (and answer preferences) asks for, once per unique prompt
        self.records = Path(self.config.records) if self.config.records else None
        if self.records is not None:
            self.records.mkdir(parents=True, exist_ok=True)
        self.answers = AnswerCache(self.work / "answers.sqlite", self.generator, self.builder,
                                   max_new_tokens=self.config.max_new_tokens, batch_size=self.config.batch_size,
                                   records=self.records / "answers.jsonl" if self.records else None)
        if not self.endpoint_only:
            from ragsieve.probe.cache import StateCache

            # the local LLM's hidden states by prompt and layer: labels write them, the probe reads them
            self.state_cache = StateCache(self.work / "states.sqlite")

    def run(self) -> SieveConfig:
        self.load()
        for phase in PHASES:
            start = time.perf_counter()
            getattr(self, f"phase_{phase}")()
            self.timings[phase] = round(time.perf_counter() - start, 2)
            log.info("fit: %s done in %.1fs", phase, self.timings[phase])
        return self.sieve

    # -- 1. split ----------------------------------------------------------------------------------
    def phase_split(self) -> None:
        splits = self.splits = fit_splits(self.config, self.questions)
        _write_json(self.work / "split.json", {k: [q.id for q in v] for k, v in splits.items()})
        self.progress("split", 1, 1)

    # -- 2. retrieve ------------------------------------------------------------------------------
    def phase_retrieve(self) -> None:
        hits = self.retriever.search_batch([q.text for q in self.questions], k=self.config.candidates)
        self.candidates: dict[str, list[Passage]] = {q.id: [h.passage for h in row] for q, row in zip(self.questions, hits)}
        self.progress("retrieve", 1, 1)

    # -- 3. label ---------------------------------------------------------------------------------
    def _label(self, requests, path: Path, phase: str):
        from ragsieve.probe.labels import label_generations

        done = {"n": 0}

        def advance(n: int) -> None:
            done["n"] += n
            self.progress(phase, done["n"], len(requests))

        if self.config.ray and not self.config.generator and not self.endpoint_only:
            self._ray_label(requests, path)
        from ragsieve.fit.select import CachedGenerator

        # through the answer cache: the selection reuses these answers (closed book, the retriever's top k)
        return label_generations(
            CachedGenerator(self.answers), self.builder, requests, path, max_new_tokens=self.config.max_new_tokens,
            batch_size=self.config.batch_size, progress=advance,
        )

    def _ray_label(self, requests, path: Path) -> None:
        """The requests not yet in ``path`` answered on Ray and appended (label_generations then reads them)."""
        from dataclasses import asdict

        from ragsieve.data.jsonl import append_jsonl
        from ragsieve.fit.scale import ray_answer_requests
        from ragsieve.probe.labels import read_generations

        done = read_generations(path)
        todo = list({r.key: r for r in requests if r.key not in done}.values())
        start = time.perf_counter()
        generations = ray_answer_requests(self.config.ray, todo, llm=self.config.llm,
                                          max_prompt_tokens=self.config.max_prompt_tokens,
                                          max_new_tokens=self.config.max_new_tokens, batch_size=self.config.batch_size)
        for g in generations:
            append_jsonl(path, asdict(g))
        if generations:  # into the answer cache too, as the local path does: the selection reuses them
            messages = [self.builder.with_context(r.question, r.contexts).text for r in todo]
            self.answers.put(messages, [g.generation for g in generations],
                             (time.perf_counter() - start) / len(generations))

    def phase_label(self) -> None:
        from ragsieve.probe.labels import LabelRequest

        k = self.config.top_k
        requests = []
        for q in self.questions:
            requests.append(LabelRequest(q.id, q.text, q.answers, "closed"))
            requests.append(LabelRequest(q.id, q.text, q.answers, f"top{k}", self.candidates[q.id][:k]))
        if not self.endpoint_only and self.generator is self.llm:
            # the probe's states of these very prompts come from the labels' own prefill
            self.answers.capture_states = (self.state_cache, self._probe_layers())
        try:
            gens = self._label(requests, self.work / "generations.jsonl", "label")
        finally:
            self.answers.capture_states = None
        self.closed = {g.question_id: g.correct for g in gens if g.variant == "closed"}
        self.plain = {g.question_id: g.correct for g in gens if g.variant == f"top{k}"}

    # -- 4. probe ---------------------------------------------------------------------------------
    def _probe_layers(self) -> list[int]:
        """The candidate layers (1-based) the probe is trained on, ``config.layers`` resolved for this LLM."""
        from ragsieve.probe.hidden import resolve_layer

        return sorted({resolve_layer(x, self.llm.num_layers) for x in self.config.layers})

    def _probe_data(self, layers: list[int], split: str) -> tuple[dict[int, np.ndarray], np.ndarray]:
        """States of every candidate layer (one early-exit forward per prompt) and correctness labels:
        the closed-book prompts, then the top-k prompts of the split's questions."""
        from ragsieve.probe.hidden import HiddenStateExtractor, extract_layers

        qs = self.splits[split]
        k = self.config.top_k
        prompts = [self.builder.chat_prompt(q.text) for q in qs]
        prompts += [self.builder.chat_prompt(q.text, self.candidates[q.id][:k]) for q in qs]
        extractor = HiddenStateExtractor(self.llm, layers[0], batch_size=self.config.batch_size,
                                         cache=self.state_cache)
        y = np.array([self.closed[q.id] for q in qs] + [self.plain[q.id] for q in qs], dtype=np.int64)
        from ragsieve.progress import reporting

        # one forward per prompt, minutes of them: the fit's progress shows them as the probe phase's
        with reporting(lambda _task, done, total: self.progress("probe", done, total)):
            return extract_layers(extractor, prompts, layers), y

    def phase_probe(self) -> None:
        from sklearn.metrics import roc_auc_score

        from ragsieve.probe.model import ConfidenceProbe, ProbeConfig
        from ragsieve.probe.train import train_probe_head

        probe_dir = self.out / "probe"
        self.probe: Optional["ConfidenceProbe"] = None
        if self.endpoint_only:
            log.warning("fit: %s is an endpoint (no hidden states): probe and gate skipped, the sieve always "
                        "retrieves and its reranker learns from answers", self.config.llm)
            return
        if not (probe_dir / "probe_config.json").is_file():
            layers = self._probe_layers()
            by_layer: dict[int, float] = {}
            heads = {}
            train_states, y_tr = self._probe_data(layers, "train")
            dev_states, y_dev = self._probe_data(layers, "dev")
            for i, layer in enumerate(layers):
                x_tr, x_dev = train_states[layer], dev_states[layer]
                if len(set(y_tr.tolist())) < 2 or len(set(y_dev.tolist())) < 2:
                    raise RagsieveError(
                        "the LLM answered every train or dev prompt the same way (all right or all wrong), so a "
                        "probe cannot learn its knowledge boundary; give more (or more varied) questions"
                    )
                result = train_probe_head(x_tr, y_tr, x_dev, y_dev, self.config.probe)
                heads[layer] = result.head
                by_layer[layer] = float(roc_auc_score(y_dev, result.head.predict_proba(x_dev)))
                self.progress("probe", i + 1, len(layers))
            best = max(by_layer, key=lambda layer: (by_layer[layer], -abs(layer - self.llm.num_layers / 2)))
            config = ProbeConfig(
                llm_spec=self.llm.spec, layer=best, num_layers=self.llm.num_layers, hidden_size=self.llm.hidden_size,
                probe_hidden=self.config.probe.hidden, dropout=self.config.probe.dropout,
                max_prompt_tokens=self.config.max_prompt_tokens, metrics={"dev_auroc_by_layer": by_layer},
            )
            ConfidenceProbe(self.llm, heads[best], config).save(probe_dir)
        self.probe = ConfidenceProbe.load(
            probe_dir, self.llm, batch_size=self.config.batch_size, cache=self.state_cache
        )

    # -- 5. gate ----------------------------------------------------------------------------------
    def _conf_q(self, questions: list[Question]) -> np.ndarray:
        return self.probe.score_batch([q.text for q in questions])

    def phase_gate(self) -> None:
        from ragsieve.gate.cbdr import skip_at_parity

        dev = self.splits["dev"]
        self.gate_dev: Optional[dict] = None
        if self.probe is None:  # an endpoint: no Conf(Q)
            self.beta = None
            return
        conf = self._conf_q(dev)
        closed = np.array([self.closed[q.id] for q in dev])
        plain = np.array([self.plain[q.id] for q in dev])
        budget = gate_budget(self.config.gate)
        if self.config.gate == "none":
            self.beta = None
        elif budget is not None:
            # retrieve when Conf(Q) <= β: β at the budget's quantile retrieves for that share
            self.beta = 1.0 if budget >= 1.0 else float(np.quantile(conf, budget))
        else:
            best = skip_at_parity(conf, closed, plain, tolerance=self.config.parity_tolerance,
                                  confidence_level=self.config.parity_confidence)
            self.beta = float(best["beta"])
            self.gate_dev = {**best, "n": len(dev), "tolerance": self.config.parity_tolerance,
                             "confidence_level": self.config.parity_confidence}
        self.progress("gate", 1, 1)

    # -- 6. prefs ---------------------------------------------------------------------------------
    def phase_prefs(self) -> None:
        from ragsieve.data.jsonl import append_jsonl, read_jsonl
        from ragsieve.prefs.preferences import select_preferences

        if self.probe is None:
            self._answer_preferences()
            return
        path = self.work / "shifts.jsonl"
        done = {row["question_id"]: row for row in read_jsonl(path, skip_bad=True)} if path.exists() else {}
        record = self.records / "shifts.jsonl" if self.records else None
        if record is not None and record.is_file():  # shifts measured on another machine (ids and scores only)
            for row in read_jsonl(record, skip_bad=True):
                cands = self.candidates.get(row["question_id"])
                # a record of other candidates (another index or candidate count) is measured again
                if row["question_id"] not in done and cands and row["candidate_ids"] == [p.id for p in cands]:
                    append_jsonl(path, row)
                    done[row["question_id"]] = row
        questions = self.splits["train"]  # only train groups are trained on: dev is read by relevance, not shifts
        todo = [q for q in questions if q.id not in done]
        self.progress("prefs", len(questions) - len(todo), len(questions))
        for q, scores in self._confidence_scores(todo):
            scores = np.asarray(scores, dtype=np.float64)
            row = {"question_id": q.id, "conf_q": float(scores[0]), "inc": (scores[1:] - scores[0]).tolist(),
                   "candidate_ids": [p.id for p in self.candidates[q.id]]}
            append_jsonl(path, row)  # a kill loses at most the questions not yet written
            if record is not None:
                append_jsonl(record, row)
            done[q.id] = row
            self.progress("prefs", sum(q.id in done for q in questions), len(questions))
        records = []
        for q in questions:
            rec = select_preferences(q.text, self.candidates[q.id], done[q.id]["inc"],
                                     n_pos=self.config.align.n_pos, n_neg=self.config.align.n_neg, question_id=q.id,
                                     signed=self.config.align.selection == "signed")
            if rec is not None:
                records.append(rec)
        self.prefs = {"train": records}

    def _answer_preferences(self) -> None:
        """Preference groups from answers (no probe): each candidate alone in the prompt; positives are
        the passages the LLM answers right with, for a question it answers wrong closed-book; negatives
        the ones it answers wrong with (retrieval order first: the hardest)."""
        from ragsieve.eval.qa import contains_answer
        from ragsieve.prefs.preferences import PreferenceRecord
        from ragsieve.prompts import first_line

        limit = self.config.align.answer_candidates or self.config.candidates
        questions = self.splits["train"]  # dev's relevance check reads gold passages, not these answers
        texts = [self.builder.with_context(q.text, [p]).text for q in questions for p in self.candidates[q.id][:limit]]
        answers = iter(self.answers.answers(texts, lambda done, total: self.progress("prefs", done, total)))
        n_pos, n_neg = self.config.align.n_pos, self.config.align.n_neg
        self.prefs = {"train": []}
        for q in questions:
            cands = self.candidates[q.id][:limit]
            right = [contains_answer(first_line(next(answers)[0]), q.answers) for _ in cands]
            if self.closed[q.id]:
                continue  # right without any passage: no passage is shown to help
            pos = [p for p, ok in zip(cands, right) if ok][:n_pos]
            neg = [p for p, ok in zip(cands, right) if not ok][:n_neg]
            if pos and neg:
                self.prefs["train"].append(PreferenceRecord(
                    q.text, [p.full_text for p in pos], [p.full_text for p in neg], [1.0] * len(pos),
                    [0.0] * len(neg), q.id, [p.id for p in pos], [p.id for p in neg]))

    def _confidence_scores(self, questions: list[Question]):
        """(question, [Conf(Q), Conf(Q+C_1), ...]) for each: on Ray when configured, else one question at a time."""
        if self.config.ray:
            from ragsieve.fit.scale import ray_confidence_shifts

            scored = ray_confidence_shifts(
                self.config.ray, [{"question_id": q.id, "question": q.text, "passages": self.candidates[q.id]}
                                  for q in questions],
                llm=self.config.llm, probe=str(self.out / "probe"), batch_size=self.config.batch_size)
            yield from ((q, scored[q.id]) for q in questions)
            return
        for q in questions:
            cands = self.candidates[q.id]
            yield q, self.probe.score_batch([q.text] * (len(cands) + 1), [None, *cands])

    def _answer_bearing(self, q: Question) -> set[int]:
        """Indices of ``q``'s candidates that contain a gold answer (computed once per question)."""
        from ragsieve.eval.qa import contains_answer

        if q.id not in self._bearing:
            self._bearing[q.id] = {i for i, p in enumerate(self.candidates[q.id])
                                   if contains_answer(p.full_text, q.answers)}
        return self._bearing[q.id]

    # -- 7. rerank --------------------------------------------------------------------------------
    def phase_rerank(self) -> None:
        from ragsieve.registry import reranker_folder
        from ragsieve.rerank.training.trainer import train_cross_encoder

        target = self.out / "reranker"
        check_file = self.work / "align_check.json"
        self.reranker_spec = "reranker"
        self.align_check: Optional[dict] = None
        key = self._forget_stale_alignment(target, check_file)
        record = self.records / "align_check.json" if self.records else None
        if not check_file.is_file() and record is not None and record.is_file():
            recorded = _read_json(record)
            # rejected on another machine for these preferences and settings: that decision needs no weights
            if recorded.pop("align_key", None) == key and not recorded["kept"]:
                _write_json(check_file, recorded)
        if check_file.is_file():  # trained and checked before: the decision stands
            self.align_check = _read_json(check_file)
            if not self.align_check["kept"]:
                self.reranker_spec = self.config.align.init
            self.progress("rerank", 1, 1)  # a resumed run's log still shows the phase
            return
        if not (target / "config.json").is_file():
            if len(self.prefs["train"]) < 2:
                log.warning("fit: %d preference group(s): too few to align, the sieve keeps %s",
                            len(self.prefs["train"]), self.config.align.init)
                self.reranker_spec = self.config.align.init
                return
            a = self.config.align
            t = a.train
            init = reranker_folder(a.init, "align.init")
            # the forgetting guards (issue #18): gold groups are the candidates that contain an answer
            replay = self._gold_groups("train") if t.replay_ratio > 0 else None
            # early stopping reads dev, which the relevance check below reads too: it favours passing it
            dev = self._gold_groups("dev") if t.eval_steps > 0 else None
            replay_ratio = t.replay_ratio if replay else 0.0
            eval_steps = t.eval_steps if dev else 0
            if t.replay_ratio > 0 and not replay:
                log.warning("fit: no train question has an answer-bearing and another candidate: no replay")
            if t.eval_steps > 0 and not dev:
                log.warning("fit: no dev question has an answer-bearing and another candidate: no early stopping")
            config = a.train.model_copy(update={"init": init, "group_size": 1 + a.n_neg, "seed": self.config.seed,
                                                "replay_ratio": replay_ratio, "eval_steps": eval_steps})
            import shutil

            from ragsieve.atomic import atomic_directory

            with atomic_directory(target) as tmp:  # a killed training leaves nothing half-written behind
                train_cross_encoder(self.prefs["train"], config, tmp, replay=replay, relevance_dev=dev)
                shutil.rmtree(tmp / "checkpoints", ignore_errors=True)
        if self.config.align.guard:
            self.align_check = self._relevance_check(target)
            if not self.align_check["kept"]:
                import shutil

                log.warning("fit: the aligned reranker ranks answer-bearing dev passages %.3f MRR@10 below %s; "
                            "the sieve keeps %s", -self.align_check["diff"], self.config.align.init,
                            self.config.align.init)
                shutil.rmtree(self.work / "reranker-rejected", ignore_errors=True)
                shutil.move(str(target), str(self.work / "reranker-rejected"))  # kept for inspection, not shipped
                self.reranker_spec = self.config.align.init
            _write_json(check_file, self.align_check)
            if record is not None:
                _write_json(record, {**self.align_check, "align_key": key})
        self.progress("rerank", 1, 1)

    def _gold_groups(self, split: str) -> list:
        """Relevance groups of ``split``: a question's answer-bearing candidates vs its other candidates."""
        from ragsieve.prefs.preferences import PreferenceRecord

        groups = []
        for q in self.splits[split]:
            cands, bearing = self.candidates[q.id], self._answer_bearing(q)
            pos = [p for i, p in enumerate(cands) if i in bearing]
            neg = [p for i, p in enumerate(cands) if i not in bearing]
            if pos and neg:
                groups.append(PreferenceRecord(q.text, [p.full_text for p in pos], [p.full_text for p in neg],
                                               [1.0] * len(pos), [0.0] * len(neg), q.id,
                                               [p.id for p in pos], [p.id for p in neg]))
        return groups

    def _forget_stale_alignment(self, target: Path, check_file: Path) -> str:
        """A reranker trained on other preferences or settings is not resumed: it is trained again.
        Returns the key of the current preferences and settings."""
        import shutil

        records = [[r.query_id, r.pos_ids, r.neg_ids] for r in self.prefs["train"]]
        key = hashlib.sha1(json.dumps([records, self.config.align.model_dump()], sort_keys=True).encode()).hexdigest()
        stamp = self.work / "align_key.txt"
        if stamp.is_file() and stamp.read_text().strip() == key:
            return key
        if target.exists() or check_file.exists():
            log.info("fit: preferences or align settings changed; training the reranker again")
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(self.work / "reranker-rejected", ignore_errors=True)
        check_file.unlink(missing_ok=True)
        stamp.write_text(key + "\n")
        return key

    def _relevance_check(self, aligned: Path) -> dict:
        """MRR@10 of the dev candidates that contain a gold answer: aligned vs the reranker it started
        from, per question, with a paired bootstrap; ``kept`` says whether alignment may stay."""
        from ragsieve.eval.stats import paired_bootstrap

        qs = [q for q in self.splits["dev"] if self._answer_bearing(q)]
        if len(qs) < 5:
            return {"kept": True, "n": len(qs), "why": "fewer than 5 dev questions with an answer-bearing candidate"}

        def reciprocal_ranks(spec: str) -> list[float]:
            out = []
            for q in qs:
                order = [idx for idx, _ in self._ranked(spec, q)][:10]
                first = next((rank for rank, idx in enumerate(order) if idx in self._answer_bearing(q)), None)
                out.append(0.0 if first is None else 1.0 / (first + 1))
            return out

        self._rank_all(["reranker", self.config.align.init], qs, "rerank")
        aligned_rr = reciprocal_ranks("reranker")  # the folder ``aligned``, before the verdict moves it
        base_rr = reciprocal_ranks(self.config.align.init)
        result = paired_bootstrap(aligned_rr, base_rr).to_dict()
        worse = result["diff"] < -self.config.align.max_mrr_drop or result["high"] < 0
        return {**result, "metric": "MRR@10 of answer-bearing dev candidates", "aligned_mrr": result["a"],
                "start_mrr": result["b"], "start": self.config.align.init, "kept": not worse,
                "max_mrr_drop": self.config.align.max_mrr_drop}

    def _rank_all(self, specs: Sequence[str], questions: Sequence[Question], phase: str) -> None:
        """Rank every question's candidates with each of ``specs`` (memoized by :meth:`_ranked`), reporting
        progress under ``phase``: minutes of cross-encoder passes a log under nohup would otherwise not show."""
        todo = [(spec, q) for spec in specs for q in questions
                if q.id not in self._rankings.get(spec, {})]
        if todo:  # the first report is read as what a resumed phase found done: "N to do" first
            self.progress(phase, 0, len(todo))
        for n, (spec, q) in enumerate(todo, 1):
            self._ranked(spec, q)
            self.progress(phase, n, len(todo))

    def _ranked(self, spec: str, q: Question) -> list[tuple[int, float]]:
        """``q``'s candidates as (index, score) in the order of reranker ``spec`` (``reranker``: the sieve's
        aligned folder), scored once per fit run: the relevance check, the grade threshold and the selection
        all read the same rankings (a cross-encoder pass over every candidate is the costly part)."""
        from ragsieve.registry import load_reranker
        from ragsieve.rerank.base import ranked_from_scores

        memo = self._rankings.setdefault(spec, {})
        if q.id not in memo:
            candidates = self.candidates[q.id]
            store = self._score_store(spec)
            ids = [p.id for p in candidates]
            scores = store.lookup(q.id, ids) if store is not None and candidates else None
            if scores is None and candidates:
                if spec not in self._rankers:
                    self._rankers[spec] = load_reranker(self._ranker_base(spec))
                scores = [float(s) for s in self._rankers[spec].score(q.text, candidates)]
                if store is not None:
                    store.add([(q.id, pid, s) for pid, s in zip(ids, scores)])
            ranked = ranked_from_scores(q.text, candidates, scores).results if candidates else []
            memo[q.id] = [(r.index, float(r.score)) for r in ranked]
        return memo[q.id]

    def _score_store(self, spec: str):
        """Where ``spec``'s candidate scores are kept across runs (the records when given, else the work
        folder), keyed by its weights and reading (a passage past the window by its best chunk, as
        ``load_reranker`` scores it): a resumed selection re-ranks nothing (≈ 40 min for 845 questions and two
        rerankers on 2 cores). None for a scorer without local weights (its scores are not kept)."""
        from ragsieve.data.score_records import PairScores
        from ragsieve.registry import reranker_scores_key

        if spec not in self._score_stores:
            key = reranker_scores_key(self._ranker_base(spec))
            root = (self.records or self.work) / "scores"
            self._score_stores[spec] = None if key is None else PairScores(
                root / hashlib.sha1(key.encode()).hexdigest()[:16], "candidates", {"scoring_key": key})
        return self._score_stores[spec]

    # -- 8. grade ---------------------------------------------------------------------------------
    def phase_grade(self) -> None:
        """The F1-best relevance threshold of the sieve's reranker on dev (a passage with a gold answer is
        relevant): one of the grade thresholds the selection tries."""
        from ragsieve.eval.classification import best_threshold

        self.f1_thresholds: dict[str, float] = {}
        if not self.config.grade:
            return
        scores, labels = [], []
        for q in self.splits["dev"]:  # every candidate, not only the top-k: both labels, more of them
            for i, score in self._ranked(self.reranker_spec, q):
                if self.candidates[q.id][i].text.strip():  # an empty passage is never graded relevant
                    scores.append(score)
                    labels.append(int(i in self._answer_bearing(q)))
        if len(set(labels)) < 2:
            log.warning("fit: dev passages are all %s: no grader threshold can be calibrated",
                        "relevant" if labels and labels[0] else "irrelevant")
            return
        # what RankerGrader.fit_threshold computes, on the scores the selection ranks by
        self.f1_thresholds[self.reranker_spec] = float(best_threshold(labels, scores, "f1"))
        self.progress("grade", 1, 1)

    def _ranker_base(self, spec: str) -> str:
        """A reranker named in ``sieve.json`` as something loadable from here: the sieve's own folder, or
        what the guard kept instead (a spec or an outside folder)."""
        return str(self.out / "reranker") if spec == "reranker" else spec

    def _save_grader(self, choice: "Choice", how: str = "dev answer accuracy") -> Optional[str]:
        """The grader folder of the shipped configuration (its order's reranker and threshold), or None;
        ``how`` the threshold was chosen (recorded in the grader's config)."""
        import shutil

        from ragsieve.registry import new_grader

        shutil.rmtree(self.out / "grader", ignore_errors=True)
        if choice.threshold is None or choice.k == 0:
            return None
        grader = new_grader("ranker", base=self._ranker_base(choice.order))
        trained = {"threshold_metric": f"{how} ({choice.grade})",
                   **({"ranker_weights": grader.ranker_weights} if grader.ranker_weights else {})}
        # the grader names its ranker relative to the sieve, so the folder can move
        base = "../reranker" if choice.order == "reranker" else choice.order
        grader.config = grader.config.model_copy(update={"threshold": choice.threshold, "trained": trained,
                                                         "base": base})
        grader.save(self.out / "grader")
        return "grader"

    # -- 9. select --------------------------------------------------------------------------------
    def phase_select(self) -> None:
        """The configuration chosen by the LLM's answers on dev, checked on test against closed book and
        the best plain configuration (see :mod:`ragsieve.fit.select`)."""
        from ragsieve.fit.select import RETRIEVER, Choice, Selection, choose, do_no_harm

        c = self.config.select
        dev, test = self.splits["dev"], self.splits["test"]
        selection = Selection(self.builder, self.answers, self.candidates, c,
                              progress=lambda done, total: self.progress("select", done, total),
                              pruner=self._sentence_pruner(), sentence_store=self._sentence_store())
        sources = [RETRIEVER, self.config.align.init] + (["reranker"] if self.reranker_spec == "reranker" else [])
        selection.add_ranking(RETRIEVER, dev + test)
        self._rank_all(sources[1:], dev + test, "select")
        for name in sources[1:]:
            selection.rankings[name] = {q.id: self._ranked(name, q) for q in dev + test}
        if self.probe is not None:
            selection.confidence = dict(zip([q.id for q in dev + test], self._conf_q(dev + test).tolist()))
        # the user's gate policy bounds the grid: none = no gate, a budget = every retrieval behind its β
        gates = "off" if self.config.gate == "none" else "policy" if gate_budget(self.config.gate) else "choose"
        grid = selection.grid(sources, dev, self.f1_thresholds, self.beta, gates)
        if not self.config.grade:
            grid = [g for g in grid if g.threshold is None]
        start = self.answers.stats()
        # raced: a configuration measurably beaten by one no more expensive stops being answered; the plain
        # ones stay to the end (the do-no-harm baseline is chosen among them on every dev question)
        rows, race = selection.race(grid, dev, protect=selection.plain(c.plain_ks))
        refined = selection.placement_variants(rows)  # other placements, around the best surviving rows only
        rows += selection.evaluate(refined, dev)
        plain_rows = selection.evaluate(selection.plain(c.plain_ks), dev)
        used = {k: v - start[k] for k, v in self.answers.stats().items()}
        chosen, best_plain = choose(rows, c.objective, alpha=c.alpha), choose(plain_rows)
        closed_row = selection.evaluate([Choice(0)], dev)[0]
        asked_on_dev = len(selection.asked)  # the test questions are asked below
        on_test = dict(zip(("chosen", "best_plain", "closed_book"), selection.evaluate(
            [chosen["choice"], best_plain["choice"], Choice(0)], test)))
        self.do_no_harm = do_no_harm(on_test, alpha=c.alpha, n_boot=c.n_boot, seed=self.config.seed)
        shipped, note = self.do_no_harm["shipped"], self.do_no_harm["note"]
        if note:
            log.warning("fit: %s", note)
        self.shipped_key = shipped
        self.shipped: Choice = on_test[shipped]["choice"]
        self._confidence = selection.confidence
        self.selection_rows, self.selection_marks = rows, {"chosen": chosen, "best plain": best_plain,
                                                           "closed book": closed_row}
        self.test_rows = on_test
        self.selection = {
            "objective": c.objective, "n_dev": len(dev), "n_configurations": len(rows),
            # an endpoint's tokenizer is not at hand: its prompt tokens are estimated (PromptBuilder)
            "prompt_tokens_from": "characters / 4" if self.endpoint_only else "the LLM's tokenizer",
            "chosen": chosen["name"], "best_plain": best_plain["name"], "shipped": on_test[shipped]["name"],
            "note": note,
            "dev": {name: _row_summary(row) for name, row in (("chosen", chosen), ("best_plain", best_plain),
                                                              ("closed_book", closed_row))},
            "answer_cache": used, "race": race,
            # the prompts the grid, the refinement and the plain rows put to the LLM (or found in the cache)
            "unique_prompts_per_dev_question": round(asked_on_dev / max(len(dev), 1), 2),
        }
        self.progress("select", 1, 1)

    def _sentence_pruner(self):
        """The pruner the grid's prune configurations score sentences with: the reranker alignment started from
        (zero-shot, ``title: sentence``); None when the grid prunes nothing."""
        if not (self.config.select.prune_quantiles or self.config.select.prune_max_sentences):
            return None
        from ragsieve.prune import SentencePruner
        from ragsieve.registry import load_reranker

        spec = self.config.align.init
        if spec not in self._rankers:
            self._rankers[spec] = load_reranker(self._ranker_base(spec))
        return SentencePruner(self._rankers[spec])

    def _sentence_store(self):
        """Sentence scores kept across runs beside the candidate scores, keyed by the pruning scorer's weights."""
        from ragsieve.data.score_records import PairScores
        from ragsieve.registry import reranker_scores_key

        key = reranker_scores_key(self._ranker_base(self.config.align.init))
        if key is None or self._sentence_pruner() is None:
            return None
        root = (self.records or self.work) / "scores"
        return PairScores(root / ("sentences-" + hashlib.sha1(key.encode()).hexdigest()[:16]), "sentences",
                          {"scoring_key": key, "unit": "title: sentence"})

    # -- 10. evaluate -----------------------------------------------------------------------------
    def phase_evaluate(self) -> None:
        from ragsieve.eval.classification import accuracy_interval
        from ragsieve.eval.stats import bootstrap_metric
        from ragsieve.fit.select import RETRIEVER, plot_frontier, public_rows
        from ragsieve.pipeline.sieve import Sieve

        shipped = self.shipped
        gated = shipped.beta is not None and shipped.k > 0
        policy = (self.config.gate if shipped.gate == "policy" else f"dev accuracy ({shipped.gate})") if gated else ""
        sieve = SieveConfig(
            llm=self.config.llm, probe="probe" if self.probe is not None else None,
            layer=self.probe.config.layer if self.probe is not None else None, beta=shipped.beta if gated else None,
            policy=policy,
            reranker=None if shipped.order == RETRIEVER or shipped.k == 0 else shipped.order,
            grader=self._save_grader(shipped), top_k=shipped.k, passage_order=shipped.placement,
            prune_threshold=shipped.prune_threshold if shipped.k > 0 else None,
            prune_max_sentences=shipped.prune_max if shipped.k > 0 else None,
            # the sentence scorer the grid pruned with, unless it is the sieve's reranker already
            pruner=(self.config.align.init if shipped.prune != "off" and shipped.k > 0
                    and shipped.order != self.config.align.init else None),
            candidates=self.config.candidates, max_prompt_tokens=self.config.max_prompt_tokens,
            max_new_tokens=self.config.max_new_tokens,
        )
        test = self.splits["test"]
        shipped_key = self.shipped_key

        def acc(correct) -> dict:
            x = np.asarray(correct)
            lo, hi = accuracy_interval(int(x.sum()), len(x))
            return {"accuracy": float(x.mean()), "ci95": [lo, hi], "n": len(x)}

        def on_test(key: str) -> dict:  # a test row of the selection: accuracy and its mean prompt tokens
            row = self.test_rows[key]
            return {**acc(row["correct"]), "prompt_tokens": float(np.mean(row["tokens_each"]))}

        plain_k = np.array([self.plain[q.id] for q in test])
        metrics: dict[str, Any] = {
            "n_questions": {k: len(v) for k, v in self.splits.items()},
            "test": {"closed_book": on_test("closed_book"), f"plain_top{self.config.top_k}": acc(plain_k),
                     "best_plain": on_test("best_plain"), "sieve": on_test(shipped_key)},
            "configurations": {"best_plain": self.test_rows["best_plain"]["name"],
                               "sieve": self.test_rows[shipped_key]["name"]},
            "retrieval_rate": float(np.mean([shipped.k > 0 and (not gated or self._confidence[q.id] <= shipped.beta)
                                             for q in test])),
            "do_no_harm": self.do_no_harm,
            "selection": {**self.selection, "grid": public_rows(self.selection_rows)},
            "preference_groups": {k: len(v) for k, v in self.prefs.items()},
            "preferences_from": "answers" if self.probe is None else "confidence shifts",
        }
        if self.probe is not None:
            try:
                from sklearn.metrics import roc_auc_score

                layer = self.probe.config.layer
                states, y = self._probe_data([layer], "test")
                # two states per question (closed book, top-k): the interval resamples whole questions
                questions = [q.id for q in test] * 2
                est, lo, hi = bootstrap_metric(roc_auc_score, y, self.probe.head.predict_proba(states[layer]),
                                               groups=questions)
                metrics["probe_test_auroc"] = {"auroc": est, "ci95": [lo, hi], "n": len(y),
                                               "n_questions": len(test)}
            except ValueError:
                metrics["probe_test_auroc"] = None  # one class only in the test split
            metrics["probe_dev_auroc_by_layer"] = self.probe.config.metrics.get("dev_auroc_by_layer", {})
        else:
            metrics["skipped"] = f"{self.config.llm} is an endpoint (no hidden states): no probe, no gate"
        metrics["gate_dev"] = self.gate_dev
        # the relevance guard's verdict on the aligned reranker (None: guard off or nothing aligned)
        metrics["alignment_check"] = self.align_check
        metrics["alignment_guards"] = {
            **self.config.align.train.model_dump(
                include={"distill_weight", "replay_ratio", "lora_r", "eval_steps", "cosine_mix"}),
            **self.config.align.model_dump(include={"guard", "max_mrr_drop"})}
        metrics["seconds_by_phase"] = self.timings
        plot = plot_frontier(self.selection_rows, self.out / "frontier.png", self.selection_marks)
        metrics["selection"]["plot"] = plot.name
        self.sieve = sieve.model_copy(update={
            "metrics": metrics, "versions": _versions(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        })
        Sieve(self.sieve).save(self.out)
        self.progress("evaluate", len(test), len(test))


def _row_summary(row: dict) -> dict:
    summary = {k: row[k] for k in ("name", "accuracy", "ci95", "n", "prompt_tokens", "llm_seconds")}
    return {**summary, "k": row["choice"].k}  # the demo re-runs the best plain configuration by its k


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("ragsieve", "torch", "transformers", "sentence-transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def fit_splits(config: FitConfig, questions: list[Question]) -> dict[str, list[Question]]:
    """The train / dev / test questions; a split with fewer than 2 is an error naming the file."""
    from ragsieve.data.qa_files import split_questions

    splits = split_questions(questions, config.split, config.seed)
    small = [name for name, qs in splits.items() if len(qs) < 2]
    if small:
        raise RagsieveError(
            f"{config.questions}: too few questions for the {'/'.join(small)} split "
            f"({len(questions)} in all); give more questions"
        )
    return splits


def check_fit_questions(config: FitConfig) -> None:
    """The QA file and its split sizes, checked before the index and the LLM load or any phase runs."""
    from ragsieve.data.qa_files import read_qa_file

    fit_splits(config, read_qa_file(config.questions)[: config.max_questions or None])


def fit_sieve(config: FitConfig, progress: Optional[Progress] = None) -> SieveConfig:
    """Run every phase (resuming from ``<out>/work``) and return the written ``sieve.json``."""
    check_fit_questions(config)
    return Fit(config, progress).run()
