"""Choosing the sieve by the LLM's answers (issue #39), and checking on test that it does no harm.

A *configuration* is what reaches the prompt: ``k`` passages (0 = closed book) in an order (the
retriever's, or a reranker's), optionally graded (a passage whose reranker score is below a
threshold is dropped), listed best first or best last, optionally behind the CBDR gate (β).
:class:`Selection` answers every configuration of a grid on the dev questions with the user's
LLM and keeps the most accurate (ties: fewer prompt tokens); :meth:`Selection.race` stops answering a
configuration once one no more expensive answers measurably better on the questions so far. Many
configurations put the same passages in the prompt (a grader keeps a prefix of the reranker's top k, i.e. a
smaller k; the gate only swaps in the closed-book prompt), so answers are stored per unique prompt in an
:class:`AnswerCache` (SQLite under the fit's work folder): the grid pays only for prompts it has not seen,
and a killed fit resumes.

Example::

    selection = Selection(builder, AnswerCache(work / "answers.sqlite", llm, builder), candidates, config)
    selection.add_ranking("retriever", questions)             # the retriever's order
    selection.add_ranking("embedded:base", questions, load_reranker("embedded:base"))
    rows, record = selection.race(selection.grid(["retriever", "embedded:base"], dev), dev)
    best = choose(rows, "accuracy")          # ragsieve.fit.decide: choosing, cross-fitting, the guard
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from ragsieve.data.records import Passage, Question
from ragsieve.fit.config import SelectConfig
from ragsieve.fit.decide import outcome_row, raced_out
from ragsieve.prompts.builder import PromptBuilder, in_prompt_order

if TYPE_CHECKING:
    from ragsieve.models.llm import Generator
    from ragsieve.pipeline.stages import FilterResult
    from ragsieve.probe.cache import StateCache
    from ragsieve.prune import SentencePruner
    from ragsieve.rerank.base import BaseRanker

log = logging.getLogger(__name__)

RETRIEVER = "retriever"  # the order source that keeps the retriever's ranking (no reranker)
ZERO_SHOT = "zero-shot"  # the sentence scorer that scores (question, title: sentence) pairs with a reranker


class AnswerCache:
    """The LLM's answer to each unique prompt, in SQLite: a rerun (or another configuration with the
    same prompt) reads it instead of asking again. Keyed by the LLM spec, ``max_new_tokens``, the system
    prompt and the user message; each answer keeps the seconds it cost (its batch's time / batch size).

    ``requested`` counts prompts asked for (repeats included), ``unique`` the distinct ones,
    ``answered`` those the LLM answered now; ``unique - answered`` were cache hits.
    """

    def __init__(self, path: str | Path, llm: "Generator", builder: PromptBuilder, *, max_new_tokens: int = 16,
                 batch_size: int = 8, records: str | Path | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.llm, self.builder = llm, builder
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        self._db = sqlite3.connect(self.path)
        self._db.execute("CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, answer TEXT, seconds REAL)")
        self._db.commit()
        self.requested = self.unique = self.answered = 0
        # (StateCache, layers): while set, the hidden states of those layers are read from the prefill of every
        # prompt answered now and cached under the probe extractor's keys, so the probe needs no forward of its own
        self.capture_states: Optional[tuple["StateCache", Sequence[int]]] = None
        # records: the same rows as JSONL (digest, answer, seconds: no prompt text), appended per batch and
        # read back here, so the answers outlive the machine that asked for them
        self.records = Path(records) if records is not None else None
        if self.records is not None:
            self.import_records(self.records)

    def import_records(self, path: str | Path) -> int:
        """Answers another run recorded (a records ``answers.jsonl``; read only), so this cache asks the LLM
        only for prompts nobody answered yet; returns the rows read (0 for a missing file)."""
        path = Path(path)
        if not path.is_file():
            return 0
        from ragsieve.data.jsonl import read_jsonl

        rows = [(r["key"], r["generation"], r["seconds"]) for r in read_jsonl(path, skip_bad=True)]
        self._db.executemany("INSERT OR IGNORE INTO answers VALUES (?, ?, ?)", rows)
        self._db.commit()
        return len(rows)

    def _key(self, text: str) -> str:
        ident = [self.llm.spec, self.max_new_tokens, self.builder.prompts.system, text]
        return hashlib.sha256(json.dumps(ident).encode()).hexdigest()

    def _stored(self, keys: Sequence[str]) -> dict[str, tuple[str, float]]:
        from ragsieve.data.sqlite_keys import rows_with_keys

        query = "SELECT key, answer, seconds FROM answers WHERE key IN ({marks})"
        return {k: (a, s) for k, a, s in rows_with_keys(self._db, query, keys)}

    def answers(self, texts: Sequence[str], progress: Optional[Callable[[int, int], None]] = None
                ) -> list[tuple[str, float]]:
        """``(answer, seconds)`` for each user message; only the ones not stored are answered (in batches of
        similar length, each committed as it finishes)."""
        keys = [self._key(t) for t in texts]
        stored = self._stored(set(keys))
        todo = sorted({k: t for k, t in zip(keys, texts) if k not in stored}.items(), key=lambda kv: len(kv[1]))
        self.requested += len(texts)
        self.unique += len(set(keys))
        if progress and todo:  # before the first batch: a log reads "N to do", not the first batch as done
            progress(0, len(todo))
        for lo in range(0, len(todo), self.batch_size):
            batch = todo[lo : lo + self.batch_size]
            start = time.perf_counter()
            got = self._generate([t for _, t in batch])
            each = (time.perf_counter() - start) / len(batch)
            rows = [(k, a, each) for (k, _), a in zip(batch, got)]
            self._store(rows)  # a kill loses at most this batch
            stored.update({k: (a, s) for k, a, s in rows})
            self.answered += len(batch)
            if progress:
                progress(min(lo + len(batch), len(todo)), len(todo))
        return [stored[k] for k in keys]

    def _generate(self, texts: list[str]) -> list[str]:
        if self.capture_states is None:
            return self.llm.generate(texts, system=self.builder.prompts.system, max_new_tokens=self.max_new_tokens,
                                     batch_size=self.batch_size)
        from ragsieve.probe.labels import generate_caching_states

        state_cache, layers = self.capture_states
        return generate_caching_states(self.llm, self.builder, texts, layers, state_cache,
                                       max_new_tokens=self.max_new_tokens, batch_size=self.batch_size)

    def put(self, texts: Sequence[str], answers: Sequence[str], seconds: float) -> None:
        """Answers obtained elsewhere (e.g. on Ray) to the user messages ``texts``, each costing ``seconds``:
        stored as if this cache had asked, so later prompts that match them are free."""
        self._store([(self._key(t), a, seconds) for t, a in zip(texts, answers, strict=True)])

    def _store(self, rows: Sequence[tuple[str, str, float]]) -> None:
        self._db.executemany("INSERT OR REPLACE INTO answers VALUES (?, ?, ?)", rows)
        self._db.commit()
        if self.records is not None:
            from ragsieve.data.jsonl import append_jsonl

            for k, a, sec in rows:
                append_jsonl(self.records, {"key": k, "generation": a, "seconds": round(sec, 4)})

    def stats(self) -> dict[str, int]:
        return {"requested": self.requested, "unique": self.unique, "answered": self.answered,
                "hits": self.unique - self.answered}

    def close(self) -> None:
        self._db.close()


class CachedGenerator:
    """``cache``'s LLM behind the :class:`~ragsieve.models.llm.Generator` interface, answering through the
    cache: the labelling prompts fit answers first (closed book, the retriever's top k) are then free for the
    selection. A call with another system prompt or answer length goes to the LLM directly."""

    def __init__(self, cache: AnswerCache):
        self.cache = cache
        self.spec = cache.llm.spec

    def generate(self, user_messages: Sequence[str], *, system: str | None = None, max_new_tokens: int = 32,
                 batch_size: int = 8) -> list[str]:
        if system != self.cache.builder.prompts.system or max_new_tokens != self.cache.max_new_tokens:
            return self.cache.llm.generate(user_messages, system=system, max_new_tokens=max_new_tokens,
                                           batch_size=batch_size)
        return [answer for answer, _ in self.cache.answers(user_messages)]


@dataclass(frozen=True)
class Choice:
    """One configuration of the grid (see the module docstring)."""

    k: int
    order: str = RETRIEVER
    threshold: Optional[float] = None  # grade: drop passages whose ``order`` reranker score is below
    grade: str = "off"  # where the threshold came from: off | f1 | q0.50 ...
    placement: str = "best_first"
    beta: Optional[float] = None  # gate: answer closed-book when Conf(Q) > β
    gate: str = "off"  # policy | q0.50 ... | off
    prune_threshold: Optional[float] = None  # prune: keep each kept passage's sentences scoring >= this
    prune_max: Optional[int] = None  # prune: and at most this many sentences per passage (the best ones)
    prune: str = "off"  # the prune level: off | q0.50 ... (a threshold) | best1 ... (a cap) | across best2 ...
    prune_scope: str = "passage"  # across: prune_max is the best sentences of all kept passages together
    prune_scorer: str = ZERO_SHOT  # the sentence scorer: the start reranker's pairs, or a keep head's spec
    prune_token_cap: Optional[int] = None  # across: the best sentences of all kept passages within this many tokens

    @property
    def name(self) -> str:
        if self.k == 0:
            return "closed book"
        parts = [f"top{self.k}", self.order]
        if self.grade != "off":
            parts.append(f"grade {self.grade}")
        if self.prune != "off":
            parts.append(f"prune {self.prune}" + ("" if self.prune_scorer == ZERO_SHOT else f" by {self.prune_scorer}"))
        if self.placement != "best_first":
            parts.append(self.placement.replace("_", " "))
        if self.gate != "off":
            parts.append(f"gate {self.gate}")
        return ", ".join(parts)

    @property
    def plain(self) -> bool:
        """Plain retrieval: the retriever's top k, best first, no grade, no gate."""
        return self.k > 0 and self.order == RETRIEVER and self.grade == "off" and self.gate == "off" \
            and self.placement == "best_first" and self.prune == "off"

    @property
    def simplicity(self) -> tuple:
        """Smaller is simpler: the last tie-break (fewer parts, then fewer passages)."""
        return (self.gate != "off", self.grade != "off", self.prune != "off", self.order != RETRIEVER,
                self.placement != "best_first", self.k)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "k": self.k, "order": self.order, "grade": self.grade,
                "threshold": self.threshold, "placement": self.placement, "gate": self.gate, "beta": self.beta,
                "prune": self.prune, "prune_threshold": self.prune_threshold, "prune_max": self.prune_max,
                "prune_scope": self.prune_scope, "prune_scorer": self.prune_scorer,
                "prune_token_cap": self.prune_token_cap}


class Selection:
    """The grid over one set of candidates: rankings per order source, prompts, answers, accuracy."""

    def __init__(self, builder: PromptBuilder, cache: AnswerCache, candidates: dict[str, list[Passage]],
                 config: SelectConfig, progress: Optional[Callable[[int, int], None]] = None,
                 pruner: "SentencePruner | None" = None, sentence_store: Any = None,
                 scorers: "dict[str, tuple[SentencePruner, Any]] | None" = None):
        self.builder, self.cache, self.candidates, self.config = builder, cache, candidates, config
        self.progress = progress
        # the sentence scorers of the prune configurations, by name: (pruner, where its scores outlive the run — a
        # PairScores: question id, "passage id#start-end" → score, or None); ``pruner`` alone is the zero-shot one;
        # none: the grid prunes nothing
        self.scorers: dict[str, tuple["SentencePruner", Any]] = dict(scorers or {})
        if pruner is not None:
            self.scorers = {ZERO_SHOT: (pruner, sentence_store), **self.scorers}
        # (scorer, question id, candidate) → a score per sentence
        self._sentence_scores: dict[tuple[str, str, int], np.ndarray] = {}
        # source → question id → [(candidate index, score)] in rank order
        self.rankings: dict[str, dict[str, list[tuple[int, float]]]] = {}
        self.confidence: dict[str, float] = {}  # question id → Conf(Q), when a probe exists
        self._prompts: dict[tuple, str] = {}
        self._tokens: dict[str, int] = {}
        self.asked: set[str] = set()  # every prompt evaluated (answered now or read from the cache)

    def add_ranking(self, source: str, questions: Sequence[Question], ranker: "BaseRanker | None" = None) -> None:
        """Rank each question's candidates with ``ranker`` (None: keep the retriever's order) under ``source``."""
        rows = self.rankings.setdefault(source, {})
        for q in questions:
            if q.id in rows:
                continue
            cands = self.candidates[q.id]
            if ranker is None or not cands:
                rows[q.id] = [(i, float(-i)) for i in range(len(cands))]
            else:
                rows[q.id] = [(r.index, float(r.score)) for r in ranker.rank(q.text, cands).results]

    # -- the grid ----------------------------------------------------------------------------------
    def grid(self, sources: Sequence[str], dev: Sequence[Question], f1_thresholds: Optional[dict[str, float]] = None,
             policy_beta: Optional[float] = None, gates: str = "choose") -> list[Choice]:
        """Every configuration: k × order × grade × placement × gate, without duplicates that cannot differ
        (one closed book; one placement for a single passage; no grade for the retriever's order, which has
        no score; no gate without Conf(Q)).

        ``gates``: ``choose`` tries no gate, ``policy_beta`` and the dev Conf(Q) quantiles; ``policy`` keeps
        every retrieving configuration behind ``policy_beta`` (a retrieval budget the user set); ``off`` none.
        """
        c = self.config
        top = max(c.ks)
        placements = c.placements if c.placement_search == "full" else c.placements[:1]
        betas: list[tuple[Optional[float], str]] = [(None, "off")]
        if self.confidence and dev and gates != "off":
            conf = np.array([self.confidence[q.id] for q in dev])
            policy = [(float(policy_beta), "policy")] if policy_beta is not None and policy_beta < 1.0 else []
            if gates == "policy":
                betas = policy or betas
            else:
                betas += policy + [(float(np.quantile(conf, share)), f"q{share:.2f}") for share in c.gate_quantiles]
        prunes = [(*level, scorer) for scorer in self.scorers for level in self.prune_levels(sources, dev, scorer)]
        across = [(n, scorer) for scorer in self.scorers for n in (c.prune_across_sentences if dev else [])]
        budgets = [(cap, scorer) for scorer in self.scorers for cap in (c.prune_token_caps if dev else [])]
        choices = [Choice(0)] if 0 in c.ks else []
        for source in sources:
            grades: list[tuple[Optional[float], str]] = [(None, "off")]
            if source != RETRIEVER and top > 0:
                scores = np.array([s for q in dev for _, s in self.rankings[source][q.id][:top]])
                if len(scores):
                    grades += [(float(np.quantile(scores, share)), f"q{share:.2f}") for share in c.grade_quantiles]
                if f1_thresholds and source in f1_thresholds:
                    grades.append((float(f1_thresholds[source]), "f1"))
            for k in (k for k in c.ks if k > 0):
                for threshold, grade in grades:
                    for placement in (placements if k > 1 else ["best_first"]):
                        for beta, gate in betas:
                            choices.append(Choice(k, source, threshold, grade, placement, beta, gate))
                        # pruned, not crossed with the gate choices: the gate and pruning answer different
                        # questions (whether to read, how much of each passage), and crossing them would multiply
                        # the grid for a rare win. betas[0] is "off", or the user's budget, which binds them all.
                        for prune_threshold, prune_max, prune, scorer in prunes:
                            choices.append(Choice(k, source, threshold, grade, placement, *betas[0],
                                                  prune_threshold=prune_threshold, prune_max=prune_max, prune=prune,
                                                  prune_scorer=scorer))
                        # across passages (issue #69): the best n sentences of all k kept passages together, so
                        # evidence in two passages costs two sentences, not two passages
                        for n, scorer in (across if k > 1 else []):
                            choices.append(Choice(k, source, threshold, grade, placement, *betas[0], prune_max=n,
                                                  prune=f"across best{n}", prune_scope="across", prune_scorer=scorer))
                        # and the best sentences of all of them within a token budget (RECOMP / EXIT-style)
                        for cap, scorer in (budgets if k > 1 else []):
                            choices.append(Choice(k, source, threshold, grade, placement, *betas[0],
                                                  prune=f"across {cap} tokens", prune_scope="across",
                                                  prune_scorer=scorer, prune_token_cap=cap))
        return choices

    def prune_levels(self, sources: Sequence[str], dev: Sequence[Question], scorer: str = ZERO_SHOT
                     ) -> list[tuple[Optional[float], Optional[int], str]]:
        """The prune levels of ``scorer`` as (threshold, sentence cap, name): the best ``prune_max_sentences``
        sentences of each passage, and the ``prune_quantiles`` of its sentence scores over every passage the grid
        can put in a dev prompt (the top ``max(ks)`` of each order); none without that scorer."""
        if scorer not in self.scorers or not dev:
            return []
        caps = [(None, n, f"best{n}") for n in self.config.prune_max_sentences]
        if not self.config.prune_quantiles:
            return caps
        top = max(self.config.ks)
        needed = [(q, i) for q in dev for source in sources for i, _ in self.rankings[source][q.id][:top]]
        self.score_sentences(needed, scorer)
        scores = np.concatenate([self._sentence_scores[scorer, q.id, i] for q, i in dict.fromkeys(needed)]
                                or [np.zeros(0)])
        if not len(scores):
            return caps
        return caps + [(float(np.quantile(scores, share)), None, f"q{share:.2f}")
                       for share in self.config.prune_quantiles]

    def score_sentences(self, needed: Sequence[tuple[Question, int]], scorer: str = ZERO_SHOT) -> None:
        """Score with ``scorer`` the sentences of each (question, candidate index) not scored yet, in one batch."""
        todo = [(q, i) for q, i in dict.fromkeys((q, i) for q, i in needed)
                if (scorer, q.id, i) not in self._sentence_scores]
        if not todo or scorer not in self.scorers:
            return
        pruner, store = self.scorers[scorer]
        layouts = [pruner.layout(q.text, [self.candidates[q.id][i]]) for q, i in todo]
        stored = [store.lookup(q.id, [p.id for p in lay.pairs]) if store is not None else None
                  for (q, _), lay in zip(todo, layouts)]
        missing = [j for j, got in enumerate(stored) if got is None]
        fresh = dict(zip(missing, pruner.score_many([layouts[j] for j in missing])))
        if store is not None and missing:
            store.add([(todo[j][0].id, p.id, float(x)) for j in missing for p, x in zip(layouts[j].pairs, fresh[j])])
        for j, (q, i) in enumerate(todo):
            self._sentence_scores[scorer, q.id, i] = np.asarray(stored[j], float) if stored[j] is not None \
                else fresh[j]

    def placement_variants(self, rows: Sequence[dict[str, Any]]) -> list[Choice]:
        """The other placements of the ``refine_top`` most accurate answered configurations with k >= 2 that
        survived the race (``placement_search: refine``; none when the grid already holds every placement)."""
        c = self.config
        if c.placement_search == "full":
            return []
        seen = {row["choice"] for row in rows}
        multi = sorted((row for row in rows if row["choice"].k > 1 and not raced_out(row)),
                       key=lambda r: (-r["correct_count"], round(r["prompt_tokens"], 6), r["choice"].simplicity))
        out: list[Choice] = []
        for row in multi[: c.refine_top]:
            for placement in c.placements:
                variant = replace(row["choice"], placement=placement)
                if variant not in seen:
                    seen.add(variant)
                    out.append(variant)
        return out

    def plain(self, ks: Sequence[int], policy_beta: Optional[float] = None) -> list[Choice]:
        """Plain retrieval at each k (the do-no-harm baseline's candidates); behind ``policy_beta`` when the user
        set a retrieval budget, which binds the baseline as it binds every configuration of the grid."""
        if policy_beta is not None and policy_beta < 1.0 and self.confidence:
            return [Choice(k, beta=float(policy_beta), gate="policy") for k in ks if k > 0]
        return [Choice(k) for k in ks if k > 0]

    # -- prompts and answers ------------------------------------------------------------------------
    def _graded(self, choice: Choice, q: Question) -> "FilterResult | None":
        """The sieve's own stages on the stored ranking (cut to k, the order's scores against the threshold),
        before pruning; None when ``choice`` answers ``q`` closed-book."""
        if choice.k == 0 or (choice.beta is not None and self.confidence[q.id] > choice.beta):
            return None
        from ragsieve.pipeline.stages import SieveStages
        from ragsieve.rerank.base import RankedResult, RankedResults

        cands = self.candidates[q.id]
        ranked = RankedResults(q.text, tuple(RankedResult(cands[i], s, rank, i)
                                             for rank, (i, s) in enumerate(self.rankings[choice.order][q.id])))
        stages = SieveStages(None, None, top_k=choice.k, threshold=choice.threshold)
        return stages.grade(stages.cut(ranked))

    def _kept_indices(self, choice: Choice, q: Question) -> list[int]:
        """The candidate indices ``choice`` keeps for ``q`` before pruning."""
        result = self._graded(choice, q)
        return [r.index for r, _ in result.kept_results] if result is not None else []

    def passages(self, choice: Choice, q: Question) -> list[Passage]:
        """What ``choice`` puts in ``q``'s prompt, best first: exactly what the shipped sieve would."""
        result = self._graded(choice, q)
        if result is None:
            return []
        if choice.prune == "off" or not result.kept_results:
            return result.kept
        from ragsieve.pipeline.stages import SieveStages

        # the sieve's pruning on the stored sentence scores of the kept candidates
        kept, scorer = [r.index for r, _ in result.kept_results], choice.prune_scorer
        self.score_sentences([(q, i) for i in kept], scorer)
        pruner = self.scorers[scorer][0].at(choice.prune_threshold, choice.prune_max, scope=choice.prune_scope,
                                            token_cap=choice.prune_token_cap)
        scores = np.concatenate([self._sentence_scores[scorer, q.id, i] for i in kept])
        return SieveStages(pruner=pruner).decide_prune(result, scores).kept

    def prompt(self, choice: Choice, q: Question) -> str:
        passages = self.passages(choice, q)
        placement = choice.placement if len(passages) > 1 else "best_first"
        key = (q.id, tuple((p.id, p.text) for p in passages), placement)
        if key not in self._prompts:
            self._prompts[key] = self.builder.with_context(q.text, in_prompt_order(passages, placement)).text
        return self._prompts[key]

    def tokens(self, text: str) -> int:
        if text not in self._tokens:
            self._tokens[text] = self.builder.prompt_tokens(text)
        return self._tokens[text]

    def unique_prompts(self, choices: Sequence[Choice], questions: Sequence[Question]) -> int:
        return len({self.prompt(c, q) for c in choices for q in questions})

    def _outcomes(self, choices: Sequence[Choice], questions: Sequence[Question]
                  ) -> list[tuple[list[int], list[int], list[float]]]:
        """Per configuration: right (1) or wrong per question, prompt tokens and LLM seconds per question."""
        from ragsieve.eval.qa import contains_answer
        from ragsieve.prompts import first_line

        for scorer in {c.prune_scorer for c in choices if c.prune != "off"}:  # each scorer's sentences in one batch
            unpruned = {replace(c, prune_threshold=None, prune_max=None, prune="off", prune_scope="passage",
                                prune_scorer=ZERO_SHOT, prune_token_cap=None)
                        for c in choices if c.prune != "off" and c.prune_scorer == scorer}
            self.score_sentences([(q, i) for c in unpruned for q in questions for i in self._kept_indices(c, q)],
                                 scorer)
        prompts = [[self.prompt(c, q) for q in questions] for c in choices]
        flat = [t for row in prompts for t in row]
        self.asked.update(flat)
        answered = dict(zip(flat, self.cache.answers(flat, self.progress)))  # the cache asks once per unique prompt
        right: dict[tuple[str, str], int] = {}
        out = []
        for texts in prompts:
            correct = []
            for q, text in zip(questions, texts):
                if (q.id, text) not in right:
                    right[q.id, text] = int(contains_answer(first_line(answered[text][0]), q.answers))
                correct.append(right[q.id, text])
            out.append((correct, [self.tokens(t) for t in texts], [answered[t][1] for t in texts]))
        return out

    def evaluate(self, choices: Sequence[Choice], questions: Sequence[Question]) -> list[dict[str, Any]]:
        """One row per configuration on ``questions``: accuracy with its Wilson 95 % interval, mean prompt
        tokens, LLM seconds per question and the per-question outcomes (``correct``, for paired tests)."""
        return [outcome_row(c, *got) for c, got in zip(choices, self._outcomes(choices, questions))]

    def race(self, choices: Sequence[Choice], questions: Sequence[Question], protect: Sequence[Choice] = ()
             ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Rows of ``choices`` on ``questions``, racing (``config.race``): the questions are taken in their
        order, ``race_min`` first, then ``race_batch`` per round; after a round that leaves questions, a
        configuration is dropped when a surviving one with no more mean prompt tokens answers measurably
        better on the same questions so far (one-sided exact McNemar on the discordant pairs, p <
        ``race_alpha``). A cheap configuration survives unless something no more expensive beats it, so the
        Pareto frontier and a token budget keep their points. Closed book and ``protect`` are never dropped.
        A dropped row keeps its estimates on the questions it saw (``n``), with ``raced_out_after`` (that n)
        and ``dominated_by``; survivors are answered on every question. Also returns the race's record:
        questions and survivors per round. ``race: false``: :meth:`evaluate` on every question.

        Example::

            rows, record = selection.race(selection.grid(["retriever"], dev), dev, selection.plain([1, 2]))
            best = choose(rows)  # among the survivors (every dev question)
        """
        from ragsieve.eval.stats import mcnemar_exact

        c = self.config
        if not c.race:
            return self.evaluate(choices, questions), {"race": False, "n_configurations": len(choices)}
        keep = set(protect) | {Choice(0)}
        alive = list(dict.fromkeys(choices))
        seen: dict[Choice, tuple[list[int], list[int], list[float]]] = {x: ([], [], []) for x in alive}
        out: dict[Choice, dict[str, Any]] = {}
        rounds: list[dict[str, int]] = []
        done = 0
        while done < len(questions):
            step = c.race_min if done == 0 else c.race_batch
            batch = questions[done : done + step]
            done += len(batch)
            for x, got in zip(alive, self._outcomes(alive, batch)):
                for acc, new in zip(seen[x], got):
                    acc.extend(new)
            dropped: dict[Choice, Choice] = {}
            if done < len(questions):  # after the last round every survivor has answered everything
                correct = {x: np.asarray(seen[x][0], bool) for x in alive}
                cost = {x: float(np.mean(seen[x][1])) for x in alive}
                cheapest_first = sorted(alive, key=lambda d: (cost[d], d.simplicity))
                for x in alive:
                    if x in keep:
                        continue
                    for d in cheapest_first:
                        if cost[d] > cost[x]:
                            break
                        if d == x or np.sum(correct[d] & ~correct[x]) <= np.sum(~correct[d] & correct[x]):
                            continue
                        # the exact two-sided test at 1/2 is symmetric: d better, one-sided, is half its p
                        if mcnemar_exact(correct[d], correct[x]).p_value / 2 < c.race_alpha:
                            dropped[x] = d
                            break
            for x, d in dropped.items():
                out[x] = {**outcome_row(x, *seen[x]), "raced_out_after": done, "dominated_by": d.name}
            alive = [x for x in alive if x not in dropped]
            rounds.append({"questions": done, "configurations": len(alive) + len(dropped), "dropped": len(dropped)})
            log.info("select: race round %d: %d of %d dev questions, %d configurations left (%d dropped)",
                     len(rounds), done, len(questions), len(alive), len(dropped))
        for x in alive:
            out[x] = outcome_row(x, *seen[x])
        record = {"race": True, "alpha": c.race_alpha, "n_configurations": len(out), "survivors": len(alive),
                  "rounds": rounds}
        return [out[x] for x in dict.fromkeys(choices)], record


def frontier(rows: Sequence[dict[str, Any]], cost: str) -> list[int]:
    """Indices of the rows no other row beats on both accuracy and ``cost`` (the Pareto frontier), cheapest first.

    Over every row: a row the race dropped has its accuracy and cost on the questions it saw (fewer than the
    survivors'); it was beaten by a row no more expensive, so it rarely sits on the frontier."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i][cost], -rows[i]["accuracy"]))
    out, best = [], -1.0
    for i in order:
        if rows[i]["accuracy"] > best:
            out.append(i)
            best = rows[i]["accuracy"]
    return out


def public_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as ``sieve.json`` records them: no per-question outcomes, frontier membership marked (a row
    the race dropped keeps ``raced_out_after`` and ``dominated_by``; its ``n`` is the questions it saw)."""
    on_tokens, on_seconds = set(frontier(rows, "prompt_tokens")), set(frontier(rows, "llm_seconds"))
    return [{**{k: v for k, v in r.items() if k not in ("correct", "tokens_each", "seconds_each", "choice")},
             "frontier_tokens": i in on_tokens, "frontier_seconds": i in on_seconds} for i, r in enumerate(rows)]


def plot_frontier(rows: Sequence[dict[str, Any]], path: str | Path, marks: dict[str, dict[str, Any]]) -> Path:
    """Held-out accuracy against mean prompt tokens and against LLM seconds per question: every configuration
    (hollow: dropped by the race, on fewer questions), the frontier as a line, and the ``marks`` (label → row:
    chosen, best plain, closed book) named."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, cost, label in zip(axes, ("prompt_tokens", "llm_seconds"),
                               ("mean prompt tokens", "LLM seconds per question")):
        full = [r for r in rows if not raced_out(r)]
        out = [r for r in rows if raced_out(r)]
        ax.scatter([r[cost] for r in full], [r["accuracy"] for r in full], s=10, color="0.7", label="configuration")
        if out:
            ax.scatter([r[cost] for r in out], [r["accuracy"] for r in out], s=10, facecolors="none",
                       edgecolors="0.6", label="dropped by the race (fewer questions)")
        line = [rows[i] for i in frontier(rows, cost)]
        ax.plot([r[cost] for r in line], [r["accuracy"] for r in line], color="C0", marker="o", ms=3, label="frontier")
        for (name, row), color in zip(marks.items(), ("C3", "C2", "C1", "C4")):
            ax.scatter([row[cost]], [row["accuracy"]], s=60, marker="*", color=color, label=f"{name}: {row['name']}",
                       zorder=3)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"held-out accuracy, dev + test (n = {max((r['n'] for r in rows), default=0)})")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle("Accuracy against cost for every configuration of the grid")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

