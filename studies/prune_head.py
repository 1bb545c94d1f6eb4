"""A keep head on the shipped cross-encoder's forward against zero-shot sentence scoring (issue #61):
``experiments/prune_head.yaml``.

Trains :class:`~ragsieve.prune.head.SentenceKeepHead`'s linear layer on sentence labels of training questions
only — HotpotQA supporting facts (the supporting paragraphs and one distractor paragraph per question), the NQ
gold-passage sentences holding an answer, FEVER evidence sentences (a window of their Wikipedia article) — with
every question the prune study (``experiments/prune.yaml``) tests or tunes on, and every question another study
holds out (:func:`~ragsieve.data.held_out_questions`), left out. The encoder stays frozen, so the reranker's
logit and its nDCG are those of today by construction (the study checks the weights it read are the shipped
ones).

Evaluated on the prune study's test questions (NQ, HotpotQA): recall of the gold sentences inside the gold
passages, head against zero-shot ``(query, title: sentence)`` scores with the same reranker, **at equal
compression**: in each passage the head keeps exactly as many sentences as the zero-shot pruner kept at that
level (its best N; the dev quantile thresholds of the prune study). Paired bootstrap over questions.
"""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from ragsieve.config import StrictConfig
from ragsieve.prune.training import KeepExample, KeepHeadTrainingConfig

log = logging.getLogger(__name__)


class PruneHeadStudyConfig(StrictConfig):
    train_datasets: list[Literal["nq", "hotpotqa", "fever"]] = ["hotpotqa", "nq", "fever"]
    eval_datasets: list[Literal["nq", "hotpotqa"]] = ["nq", "hotpotqa"]
    max_train_questions: int = Field(1200, ge=1)  # per training dataset
    hotpot_negatives: int = Field(1, ge=0)  # distractor paragraphs per HotpotQA question (all sentences: drop)
    # NQ passages the prune study's index retrieves for a training question besides its gold one (their sentences
    # that hold an answer: keep; the rest: drop), so a head sees the irrelevant passages it must rate low
    nq_negatives: int = Field(0, ge=0)
    fever_window: int = Field(3, ge=0)  # sentences of the article on each side of the evidence
    branch_layers: int = Field(2, ge=0)  # the cross-encoder's top layers the keep branch copies and trains
    training: KeepHeadTrainingConfig = KeepHeadTrainingConfig()
    max_length: int = Field(512, ge=32)
    prune_results: str = "results/prune"  # the prune study: its splits' test questions, levels, zero-shot scores
    n_boot: int = 2000
    seed: int = 0
    data_dir: str | None = None
    # write the head beside the shipped cross-encoder when it beats zero-shot recall on every eval set and level
    ship_to: str | None = None


def _spans_of(sentences: list[str]) -> tuple[str, list[tuple[int, int]]]:
    """Sentences joined by one space, and each one's character span in the join."""
    text, spans = "", []
    for sent in sentences:
        sent = sent.strip()
        if not sent:
            continue
        if text:
            text += " "
        spans.append((len(text), len(text) + len(sent)))
        text += sent
    return text, spans


def _excluded(dataset: str, config: PruneHeadStudyConfig) -> set[str]:
    """Question ids the head must not train on: the prune study's dev and test, every study's held-out split."""
    from ragsieve.data import held_out_questions
    from ragsieve.data.qa_files import split_questions
    from studies.prune import PruneStudyConfig, _questions, study_work

    out: set[str] = set()
    if dataset in ("nq", "hotpotqa"):
        prune = PruneStudyConfig(data_dir=config.data_dir)
        questions, _, _, ds = _questions(dataset, prune, study_work(dataset))
        splits = split_questions(questions, prune.splits[dataset], prune.seed)
        out |= {q.id for q in splits["dev"] + splits["test"]}
        out |= {q.id for q in held_out_questions(ds.questions, 0.2, 0)}
    return out


def training_examples(dataset: str, config: PruneHeadStudyConfig) -> list[KeepExample]:
    """The keep head's training passages of ``dataset``'s training questions, a label per sentence."""
    from ragsieve.data import held_out_questions, load_dataset
    from ragsieve.data.records import Passage
    from ragsieve.eval.qa import contains_answer
    from ragsieve.prune import split_sentences

    skip = _excluded(dataset, config)
    out: list = []
    if dataset == "hotpotqa":
        from ragsieve.benchmarks.mining import hotpot_1517
        from studies.prune import hotpot_rows

        skip |= {q.id for q in held_out_questions(hotpot_1517(config.data_dir).questions, 0.2, 0)}
        rows = (row for row in hotpot_rows(config.data_dir) if row["_id"] not in skip)
        for row in itertools.islice(rows, config.max_train_questions):
            facts: dict[str, set[int]] = {}
            for title, i in row["supporting_facts"]:
                facts.setdefault(title, set()).add(i)
            negatives = 0
            for title, sents in row["context"]:
                if title not in facts:
                    if negatives >= config.hotpot_negatives:
                        continue
                    negatives += 1
                kept = [(i, s) for i, s in enumerate(sents) if s.strip()]
                text, spans = _spans_of([s for _, s in kept])
                labels = [int(i in facts.get(title, ())) for i, _ in kept]
                out.append(KeepExample(row["_id"], row["question"], Passage(title, text, title), tuple(spans),
                                       tuple(labels)))
        return out
    if dataset == "nq":
        ds = load_dataset("nq-oracle", data_dir=config.data_dir)
        pool = {p.id: p for p in ds.passages}
        asked = [q for q in ds.questions if q.id not in skip][: config.max_train_questions]
        retrieved = _nq_retrieved(asked, config) if config.nq_negatives else {}
        for q in asked:
            golds = [pool[i] for i in q.gold_passage_ids if i in pool]
            others = [p for p in retrieved.get(q.id, []) if p.id not in q.gold_passage_ids][: config.nq_negatives]
            rows = []
            for p in golds + others:
                spans = split_sentences(p.text)
                rows.append((p, spans, [int(contains_answer(p.text[a:b], q.answers)) for a, b in spans]))
            if any(any(labels) for p, _, labels in rows if p in golds):
                out += [KeepExample(q.id, q.text, p, tuple(spans), tuple(labels)) for p, spans, labels in rows]
        return out
    ds = load_dataset("fever", data_dir=config.data_dir)
    skip |= {q.id for q in held_out_questions(ds.questions, 0.2, 0)}
    pool = {p.id: p for p in ds.passages}
    n = 0
    for q in ds.questions:
        if q.id in skip or q.answers[0] not in ("SUPPORTS", "REFUTES") or not q.gold_passage_ids:
            continue
        if n >= config.max_train_questions:
            break
        docid, _, si = q.gold_passage_ids[0].rpartition(":")
        if not si.isdigit():
            continue
        evidence = {int(g.rpartition(":")[2]) for g in q.gold_passage_ids
                    if g.rpartition(":")[0] == docid and g.rpartition(":")[2].isdigit()}
        lo, hi = max(0, int(si) - config.fever_window), int(si) + config.fever_window + 1
        window = [(i, pool[f"{docid}:{i}"]) for i in range(lo, hi) if f"{docid}:{i}" in pool]
        if not any(i in evidence for i, _ in window):
            continue
        n += 1
        text, spans = _spans_of([p.text for _, p in window])
        title = window[0][1].title
        out.append(KeepExample(q.id, q.text, Passage(docid, text, title), tuple(spans),
                               tuple(int(i in evidence) for i, _ in window)))
    return out


def _nq_retrieved(questions, config: PruneHeadStudyConfig) -> dict[str, list]:
    """Question id → the passages the prune study's NQ index retrieves for it, best first (its top 10)."""
    from studies.prune import PruneStudyConfig, _questions, retrieved, study_work

    prune = PruneStudyConfig(data_dir=config.data_dir)
    _, passages, index_name, _ = _questions("nq", prune, study_work("nq"))
    return retrieved(questions, passages, index_name, prune, 10)


#: per question and level: recall and share of characters kept by zero-shot, by the head at zero-shot's sentence
#: counts, and by the head at zero-shot's characters over the test set (its threshold matched)
ROW_KEYS = ("zero_shot", "head", "zero_kept", "head_kept", "head_in_chars", "head_in_chars_kept")


def _best_n(layout, scores, counts) -> list[np.ndarray]:
    """Each gold passage cut to exactly ``counts[i]`` best sentences by ``scores`` (one per ``layout.pairs``)."""
    cut, lo = [], 0
    for i, spans in enumerate(layout.spans):
        own = scores[lo: lo + len(spans)]
        lo += len(spans)
        keep = np.zeros(len(spans), bool)
        keep[np.argsort(-own, kind="stable")[: counts[i]]] = True
        cut.append(keep)
    return cut


def evaluate(dataset: str, config: PruneHeadStudyConfig, head, zero_shot) -> dict[str, Any]:
    """Gold-sentence recall on the prune study's test questions, head vs zero-shot at equal compression."""
    from ragsieve.data.qa_files import split_questions
    from ragsieve.data.score_records import PairScores
    from ragsieve.eval.stats import bootstrap_metric, paired_bootstrap
    from ragsieve.prune import SentencePruner
    from ragsieve.registry import reranker_scores_key
    from studies.prune import PruneStudyConfig, _gold_paragraphs, _questions, gold_recall, study_work

    prune = PruneStudyConfig(data_dir=config.data_dir)
    questions, _, _, ds = _questions(dataset, prune, study_work(dataset))
    test = split_questions(questions, prune.splits[dataset], prune.seed)["test"]
    gold = _gold_paragraphs(dataset, test, ds, prune)
    asked = [q for q in test if gold.get(q.id)]
    levels = json.loads((Path(config.prune_results) / "metrics.json").read_text())[dataset]["prune_levels"]
    store = PairScores(Path(config.prune_results) / "records" / dataset / "gold-sentences", "sentences",
                       {"scoring_key": reranker_scores_key(prune.reranker)})
    base = SentencePruner(zero_shot)
    scored = []
    for q in asked:
        layout = base.layout(q.text, [p for p, _ in gold[q.id]])
        ids = [p.id for p in layout.pairs]
        zs = store.lookup(q.id, ids)
        if zs is None:
            zs = [float(x) for x in base.score(layout)]
            store.add([(q.id, i, x) for i, x in zip(ids, zs)])
        scored.append((q, layout, np.asarray(zs, float), np.asarray(head.score_layout(layout), float)))
    per_level: dict[str, dict[str, list[float]]] = {}
    for level in levels:
        row = per_level.setdefault(level["name"], {k: [] for k in ROW_KEYS})
        cuts = [base.at(level["raw"], level["max_sentences"]).decide(layout, zs) for _, layout, zs, _ in scored]
        share = _kept_chars(cuts)
        # the head at the same compression over the test set: the threshold on its scores that keeps as many
        # characters in all as zero-shot kept (each passage keeps at least its best sentence, as a pruner does)
        threshold = _matching_threshold([(layout, hs) for _, layout, _, hs in scored], share, base)
        for (q, layout, zs, hs), cut in zip(scored, cuts):
            zr, zk = gold_recall(gold[q.id], layout, [c.keep for c in cut])
            hr, hk = gold_recall(gold[q.id], layout, _best_n(layout, hs, [c.n_kept for c in cut]))
            matched = base.at(threshold).decide(layout, hs)
            mr, mk = gold_recall(gold[q.id], layout, [c.keep for c in matched])
            for key, value in zip(ROW_KEYS, (zr, hr, zk, hk, mr, mk)):
                row[key].append(value)
    out: dict[str, Any] = {"n_questions": len(asked), "levels": {}}
    for name, row in per_level.items():
        entry: dict[str, Any] = {}
        for key in ROW_KEYS:
            est, lo, hi = bootstrap_metric(np.mean, np.asarray(row[key]), n_boot=config.n_boot, seed=config.seed)
            entry[key] = {"mean": est, "ci95": [lo, hi]}
        for name_, head_key in (("head_minus_zero_shot", "head"), ("head_in_chars_minus_zero_shot", "head_in_chars")):
            diff = paired_bootstrap(row[head_key], row["zero_shot"], n_boot=config.n_boot, seed=config.seed)
            entry[name_] = {"diff": diff.diff, "ci95": [diff.low, diff.high], "p": diff.p_value}
        out["levels"][name] = entry
    return out


def _kept_chars(cuts) -> float:
    """Share of all the passages' characters the cuts keep (over every question: the compression of a level)."""
    kept = sum(b - a for cut in cuts for c in cut for (a, b), k in zip(c.spans, c.keep) if k)
    return kept / max(sum(b - a for cut in cuts for c in cut for a, b in c.spans), 1)


def _matching_threshold(scored, share: float, pruner) -> float:
    """The threshold on the head's scores whose cuts keep the share of the characters nearest ``share``."""
    candidates = np.unique(np.concatenate([hs[np.isfinite(hs)] for _, hs in scored]))[::-1]

    def kept(i: int) -> float:
        return _kept_chars([pruner.at(float(candidates[i])).decide(layout, hs) for layout, hs in scored])

    lo, hi = 0, len(candidates) - 1  # kept share grows as the threshold falls: the first index reaching it
    while lo < hi:
        mid = (lo + hi) // 2
        if kept(mid) >= share:
            hi = mid
        else:
            lo = mid + 1
    nearest = min((i for i in (lo - 1, lo) if i >= 0), key=lambda i: abs(kept(i) - share))
    return float(candidates[nearest])


def _mean_ci(entry: dict[str, Any]) -> str:
    return f"{entry['mean']:.3f} [{entry['ci95'][0]:.3f}, {entry['ci95'][1]:.3f}]"


def write_report(out_dir: Path, result: dict[str, Any]) -> None:
    t = result["training"]
    across = bool(result.get("training_config", {}).get("across_weight"))
    lines = ["# A keep head on the reranker's forward vs zero-shot sentence scoring (issue #61"
             + (", trained across passages for #69)" if across else ")"), "",
             f"Generated by `ragsieve run experiments/{out_dir.name}.yaml` (`studies/prune_head.py`); numbers "
             "from `metrics.json`. The head (`ragsieve.prune.head.SentenceKeepHead`): one forward of (query, title: "
             "passage) per passage through the shipped cross-encoder's lower layers, frozen — so the rerank logit "
             f"(and nDCG@10) is today's exactly (weights key `{result['reranker_weights']}`) — then a keep branch: a "
             f"trained copy of its top {result['branch_layers']} layers and a linear token classifier; a sentence's "
             "keep logit is the mean over its tokens.", "",
             f"Training (`ragsieve.prune.training.KeepHeadTrainer`): {t['n_sentences']} sentences ({t['positives']} "
             f"to keep) of {t['n_questions']} training questions "
             f"({', '.join(f'{k} {v}' for k, v in result['train_passages'].items())} passages); "
             + ("pointwise + listwise loss; the epoch with the best dev MAP of gold sentences within their passage "
                if not across else
                "pointwise + listwise loss within a passage + listwise loss over all of a question's passages "
                f"(weight {result['training_config']['across_weight']}, {result['hotpot_negatives']} HotpotQA "
                "distractor paragraphs a question); the epoch with the best dev MAP of gold sentences over each "
                "question's passages ") +
             f"({t['n_dev_passages']} dev passages, questions apart from training): epoch {t['chosen_epoch']} of "
             f"{len(t['epochs'])} (dev MAP by epoch: " + ", ".join(f"{e['dev_map']:.3f}" for e in t["epochs"]) + ").",
             "",
             "Held-out: the prune study's test questions (none trained the head or `embedded:base`). Gold-sentence "
             "recall inside the gold passages at **equal compression**: at each level the head keeps, in each "
             "passage, exactly as many sentences as zero-shot scoring kept there (which lets it keep longer ones); and "
             "**at equal characters**: the threshold on the head's scores that keeps the nearest share of the "
             "characters over the test passages to what zero-shot kept at that level (each passage keeps at least its "
             "best sentence, so best1 cannot go below one sentence a passage). "
             "Intervals: bootstrap over questions; head − zero-shot: paired bootstrap over questions.", ""]
    for dataset, res in result["eval"].items():
        lines += [f"## {dataset}: n = {res['n_questions']} test questions", "",
                  "| level | zero-shot recall | head recall (equal sentences) | head − zero-shot [95 % CI] | p | "
                  "head recall (equal characters) | head − zero-shot [95 % CI] | p | share kept (zero-shot / head / "
                  "head, equal characters) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, e in res["levels"].items():
            cells = [name, _mean_ci(e["zero_shot"])]
            for head_key, diff_key in (("head", "head_minus_zero_shot"), ("head_in_chars", "head_in_chars_minus_zero_shot")):
                if head_key not in e:  # a result written before the characters comparison existed
                    cells += ["", "", ""]
                    continue
                d = e[diff_key]
                cells += [_mean_ci(e[head_key]), f"{d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]",
                          f"{d['p']:.3g}"]
            kept = [e[k]["mean"] for k in ("zero_kept", "head_kept", "head_in_chars_kept") if k in e]
            cells.append(" / ".join(f"{k:.3f}" for k in kept))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines.append(f"Shipped: {result['shipped']}.")
    (out_dir / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


class PruneHeadStudy:
    Config = PruneHeadStudyConfig

    def run(self, config: PruneHeadStudyConfig, out_dir: Path, console) -> dict:
        from ragsieve.artifacts import weights_key
        from ragsieve.prune.head import HEAD_FILE, SentenceKeepHead, read_head
        from ragsieve.prune.training import KeepHeadTrainer
        from ragsieve.registry import load_reranker
        from ragsieve.rerank.shipped import ASSET_DIR
        from studies.common import write_json

        out_dir.mkdir(parents=True, exist_ok=True)
        # one work folder per results folder: a second training (prune_head_across) keeps its own head and cache
        work = Path.home() / ".cache" / "ragsieve" / "prune_head" / ("" if out_dir.name == "prune_head" else out_dir.name)
        work.mkdir(parents=True, exist_ok=True)
        examples, counts = [], {}
        for dataset in config.train_datasets:
            got = training_examples(dataset, config)
            counts[dataset] = len(got)
            log.info("prune head: %s, %d training passages", dataset, len(got))
            examples += got
        head = SentenceKeepHead.untrained(ASSET_DIR, config.branch_layers, max_length=config.max_length)
        training = KeepHeadTrainer(head, config.training, work / "train").train(examples)
        head.save(work / HEAD_FILE)
        # evaluate what would ship: the saved (float16) branch, read back as a spec would read it
        head = SentenceKeepHead(ASSET_DIR, head=read_head(work / HEAD_FILE, ASSET_DIR), max_length=config.max_length)
        zero_shot = load_reranker("embedded:base")
        result: dict[str, Any] = {"reranker_weights": weights_key(ASSET_DIR), "branch_layers": config.branch_layers,
                                  "train_passages": counts, "training": training, "eval": {},
                                  "training_config": config.training.model_dump(),
                                  "hotpot_negatives": config.hotpot_negatives}
        for dataset in config.eval_datasets:
            result["eval"][dataset] = evaluate(dataset, config, head, zero_shot)
            log.info("prune head: %s %s", dataset, {k: v["head_minus_zero_shot"]
                                                    for k, v in result["eval"][dataset]["levels"].items()})
        wins = all(e["head_minus_zero_shot"]["ci95"][0] > 0
                   for res in result["eval"].values() for e in res["levels"].values())
        result["beats_zero_shot_everywhere"] = wins
        result["shipped"] = False
        if config.ship_to and wins:
            head.save(Path(config.ship_to) / HEAD_FILE)
            result["shipped"] = str(Path(config.ship_to) / HEAD_FILE)
        write_json(out_dir / "metrics.json", result)
        write_report(out_dir, result)
        return result
