"""Sentence pruning against plain retrieval, by the LLM's answers (issue #61): ``experiments/prune.yaml``.

Per dataset (NQ-oracle and HotpotQA, the questions and splits ``ragsieve fit`` refits use, so no question that
trained ``embedded:base`` is held out here), over the same hybrid index:

* the retriever's top k (plain, k in ``ks``) and the base reranker's top k (the shipped default is its top 1);
* the base reranker's top k pruned to the sentences scoring at least a quantile of the **dev** sentence scores
  (zero-shot ``title: sentence`` with the same reranker: what :class:`~ragsieve.prune.SentencePruner` does);
* the gold sentences (NQ: the gold passage's sentences holding an answer; HotpotQA: the supporting facts),
  the ceiling.

Each row's test accuracy (Wilson 95 %), mean prompt tokens, and against the best plain configuration (chosen
on dev): exact McNemar, the accuracy difference and the relative prompt-token change with paired-bootstrap
intervals over questions. The LLM's answers are cached per prompt (the committed fit records are read too, so
plain and default prompts are not asked again) and recorded text-free under ``out_dir/records``; sentence and
candidate scores likewise: a rerun, or one after ``kill -9``, asks only what is missing.
"""

from __future__ import annotations

import gzip
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER

log = logging.getLogger(__name__)


class PruneStudyConfig(StrictConfig):
    datasets: list[Literal["nq", "hotpotqa"]] = ["nq", "hotpotqa"]
    llm: str = "embedded:smollm2-135m-instruct"
    reranker: str = "embedded:base"
    # the sentence scorer (a spec); None: the reranker, zero-shot on (query, title: sentence). ``prune-head``: the
    # keep head on the reranker's forward (experiments/prune_head.yaml trains it)
    pruner: str | None = None
    encoder: str = DEFAULT_ENCODER  # the index's (and HotpotQA's chunking's), as bench/fit.py builds it
    candidates: int = Field(20, ge=1)
    # passages per prompt: NQ questions are answered from one passage (top-3 halves SmolLM2's accuracy), HotpotQA
    # questions need two
    ks: dict[str, list[int]] = {"nq": [1, 2], "hotpotqa": [1, 2, 3]}
    # the k of the pruned rows (default: every k); fewer saves answers when only the default's top 1 matters
    prune_ks: dict[str, list[int]] | None = None
    prune_quantiles: list[float] = [0.75, 0.9]
    prune_max_sentences: list[int] = [1, 2]
    # the refits' splits (bench/fit.py): NQ 241 / 326 / 519, HotpotQA 102 / 111 / 304
    splits: dict[str, dict[str, float]] = {"nq": {"train": 0.2, "dev": 0.3, "test": 0.5},
                                           "hotpotqa": {"train": 0.2, "dev": 0.18, "test": 0.62}}
    # answers the fits already recorded (read only): their plain / reranked prompts are free here
    fit_records: dict[str, str] = {"nq": "results/fit/nq/records", "hotpotqa": "results/fit/hotpotqa/records"}
    max_prompt_tokens: int = 1024
    max_new_tokens: int = 16
    batch_size: int = 8
    n_boot: int = 2000
    alpha: float = Field(0.05, gt=0, lt=1)  # the McNemar tests reported on test
    # "as good as" (issue #70): the frugal choice on dev and the shipping rule on test need non-inferiority at this
    # margin (the paired difference's 95 % lower bound above -margin), as fit's do-no-harm guard does
    margin: float = Field(0.02, gt=0, lt=1)
    seed: int = 0
    data_dir: str | None = None
    max_questions: int = Field(0, ge=0, description="0: every question (a smoke run: fewer)")
    # write the prune level chosen on this dataset's dev into the shipped default sieve (embedded:default,
    # fitted on NQ), unless fit's do-no-harm rule says no on a test set (not shown non-inferior at the margin and
    # below the best plain configuration at the point estimate)
    ship_to: str | None = None
    ship_from: Literal["nq", "hotpotqa"] = "nq"
    # another prune study's out_dir: ship only if this study's default does no harm (the same rule) against that
    # study's shipped default on every test set, from no more prompt tokens (what replacing it must show)
    compare_with: str | None = None


#: keys of a study's results that are decisions, not datasets
DECISIONS = ("shipped", "compared")


def study_work(dataset: str) -> Path:
    """The prune studies' cache folder for ``dataset`` (its corpus file, answers, index inputs), made if absent."""
    work = Path.home() / ".cache" / "ragsieve" / "prune" / dataset
    work.mkdir(parents=True, exist_ok=True)
    return work


def retrieved(questions, passages, index_name: str, config: PruneStudyConfig, k: int) -> dict[str, list]:
    """Question id → the top ``k`` passages the study's hybrid index over ``passages`` retrieves, best first."""
    from ragsieve.retrieve.cached import build_or_load_index

    index, _ = build_or_load_index(index_name, passages, "hybrid", config.encoder)
    hits = index.search_batch([q.text for q in questions], k=k)
    return {q.id: [h.passage for h in row] for q, row in zip(questions, hits)}


def _questions(dataset: str, config: PruneStudyConfig, work: Path):
    """(questions, passages, index name): the fit's question set for ``dataset`` (see bench/fit.py)."""
    from ragsieve.benchmarks.mining import trained_question_ids
    from ragsieve.registry import reranker_folder

    trained = trained_question_ids({"nq": "nq-oracle", "hotpotqa": "hotpotqa-distractor"}[dataset],
                                   reranker_folder(config.reranker, "reranker"))
    if dataset == "nq":
        from ragsieve.data import held_out_questions, load_dataset

        ds = load_dataset("nq-oracle", data_dir=config.data_dir)
        skip = {q.id for q in held_out_questions(ds.questions, 0.2, 0)} | trained
        return [q for q in ds.questions if q.id not in skip], ds.passages, "nq-oracle", ds
    from ragsieve.benchmarks.mining import hotpot_1517
    from ragsieve.retrieve import ChunkConfig, read_corpus

    ds = hotpot_1517(config.data_dir)
    corpus = work / "passages.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n"
                              for p in ds.passages))
    passages = read_corpus([corpus], ChunkConfig(tokenizer=config.encoder))
    return [q for q in ds.questions if q.id not in trained], passages, ds.name, ds


def hotpot_rows(data_dir: str | None, wanted: set[str] | None = None):
    """The HotpotQA distractor rows (``hotpot_dev_distractor_1517``) as the file holds them, only ``wanted`` ids
    when given."""
    from ragsieve.benchmarks.mining import HOTPOT_1517
    from ragsieve.data.loaders import default_data_dir

    with gzip.open(Path(data_dir or default_data_dir()) / HOTPOT_1517, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if wanted is None or row["_id"] in wanted:
                yield row


def _gold_sentences(dataset: str, questions, ds, config: PruneStudyConfig) -> dict[str, list]:
    """Question id → the gold sentences as passages (title, sentence): the ceiling row's context."""
    from ragsieve.data.records import Passage
    from ragsieve.eval.qa import contains_answer
    from ragsieve.prune import split_sentences

    out: dict[str, list] = {}
    if dataset == "nq":
        pool = {p.id: p for p in ds.passages}
        for q in questions:
            gold = [pool[i] for i in q.gold_passage_ids if i in pool]
            picked = [Passage(f"{p.id}#{a}", p.text[a:b], p.title) for p in gold for a, b in split_sentences(p.text)
                      if contains_answer(p.text[a:b], q.answers)]
            out[q.id] = picked or gold
        return out
    for row in hotpot_rows(config.data_dir, {q.id for q in questions}):
        context = {title: sents for title, sents in row["context"]}
        out[row["_id"]] = [Passage(f"{t}#{i}", context[t][i].strip(), t) for t, i in row["supporting_facts"]
                       if t in context and i < len(context[t])]
    return out


def _gold_paragraphs(dataset: str, questions, ds, config: PruneStudyConfig) -> dict[str, list[tuple[Any, list]]]:
    """Question id → [(gold passage, its gold sentences as character spans)]: NQ's gold passage and the sentences
    of it that hold an answer; HotpotQA's supporting paragraphs (as the corpus joins their sentences) and the
    supporting-fact sentences."""
    from ragsieve.data.records import Passage
    from ragsieve.eval.qa import contains_answer
    from ragsieve.prune import split_sentences

    out: dict[str, list] = {}
    if dataset == "nq":
        pool = {p.id: p for p in ds.passages}
        for q in questions:
            golds = [pool[i] for i in q.gold_passage_ids if i in pool]
            out[q.id] = [(p, [s for s in split_sentences(p.text) if contains_answer(p.text[s[0]:s[1]], q.answers)])
                         for p in golds]
            out[q.id] = [(p, spans) for p, spans in out[q.id] if spans]
        return out
    for row in hotpot_rows(config.data_dir, {q.id for q in questions}):
        facts: dict[str, set[int]] = {}
        for title, i in row["supporting_facts"]:
            facts.setdefault(title, set()).add(i)
        paragraphs = []
        for title, sents in row["context"]:
            if title not in facts:
                continue
            joined = "".join(sents)
            lead = len(joined) - len(joined.lstrip())  # hotpot_1517 strips the joined paragraph
            spans, pos = [], 0
            for i, sent in enumerate(sents):
                if i in facts[title] and sent.strip():
                    start = joined.index(sent, pos) + (len(sent) - len(sent.lstrip())) - lead
                    spans.append((start, start + len(sent.strip())))
                pos += len(sent)
            paragraphs.append((Passage(title, joined.strip(), title), spans))
        out[row["_id"]] = [(p, s) for p, s in paragraphs if s]
    return out


def gold_recall(gold, layout, keeps) -> tuple[float, float]:
    """(share of the gold sentences kept — a gold sentence counts when kept spans cover half of it —, share of
    the passages' characters kept) of one question: ``gold`` its (passage, gold spans), ``keeps`` a keep mask
    per passage of ``layout``."""
    hit = total = kept_chars = all_chars = 0
    for (_, gold_spans), spans, keep in zip(gold, layout.spans, keeps):
        kept = [s for s, k in zip(spans, keep) if k]
        for a, b in gold_spans:
            hit += sum(max(0, min(b, y) - max(a, x)) for x, y in kept) >= (b - a) / 2
            total += 1
        kept_chars += sum(y - x for x, y in kept)
        all_chars += sum(y - x for x, y in spans)
    return hit / max(total, 1), kept_chars / max(all_chars, 1)


def sentence_recall(dataset: str, questions, ds, config: PruneStudyConfig, pruner, levels, store,
                    ) -> dict[str, Any]:
    """Recall of the gold sentences inside the gold passages at each prune level, against how much of those
    passages is kept (characters): the zero-shot scorer's curve, per question with a bootstrap over questions.
    A gold sentence counts as kept when kept spans cover at least half of it."""
    from ragsieve.eval.stats import bootstrap_metric

    gold = _gold_paragraphs(dataset, questions, ds, config)
    asked = [q for q in questions if gold.get(q.id)]
    scored = []
    for q in asked:
        passages = [p for p, _ in gold[q.id]]
        layout = pruner.layout(q.text, passages)
        ids = [p.id for p in layout.pairs]
        got = store.lookup(q.id, ids) if store is not None else None
        if got is None:
            got = [float(x) for x in pruner.score(layout)]
            if store is not None:
                store.add([(q.id, i, x) for i, x in zip(ids, got)])
        scored.append((q, layout, np.asarray(got, float)))
    out: dict[str, Any] = {"n_questions": len(asked), "levels": {}}
    for t, n, name in [(float("-inf"), None, "whole")] + list(levels):
        recall, kept_share = [], []
        for q, layout, scores in scored:
            cut = pruner.at(t, n).decide(layout, scores)
            hit, kept = gold_recall(gold[q.id], layout, [c.keep for c in cut])
            recall.append(hit)
            kept_share.append(kept)
        r, lo, hi = bootstrap_metric(np.mean, np.asarray(recall), n_boot=config.n_boot, seed=config.seed)
        c, clo, chi = bootstrap_metric(np.mean, np.asarray(kept_share), n_boot=config.n_boot, seed=config.seed)
        out["levels"][name] = {"recall": r, "recall_ci95": [lo, hi], "kept_share": c, "kept_share_ci95": [clo, chi]}
    return out


def _row(name: str, correct, tokens) -> dict[str, Any]:
    from ragsieve.eval.classification import accuracy_interval

    hits, n = int(np.sum(correct)), len(correct)
    return {"name": name, "n": n, "accuracy": hits / n, "ci95": list(accuracy_interval(hits, n)),
            "prompt_tokens": float(np.mean(tokens)), "correct": [int(x) for x in correct],
            "tokens_each": [int(t) for t in tokens]}


def _vs(row: dict, base: dict, config: PruneStudyConfig) -> dict[str, Any]:
    from ragsieve.eval.stats import non_inferior, relative_mean_change
    from ragsieve.fit.decide import compare

    acc = compare(row["correct"], base["correct"], n_boot=config.n_boot, seed=config.seed)
    tokens = relative_mean_change(row["tokens_each"], base["tokens_each"], n_boot=config.n_boot, seed=config.seed)
    margin_test = non_inferior(row["correct"], base["correct"], config.margin)
    return {"accuracy_diff": acc["diff"], "accuracy_ci95": acc["ci95"], "mcnemar_p": acc["p_value"],
            "a_only": acc["a_only"], "b_only": acc["b_only"], "measurably_worse": acc["measurably_worse"],
            # shipping and replacing read this: "not measurably worse" is not "as good"
            "non_inferiority": margin_test.to_dict(),
            "not_shown_and_below": not margin_test.shown and margin_test.diff < 0,
            "prompt_tokens_change": tokens}


def _ranked_candidates(dataset: str, asked, candidates, reranker, store) -> dict[str, list[tuple[int, float]]]:
    """Question id → (candidate index, reranker score), best first; scores recorded in ``store``."""
    rows: dict[str, list[tuple[int, float]]] = {}
    for n, q in enumerate(asked):
        ids = [p.id for p in candidates[q.id]]
        scores = store.lookup(q.id, ids)
        if scores is None:
            scores = [float(s) for s in reranker.score(q.text, candidates[q.id])]
            store.add([(q.id, i, s) for i, s in zip(ids, scores)])
        order = np.argsort(-np.asarray(scores), kind="stable")
        rows[q.id] = [(int(i), float(scores[i])) for i in order]
        if n % 50 == 0:
            log.info("prune %s: reranked %d / %d", dataset, n, len(asked))
    return rows


def _gold_row(dataset: str, test, ds, config: PruneStudyConfig, builder, cache) -> dict[str, Any]:
    """The ceiling: the LLM answering from the gold sentences alone."""
    from ragsieve.eval.qa import contains_answer
    from ragsieve.prompts import first_line

    gold = _gold_sentences(dataset, test, ds, config)
    texts = [builder.with_context(q.text, gold[q.id]).text for q in test]
    answers = cache.answers(texts)
    correct = [int(contains_answer(first_line(a), q.answers)) for (a, _), q in zip(answers, test)]
    return _row("gold sentences", correct, [builder.prompt_tokens(t) for t in texts])


def run_dataset(dataset: str, config: PruneStudyConfig, out_dir: Path, llm, builder,
                shipped: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every row of the study on ``dataset``'s test questions (thresholds from its dev questions).

    ``shipped``: the prune level another dataset's dev chose for the shipped default (its ``default_prune_choice``),
    tested here as the row ``SHIPPED_ROW`` — what a user of the default gets on this data."""
    from ragsieve.data.qa_files import split_questions
    from ragsieve.data.score_records import PairScores
    from ragsieve.fit.config import SelectConfig

    from ragsieve.fit.decide import choose
    from ragsieve.fit.select import RETRIEVER, AnswerCache, Choice, Selection
    from ragsieve.prune import SentencePruner
    from ragsieve.registry import load_reranker, reranker_scores_key

    work = study_work(dataset)
    records = out_dir / "records" / dataset
    records.mkdir(parents=True, exist_ok=True)
    questions, passages, index_name, ds = _questions(dataset, config, work)
    if config.max_questions:
        questions = questions[: config.max_questions]
    splits = split_questions(questions, config.splits[dataset], config.seed)
    dev, test = splits["dev"], splits["test"]
    log.info("prune %s: %d questions, dev %d, test %d; index over %d passages", dataset, len(questions), len(dev),
             len(test), len(passages))
    asked = dev + test
    candidates = retrieved(asked, passages, index_name, config, config.candidates)

    reranker = load_reranker(config.reranker)
    key = reranker_scores_key(config.reranker)
    scorer = load_reranker(config.pruner) if config.pruner else reranker
    sentence_key = reranker_scores_key(config.pruner) if config.pruner else key
    cand_store = PairScores(records / "scores", "candidates", {"scoring_key": key})
    sent_store = PairScores(records / "sentences", "sentences",
                            {"scoring_key": sentence_key, "unit": "title: sentence"})
    cache = AnswerCache(work / "answers.sqlite", llm, builder, max_new_tokens=config.max_new_tokens,
                        batch_size=config.batch_size, records=records / "answers.jsonl")
    fit_answers = Path(config.fit_records.get(dataset, "")) / "answers.jsonl"
    cache.import_records(fit_answers)
    ks = config.ks[dataset]
    select = SelectConfig(ks=ks, plain_ks=ks, prune_quantiles=config.prune_quantiles,
                          prune_max_sentences=config.prune_max_sentences, race=False)
    selection = Selection(builder, cache, candidates, select, pruner=SentencePruner(scorer),
                          sentence_store=sent_store,
                          progress=lambda done, total: log.info("prune %s: answers %d / %d", dataset, done, total))
    selection.add_ranking(RETRIEVER, asked)
    selection.rankings[config.reranker] = _ranked_candidates(dataset, asked, candidates, reranker, cand_store)
    levels = selection.prune_levels([config.reranker], dev)
    log.info("prune %s: thresholds from dev sentence scores %s", dataset, levels)

    plain = selection.plain(ks)
    dev_plain = selection.evaluate(plain, dev)
    best_plain = max(dev_plain, key=lambda r: (r["correct_count"], -r["prompt_tokens"]))["choice"]
    # the shipped default's configuration (the base reranker's top 1) and its prune threshold chosen on dev as fit
    # chooses with objective frugal: the fewest prompt tokens shown non-inferior at the margin
    default = Choice(1, config.reranker)
    default_pruned = [replace(default, prune_threshold=t, prune_max=n, prune=name) for t, n, name in levels]
    dev_default = selection.evaluate([default] + default_pruned, dev)
    chosen = choose(dev_default, "frugal", margin=config.margin)
    reranked = [Choice(k, config.reranker) for k in ks]
    prune_ks = (config.prune_ks or {}).get(dataset, ks)
    pruned = [Choice(k, config.reranker, prune_threshold=t, prune_max=n, prune=name)
              for k in prune_ks for t, n, name in levels]
    choices = [Choice(0)] + plain + reranked + pruned
    if shipped is not None:
        choices.append(Choice(1, config.reranker, prune_threshold=shipped["prune_threshold"],
                              prune_max=shipped["prune_max"], prune=f"as shipped ({shipped['prune']})"))
    rows = {}
    for choice, row in zip(choices, selection.evaluate(choices, test)):
        rows[choice.name] = _row(choice.name, row["correct"], row["tokens_each"])
        rows[choice.name]["choice"] = choice.to_dict()
    rows["gold sentences"] = _gold_row(dataset, test, ds, config, builder, cache)
    base = rows[best_plain.name]
    for row in rows.values():
        if row is not base:
            row["vs_best_plain"] = _vs(row, base, config)
    cache.close()
    recall = sentence_recall(dataset, test, ds, config, SentencePruner(scorer), levels,
                             PairScores(records / "gold-sentences", "sentences", {"scoring_key": sentence_key}))
    chosen_row = rows.get(chosen["name"]) if chosen["prune"] != "off" else rows[default.name]
    return {"n_questions": {k: len(v) for k, v in splits.items()}, "n_test": len(test),
            "best_plain": best_plain.name, "best_plain_from": "dev accuracy (ties: fewer tokens)",
            "default": default.name,
            "default_prune_choice": {"chosen": chosen["name"], "prune": chosen["prune"],
                                     "prune_threshold": chosen["prune_threshold"], "prune_max": chosen["prune_max"],
                                     "objective": "frugal",
                                     "alpha": config.alpha,
                                     "dev": [{k: r[k] for k in ("name", "n", "accuracy", "ci95", "prompt_tokens")}
                                             for r in dev_default]},
            "prune_levels": [{"name": name, "max_sentences": n, "raw": t,
                              "unit": None if t is None else float(scorer.unit_scores([t])[0])}
                             for t, n, name in levels],
            "dev_plain": {r["name"]: {"accuracy": r["accuracy"], "n": r["n"]} for r in dev_plain},
            "default_pruned_on_test": chosen_row["name"],
            "gold_sentence_recall": recall,
            "rows": rows}


def public(result: dict[str, Any]) -> dict[str, Any]:
    """The result without per-question outcomes (those stay in ``rows.jsonl``)."""
    rows = {name: {k: v for k, v in r.items() if k not in ("correct", "tokens_each")}
            for name, r in result["rows"].items()}
    return {**result, "rows": rows}


def config_path(config: PruneStudyConfig) -> str:
    """The experiment file that ran this configuration (the report names it)."""
    return "experiments/prune_with_head.yaml" if config.pruner else "experiments/prune.yaml"


def write_report(out_dir: Path, results: dict[str, dict[str, Any]], config: PruneStudyConfig) -> None:
    scorer = (f"`{config.pruner}`" if config.pruner
              else f"zero-shot `{config.reranker}` on (query, title: sentence)")
    lines = ["# Sentence pruning against plain retrieval (issue #61)", "",
             f"Generated by `ragsieve run {config_path(config)}` (`studies/prune.py`); numbers from "
             f"`metrics.json`. Sentences scored by {scorer}. "
             "SmolLM2-135M-Instruct answers; containment accuracy; prompt tokens in its tokenizer. "
             "Each row against the best plain configuration (the retriever's top k best on dev): accuracy "
             "difference and relative prompt-token change with paired-bootstrap 95 % intervals over questions, "
             "exact McNemar p.", ""]
    for dataset, res in results.items():
        if dataset in DECISIONS:
            continue
        lines += [f"## {dataset}: test n = {res['n_test']}, best plain = {res['best_plain']}", "",
                  "| configuration | accuracy [95 % CI] | prompt tokens | Δ accuracy vs best plain [95 % CI] | "
                  "McNemar p | Δ tokens vs best plain [95 % CI] |", "|---|---|---|---|---|---|"]
        for name, r in res["rows"].items():
            vs = r.get("vs_best_plain")
            acc = f"{r['accuracy']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"
            if vs:
                t = vs["prompt_tokens_change"]
                d = (f"{vs['accuracy_diff']:+.3f} [{vs['accuracy_ci95'][0]:+.3f}, {vs['accuracy_ci95'][1]:+.3f}] | "
                     f"{vs['mcnemar_p']:.3g} | {t['change']:+.1%} [{t['ci95'][0]:+.1%}, {t['ci95'][1]:+.1%}]")
            else:
                d = "(baseline) | | "
            lines.append(f"| {name} | {acc} | {r['prompt_tokens']:.0f} | {d} |")
        rec = res.get("gold_sentence_recall")
        if rec:
            lines += ["", f"Gold-sentence recall inside the gold passages ({scorer}, "
                      f"{rec['n_questions']} test questions; a gold sentence is kept when kept spans cover half of it):",
                      "", "| level | recall [95 % CI] | share of the passage kept [95 % CI] |", "|---|---|---|"]
            for name, r in rec["levels"].items():
                lines.append(f"| {name} | {r['recall']:.3f} [{r['recall_ci95'][0]:.3f}, {r['recall_ci95'][1]:.3f}] | "
                             f"{r['kept_share']:.3f} [{r['kept_share_ci95'][0]:.3f}, {r['kept_share_ci95'][1]:.3f}] |")
        pc = res["default_prune_choice"]
        lines += ["", f"The default's prune level chosen on dev (n = {pc['dev'][0]['n']}, objective frugal): "
                  f"**{pc['chosen']}**. Dev rows: " + "; ".join(
                      f"{r['name']} {r['accuracy']:.3f} at {r['prompt_tokens']:.0f} tokens" for r in pc["dev"])]
        lines += ["", "Prune levels: bestN keeps each passage's N best sentences; qX keeps the sentences at or above "
                  "the X quantile of the dev sentence scores (raw, and on the [0, 1] scale): " +
                  ", ".join(f"{t['name']} = {t['raw']:.2f} ({t['unit']:.3f})" for t in res["prune_levels"]
                            if t["raw"] is not None), ""]
    compared = results.get("compared")
    if compared:
        lines += [f"## Against the default of `{compared['against']}`", "",
                  "This study's default against that study's shipped default on the same test questions (paired); "
                  f"it replaces it only when it does no harm on any set (shown non-inferior at the margin, or at or above "
                  f"it at the point estimate) from no more prompt tokens: "
                  f"**{'replaces' if compared['replaces'] else 'does not replace'}**.", "",
                  "| dataset | this study | that study | Δ accuracy [95 % CI] | McNemar p | Δ prompt tokens [95 % CI] |",
                  "|---|---|---|---|---|---|"]
        for dataset, c in compared["datasets"].items():
            tc = c["prompt_tokens_change"]
            lines.append(f"| {dataset} | {c['ours']} | {c['theirs']} | {c['accuracy_diff']:+.3f} "
                         f"[{c['accuracy_ci95'][0]:+.3f}, {c['accuracy_ci95'][1]:+.3f}] | {c['mcnemar_p']:.3g} | "
                         f"{tc['change']:+.1%} [{tc['ci95'][0]:+.1%}, {tc['ci95'][1]:+.1%}] |")
        lines.append("")
    shipped = results.get("shipped")
    if shipped:
        lines += ["## The shipped default", "",
                  f"`embedded:default` (the base reranker's top 1 of 20) with the prune level chosen on "
                  f"{shipped['chosen_on']} dev, **{shipped['chosen_on_dev']}** (raw threshold "
                  f"{shipped['prune_threshold'] if shipped['prune_threshold'] is not None else 'none'}, "
                  f"sentence cap {shipped['prune_max'] or 'none'}) → "
                  f"{'shipped' if shipped['shipped'] else 'not shipped'}"
                  + (" (below the best plain configuration on a test set and not shown non-inferior)"
                     if shipped["measurably_worse_than_best_plain"] else "") + ". On each test set:", "",
                  "| dataset | n | accuracy [95 % CI] | best plain | Δ accuracy [95 % CI] | McNemar p | "
                  "Δ prompt tokens [95 % CI] |", "|---|---|---|---|---|---|---|"]
        for dataset, t in shipped["test"].items():
            vs = t["vs_best_plain"]
            tc = vs["prompt_tokens_change"]
            lines.append(f"| {dataset} | {t['n']} | {t['accuracy']:.3f} [{t['ci95'][0]:.3f}, {t['ci95'][1]:.3f}] | "
                         f"{t['best_plain']} | {vs['accuracy_diff']:+.3f} [{vs['accuracy_ci95'][0]:+.3f}, "
                         f"{vs['accuracy_ci95'][1]:+.3f}] | {vs['mcnemar_p']:.3g} | "
                         f"{tc['change']:+.1%} [{tc['ci95'][0]:+.1%}, {tc['ci95'][1]:+.1%}] |")
        lines.append("")
    (out_dir / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def shipped_rows(results: dict[str, dict[str, Any]], ship_from: str) -> dict[str, dict[str, Any]]:
    """Per dataset, the test row of the shipped default: on ``ship_from`` the level its dev chose, elsewhere the row
    that tested that same level (``as shipped``)."""
    out = {}
    for dataset, res in results.items():
        if dataset in DECISIONS:
            continue
        if dataset == ship_from:
            out[dataset] = res["rows"][res["default_pruned_on_test"]]
        else:
            out.update({dataset: r for name, r in res["rows"].items() if "as shipped" in name})
    return out


def write_outcomes(out_dir: Path, dataset: str, rows: dict[str, dict[str, Any]]) -> None:
    """Every row's per-question outcomes (``rows_<dataset>.jsonl``: name, right / wrong, prompt tokens), what the
    paired comparisons of a later study read back (:func:`_outcomes`)."""
    with open(Path(out_dir) / f"rows_{dataset}.jsonl", "w", encoding="utf-8") as f:
        for r in rows.values():
            f.write(json.dumps({k: r[k] for k in ("name", "correct", "tokens_each")}) + "\n")


def _outcomes(out_dir: Path, dataset: str, name: str) -> dict[str, Any]:
    """A row's per-question outcomes as a study wrote them (``rows_<dataset>.jsonl``)."""
    with open(Path(out_dir) / f"rows_{dataset}.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["name"] == name:
                return row
    raise RagsieveError(f"{out_dir}: no row '{name}' in rows_{dataset}.jsonl")


def compare_with(results: dict[str, dict[str, Any]], config: PruneStudyConfig, out_dir: Path) -> dict[str, Any]:
    """This study's default (its shipped rows) against ``config.compare_with``'s shipped default on the same test
    questions, per dataset: paired accuracy difference (bootstrap, McNemar, the margin verdict) and prompt-token
    change. ``replaces``: no harm on any set (:func:`_harms`), and no more prompt tokens on any (point estimate)."""
    other_dir = Path(config.compare_with)
    other = json.loads((other_dir / "metrics.json").read_text(encoding="utf-8"))
    theirs = shipped_rows(other, other["shipped"]["chosen_on"])
    out: dict[str, Any] = {"against": str(other_dir), "datasets": {}}
    for dataset, row in shipped_rows(results, config.ship_from).items():
        if dataset not in theirs:
            continue
        ours, their = _outcomes(out_dir, dataset, row["name"]), _outcomes(other_dir, dataset, theirs[dataset]["name"])
        if len(ours["correct"]) != len(their["correct"]):
            raise RagsieveError(f"{dataset}: the two studies tested different questions")
        out["datasets"][dataset] = {"ours": row["name"], "theirs": theirs[dataset]["name"], **_vs(ours, their, config)}
    compared = out["datasets"].values()
    out["replaces"] = bool(compared) and all(not _harms(c) and c["prompt_tokens_change"]["change"] <= 0
                                             for c in compared)
    return out


def _harms(versus: dict[str, Any]) -> bool:
    """fit's do-no-harm rule (ragsieve.fit.decide.do_no_harm) on a study's comparison: harm unless shown
    non-inferior at the margin or at or above the other at the point estimate. A comparison written before the
    margin existed falls back to the rule it was decided by (measurably worse)."""
    return versus.get("not_shown_and_below", versus["measurably_worse"])


def ship_default(results: dict[str, dict[str, Any]], ship_from: str, folder: str | Path,
                 pruner: str | None = None, allowed: bool = True, source: str = "results/prune/metrics.json"
                 ) -> dict[str, Any]:
    """The default sieve in ``folder`` with the prune level ``ship_from``'s dev chose, recorded with the test
    comparison on every dataset, unless it does harm against the best plain configuration (:func:`_harms`) on any of
    them or ``allowed`` is False (then the sieve is left as it is). Returns what was decided."""
    from ragsieve.pipeline.sieve_config import SIEVE_FILE, read_sieve_config

    choice = results[ship_from]["default_prune_choice"]
    tested = {d: {"row": r["name"], "best_plain": results[d]["best_plain"],
                  **{k: r[k] for k in ("n", "accuracy", "ci95", "prompt_tokens")}, "vs_best_plain": r.get("vs_best_plain")}
              for d, r in shipped_rows(results, ship_from).items()}
    harm = any(t["vs_best_plain"] and _harms(t["vs_best_plain"]) for t in tested.values())
    decision = {"chosen_on_dev": choice["chosen"], "chosen_on": ship_from, "prune_threshold": choice["prune_threshold"],
                "prune_max": choice["prune_max"], "measurably_worse_than_best_plain": harm,
                "shipped": allowed and not harm and choice["prune"] != "off", "test": tested,
                "pruner": pruner, "source": source}
    if decision["shipped"]:
        config = read_sieve_config(folder)
        metrics = {**config.metrics, "prune": decision}
        updated = config.model_copy(update={"format_version": 3, "prune_threshold": choice["prune_threshold"],
                                            "prune_max_sentences": choice["prune_max"], "pruner": pruner,
                                            "metrics": metrics})
        path = Path(folder) / SIEVE_FILE
        path.write_text(updated.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return decision


class PruneStudy:
    Config = PruneStudyConfig

    def run(self, config: PruneStudyConfig, out_dir: Path, console) -> dict:
        from ragsieve.models import load_local_llm
        from ragsieve.prompts.builder import PromptBuilder
        from studies.common import write_json

        out_dir.mkdir(parents=True, exist_ok=True)
        llm = load_local_llm(config.llm)
        builder = PromptBuilder(llm, None, config.max_prompt_tokens)
        results = {}
        shipped = None
        # the dataset whose dev chooses the shipped level first: every other one tests that level as shipped
        ordered = sorted(config.datasets, key=lambda d: d != config.ship_from) if config.ship_to else config.datasets
        for dataset in ordered:
            result = run_dataset(dataset, config, out_dir, llm, builder, shipped)
            if config.ship_to and dataset == config.ship_from and result["default_prune_choice"]["prune"] != "off":
                shipped = result["default_prune_choice"]
            write_outcomes(out_dir, dataset, result["rows"])
            results[dataset] = public(result)
            write_json(out_dir / "metrics.json", results)
            write_report(out_dir, results, config)
        if config.ship_to and config.ship_from in results:
            compared = compare_with(results, config, out_dir) if config.compare_with else None
            if compared is not None:
                results["compared"] = compared
            results["shipped"] = ship_default(results, config.ship_from, config.ship_to, config.pruner,
                                              allowed=compared is None or compared["replaces"],
                                              source=str(out_dir / "metrics.json"))
            write_json(out_dir / "metrics.json", results)
            write_report(out_dir, results, config)
        return results
