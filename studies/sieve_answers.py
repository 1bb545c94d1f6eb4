"""Sieves against plain context, by the LLM's answers, on held-out questions (issues #69, #71):
``experiments/sieves_vs_plain.yaml``.

What a user of a sieve gets, measured through the one sieve (:meth:`ragsieve.pipeline.stages.SieveStages.plan`,
what ``Sieve.filter``, ``/v1/filter`` and the adapters run), in three settings:

* ``nq``: NQ-oracle, the refits' test questions (519; ``bench/fit.py --questions 0 --split 0.2,0.3,0.5``), the
  hybrid index's top ``candidates``;
* ``hotpotqa``: HotpotQA, the 304 test questions of the 517 that ``embedded:base`` never trained on, the hybrid
  index over all 1,517 questions' paragraphs (as ``bench/fit.py --dataset hotpotqa`` builds it);
* ``hotpotqa-distractor``: the same 304 questions, each with its own 10 paragraphs as the candidates.

No question here trained ``embedded:base`` or the shipped keep head (``studies/prune_head.py`` leaves out the
prune study's dev and test), nor a refit's fitted head (trained on the refit's train split).

Rows: plain context (the retriever's top k; in the distractor setting, which has no retriever, the base
reranker's top k), every sieve of ``sieves`` (a sieve folder or spec, with optional ``sieve.json`` overrides: a grid point
without a fit), and the gold sentences (the ceiling). The best plain configuration is chosen per setting on the
dev questions (accuracy, ties: fewer tokens); every other row against it on test: exact McNemar, the paired
accuracy difference and relative prompt-token change with bootstrap intervals over questions, and the
non-inferiority verdict at ``margin``. Answers are cached per prompt (other studies' and the fits' records are read,
so a prompt already answered is not asked again) and recorded text-free under ``out_dir/records``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER

log = logging.getLogger(__name__)

SETTINGS = ("nq", "hotpotqa", "hotpotqa-distractor")
# a sieve's plain rows: its reranker's top k, whole, ungraded, unpruned, always retrieving
PLAIN = {"grader": None, "probe": None, "beta": None, "prune_threshold": None, "pruner": None,
         "prune_max_sentences": None, "prune_scope": "passage", "prune_token_cap": None, "passage_order": "best_first"}


class SieveRow(StrictConfig):
    sieve: str  # a sieve folder (``~`` expanded) or spec (``embedded:default``)
    overrides: dict[str, Any] = {}  # sieve.json fields to change (a grid point without a fit)


class SieveAnswersConfig(StrictConfig):
    settings: list[Literal["nq", "hotpotqa", "hotpotqa-distractor"]] = list(SETTINGS)
    llm: str = "embedded:smollm2-135m-instruct"
    reranker: str = "embedded:base"  # the plain reranked rows' order
    encoder: str = DEFAULT_ENCODER
    candidates: int = Field(20, ge=1)
    # plain context: the retriever's top k (the distractor setting has no retriever: the base reranker's top k). NQ
    # stops at 2 (SmolLM2 answers NQ half as often from 3 passages as from 1: results/fit/README.md)
    plain_ks: dict[str, list[int]] = {"nq": [1, 2], "hotpotqa": [1, 2, 3], "hotpotqa-distractor": [1, 2, 3]}
    sieves: dict[str, SieveRow] = {"shipped default": SieveRow(sieve="embedded:default")}
    # the refits' and prune studies' splits (studies/prune.py): NQ 241 / 326 / 519, HotpotQA 102 / 111 / 304
    splits: dict[str, dict[str, float]] = {"nq": {"train": 0.2, "dev": 0.3, "test": 0.5},
                                           "hotpotqa": {"train": 0.2, "dev": 0.18, "test": 0.62}}
    # answers other runs recorded (read only): their prompts are free here
    import_answers: list[str] = ["results/fit/nq/records", "results/fit/hotpotqa/records",
                                 "results/prune/records/nq", "results/prune/records/hotpotqa",
                                 "results/prune_with_head/records/nq", "results/prune_with_head/records/hotpotqa"]
    max_prompt_tokens: int = 1024
    max_new_tokens: int = 16
    batch_size: int = 8
    n_boot: int = 2000
    margin: float = Field(0.03, gt=0, lt=1)  # the non-inferiority margin every verdict states
    seed: int = 0
    data_dir: str | None = None
    max_questions: int = Field(0, ge=0, description="0: every question (a smoke run: fewer)")


def _dataset(setting: str) -> str:
    return "nq" if setting == "nq" else "hotpotqa"


class MemoScores:
    """A sieve's model calls answered once per (scorer, step, query, passages): rows sharing a reranker or a
    pruner do not score the same pairs again (a ranking of 20 candidates costs ≈ 0.7 s here)."""

    def __init__(self):
        self.memo: dict[tuple, np.ndarray] = {}
        self.hits = self.misses = 0

    def filter(self, stages, scorers: dict[str, str], query: str, passages):
        flow = stages.plan(query, passages)
        try:
            call = next(flow)
            while True:
                read = call.layout.passages if call.layout is not None else call.passages
                key = (scorers[call.step], call.step, query, tuple((p.id, p.title, p.text) for p in read))
                if key not in self.memo:
                    self.misses += 1
                    self.memo[key] = np.asarray(stages.score_call(call), float)
                else:
                    self.hits += 1
                call = flow.send(self.memo[key])
        except StopIteration as done:
            return done.value


def _scorers(sieve) -> dict[str, str]:
    """Which model answers each step of ``sieve`` (the memo's key): components resolved against its folder."""
    from ragsieve.pipeline.sieve_config import resolve_component

    config, folder = sieve.config, sieve.folder
    rank = resolve_component(folder, config.reranker) if config.reranker else "retriever order"
    prune = resolve_component(folder, config.pruner) if config.pruner else f"zero-shot {rank}"
    grade = resolve_component(folder, config.grader) if config.grader else "none"
    return {"rank": rank, "prune": prune, "grade": grade}


def load_row_sieve(row: SieveRow, llm):
    """The sieve of a row: its folder's ``sieve.json`` with the row's overrides, components found in that folder."""
    from ragsieve.pipeline.sieve import Sieve
    from ragsieve.pipeline.sieve_config import SieveConfig, read_sieve_config, sieve_folder

    folder = sieve_folder(str(Path(row.sieve).expanduser()) if not row.sieve.startswith("embedded:") else row.sieve)
    config = read_sieve_config(folder)
    if row.overrides:
        config = SieveConfig.model_validate({**config.model_dump(), **row.overrides})
    return Sieve(config, folder, llm=llm)


def _candidates(setting: str, asked, passages, index_name, ds, prune_config) -> dict[str, list]:
    from studies.prune import retrieved

    if setting != "hotpotqa-distractor":
        return retrieved(asked, passages, index_name, prune_config, prune_config.candidates)
    pool = {p.id: p for p in ds.passages}
    return {q.id: [pool[t] for t in q.meta["candidate_ids"]] for q in asked}


def run_setting(setting: str, config: SieveAnswersConfig, out_dir: Path, llm, builder, memo: MemoScores
                ) -> dict[str, Any]:
    from ragsieve.data.qa_files import split_questions
    from ragsieve.eval.qa import contains_answer
    from ragsieve.fit.select import AnswerCache
    from ragsieve.prompts import first_line
    from ragsieve.prompts.builder import in_prompt_order
    from studies.prune import PruneStudyConfig, _gold_row, _questions, _row, _vs, study_work

    dataset = _dataset(setting)
    prune_config = PruneStudyConfig(datasets=[dataset], llm=config.llm, reranker=config.reranker,
                                    encoder=config.encoder, candidates=config.candidates, data_dir=config.data_dir,
                                    n_boot=config.n_boot, margin=config.margin, seed=config.seed)
    work = study_work(dataset)
    records = out_dir / "records" / dataset  # one answer record per dataset: the settings share prompts
    records.mkdir(parents=True, exist_ok=True)
    questions, passages, index_name, ds = _questions(dataset, prune_config, work)
    if config.max_questions:
        questions = questions[: config.max_questions]
    splits = split_questions(questions, config.splits[dataset], config.seed)
    dev, test = splits["dev"], splits["test"]
    candidates = _candidates(setting, dev + test, passages, index_name, ds, prune_config)
    cache = AnswerCache(work / "answers.sqlite", llm, builder, max_new_tokens=config.max_new_tokens,
                        batch_size=config.batch_size, records=records / "answers.jsonl")
    for folder in config.import_answers:
        cache.import_records(Path(folder) / "answers.jsonl")
    log.info("sieve answers %s: dev %d, test %d, %d candidates a question", setting, len(dev), len(test),
             max(len(c) for c in candidates.values()))

    def answered(name: str, contexts: dict[str, list], asked) -> dict[str, Any]:
        texts = [builder.with_context(q.text, contexts[q.id]).text for q in asked]
        answers = cache.answers(texts)
        correct = [int(contains_answer(first_line(a), q.answers)) for (a, _), q in zip(answers, asked)]
        return _row(name, correct, [builder.prompt_tokens(t) for t in texts])

    def through(sieve, asked) -> dict[str, list]:
        scorers, contexts = _scorers(sieve), {}
        gated = sieve.config.probe is not None and sieve.config.beta is not None
        for n, q in enumerate(asked):
            if gated and not sieve.should_retrieve(q.text).retrieve:
                contexts[q.id] = []
                continue
            kept = memo.filter(sieve.stages, scorers, q.text, candidates[q.id]).kept
            contexts[q.id] = in_prompt_order(kept, sieve.config.passage_order)
            if n % 100 == 0:
                log.info("sieve answers %s: filtered %d / %d", setting, n, len(asked))
        return contexts

    plain_rows: dict[str, tuple] = {}
    for k in config.plain_ks[setting]:
        if setting != "hotpotqa-distractor":
            plain_rows[f"retriever top-{k}"] = ({q.id: candidates[q.id][:k] for q in dev + test}, None)
        else:
            sieve = load_row_sieve(SieveRow(sieve="embedded:default",
                                            overrides={**PLAIN, "reranker": config.reranker, "top_k": k}), llm)
            plain_rows[f"reranked top-{k}"] = (None, sieve)
    dev_plain = []
    for name, (contexts, sieve) in plain_rows.items():
        contexts = contexts or through(sieve, dev + test)
        plain_rows[name] = (contexts, sieve)
        dev_plain.append(answered(name, contexts, dev))
    best = max(dev_plain, key=lambda r: (r["accuracy"], -r["prompt_tokens"]))["name"]

    rows = {name: answered(name, contexts, test) for name, (contexts, _) in plain_rows.items()}
    for name, row in config.sieves.items():
        rows[name] = answered(name, through(load_row_sieve(row, llm), test), test)
    first = next(iter(config.sieves), None)  # every other sieve against the first (a new head against today's)
    for name in list(config.sieves)[1:]:
        rows[name]["vs_first_sieve"] = {"against": first, **_vs(rows[name], rows[first], prune_config)}
    rows["gold sentences"] = _gold_row(dataset, test, ds, prune_config, builder, cache)
    cache.close()
    plain_names = list(plain_rows)
    best_on_test = max((rows[n] for n in plain_names), key=lambda r: (r["accuracy"], -r["prompt_tokens"]))["name"]
    for name, row in rows.items():
        if name != best:
            row["vs_best_plain"] = _vs(row, rows[best], prune_config)
        if name not in plain_names and best_on_test != best:
            row["vs_best_plain_on_test"] = _vs(row, rows[best_on_test], prune_config)
    return {"n_questions": {k: len(v) for k, v in splits.items()}, "n_test": len(test), "best_plain": best,
            "best_plain_from": f"dev accuracy (n = {len(dev)}; ties: fewer tokens)",
            "best_plain_on_test": best_on_test,
            "dev_plain": {r["name"]: {k: r[k] for k in ("accuracy", "ci95", "prompt_tokens", "n")} for r in dev_plain},
            "rows": rows}


def write_report(out_dir: Path, results: dict[str, Any], config: SieveAnswersConfig) -> None:
    lines = ["# Sieves against plain context, by SmolLM2's answers (issues #69, #71)", "",
             "Generated by `ragsieve run experiments/sieves_vs_plain.yaml` (`studies/sieve_answers.py`; its docstring "
             "says what is measured); numbers from `metrics.json`. SmolLM2-135M-Instruct answers; containment "
             "accuracy (Wilson 95 %); prompt tokens in its tokenizer. Each row against the best plain configuration "
             "chosen on dev: accuracy difference and relative prompt-token change with paired-bootstrap 95 % "
             f"intervals over questions, exact McNemar p, and the verdict at the non-inferiority margin "
             f"δ = {config.margin * 100:.0f} pp (shown when the difference's lower bound clears −δ).", "",
             "Sieves: " + "; ".join(f"**{name}** = `{row.sieve}`" + (f" with {json.dumps(row.overrides)}"
                                                                   if row.overrides else "")
                                    for name, row in config.sieves.items()) + ".", ""]
    for setting, res in results.items():
        lines += [f"## {setting}: test n = {res['n_test']}, best plain (dev) = {res['best_plain']}", "",
                  "| configuration | accuracy [95 % CI] | prompt tokens | Δ accuracy vs best plain [95 % CI] | "
                  "McNemar p | non-inferior at δ | Δ tokens vs best plain [95 % CI] |", "|---|---|---|---|---|---|---|"]
        for name, r in res["rows"].items():
            acc = f"{r['accuracy']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"
            vs = r.get("vs_best_plain")
            if vs:
                t = vs["prompt_tokens_change"]
                d = (f"{vs['accuracy_diff']:+.3f} [{vs['accuracy_ci95'][0]:+.3f}, {vs['accuracy_ci95'][1]:+.3f}] | "
                     f"{vs['mcnemar_p']:.3g} | {'yes' if vs['non_inferiority']['non_inferior'] else 'no'} | "
                     f"{t['change']:+.1%} [{t['ci95'][0]:+.1%}, {t['ci95'][1]:+.1%}]")
            else:
                d = "(best plain) | | | "
            lines.append(f"| {name} | {acc} | {r['prompt_tokens']:.0f} | {d} |")
        if res["best_plain_on_test"] != res["best_plain"]:
            lines += ["", f"The best plain row on test is {res['best_plain_on_test']} (chosen after the fact, so "
                      "biased towards plain); against it:", "",
                      "| configuration | Δ accuracy [95 % CI] | McNemar p | non-inferior at δ |", "|---|---|---|---|"]
            for name, r in res["rows"].items():
                vs = r.get("vs_best_plain_on_test")
                if vs:
                    lines.append(f"| {name} | {vs['accuracy_diff']:+.3f} [{vs['accuracy_ci95'][0]:+.3f}, "
                                 f"{vs['accuracy_ci95'][1]:+.3f}] | {vs['mcnemar_p']:.3g} | "
                                 f"{'yes' if vs['non_inferiority']['non_inferior'] else 'no'} |")
        versus = [(name, r["vs_first_sieve"]) for name, r in res["rows"].items() if "vs_first_sieve" in r]
        if versus:
            lines += ["", "Each sieve against the first on the same questions:", "",
                      "| sieve | against | Δ accuracy [95 % CI] | right only with it / only with the other | "
                      "McNemar p | non-inferior at δ |", "|---|---|---|---|---|---|"]
            for name, vs in versus:
                lines.append(f"| {name} | {vs['against']} | {vs['accuracy_diff']:+.3f} [{vs['accuracy_ci95'][0]:+.3f}, "
                             f"{vs['accuracy_ci95'][1]:+.3f}] | {vs['a_only']} / {vs['b_only']} | {vs['mcnemar_p']:.3g} | "
                             f"{'yes' if vs['non_inferiority']['non_inferior'] else 'no'} |")
        lines += ["", "Dev (best plain chosen here): " + "; ".join(
            f"{name} {r['accuracy']:.3f} at {r['prompt_tokens']:.0f} tokens" for name, r in res["dev_plain"].items()),
            ""]
    (out_dir / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


class SieveAnswersStudy:
    Config = SieveAnswersConfig

    def run(self, config: SieveAnswersConfig, out_dir: Path, console) -> dict:
        from ragsieve.models import load_local_llm
        from ragsieve.prompts.builder import PromptBuilder
        from studies.common import write_json
        from studies.prune import public, write_outcomes

        out_dir.mkdir(parents=True, exist_ok=True)
        llm = load_local_llm(config.llm)
        builder = PromptBuilder(llm, None, config.max_prompt_tokens)
        memo = MemoScores()
        results: dict[str, Any] = {}
        for setting in config.settings:
            result = run_setting(setting, config, out_dir, llm, builder, memo)
            write_outcomes(out_dir, setting, result["rows"])
            results[setting] = public(result)
            write_json(out_dir / "metrics.json", results)
            write_report(out_dir, results, config)
        if not results:
            raise RagsieveError("no setting to run")
        return results
