"""Sentences across passages (issue #69): which scorer finds a question's evidence among several passages.

HotpotQA's evidence sits in two paragraphs, so the sieve keeps the best sentences of its top-k paragraphs
*together* (``SentencePruner(scope="across")``) under a token cap, and a sentence score must mean the same in
every paragraph. Measured without the LLM: on the prune study's held-out HotpotQA test questions (none trained
``embedded:base`` or the keep head), each question's 10 distractor-setting paragraphs ranked by ``embedded:base``,
the top k cut across passages at equal token caps, and the share of the question's supporting-fact sentences
kept (a sentence counts when kept spans cover half of it; those in paragraphs outside the top k count as
missed). Scorers: zero-shot ``(question, title: sentence)`` pairs, the keep head (trained with a softmax
*within* a passage), and each with its passage's rerank probability (log σ(sentence) + log σ(passage): the
sentence is useful when its passage is relevant and it is the part that is), a calibration across passages
that needs no training. Paired bootstrap over questions against zero-shot.

    ragsieve run experiments/prune_across.yaml
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from ragsieve.config import StrictConfig

log = logging.getLogger(__name__)

SCORERS = ("zero-shot", "head", "zero-shot + passage", "head + passage")


class PruneAcrossStudyConfig(StrictConfig):
    ks: list[int] = [2, 3]  # paragraphs kept before the cut across them
    token_caps: list[int] = [24, 48, 96]  # WordPiece tokens of the kept sentences, in all
    reranker: str = "embedded:base"
    head: str = "prune-head"
    max_questions: int = Field(0, ge=0, description="0: every test question (a smoke run: fewer)")
    n_boot: int = Field(2000, ge=100)
    seed: int = 0
    data_dir: str | None = None


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -np.asarray(x, float))


def held_out(config: PruneAcrossStudyConfig) -> list[tuple[Any, list, dict[str, list]]]:
    """(question, its 10 paragraphs, title → supporting-fact spans) of the prune study's HotpotQA test questions."""
    from ragsieve.data.qa_files import split_questions
    from ragsieve.data.records import Passage
    from studies.prune import PruneStudyConfig, _gold_paragraphs, _questions, hotpot_rows

    prune = PruneStudyConfig(data_dir=config.data_dir, reranker=config.reranker)
    work = Path.home() / ".cache" / "ragsieve" / "prune" / "hotpotqa"
    work.mkdir(parents=True, exist_ok=True)
    questions, _, _, ds = _questions("hotpotqa", prune, work)
    test = split_questions(questions, prune.splits["hotpotqa"], prune.seed)["test"]
    test = test[: config.max_questions or None]
    gold = _gold_paragraphs("hotpotqa", test, ds, prune)
    paragraphs = {row["_id"]: [Passage(title, "".join(sents).strip(), title) for title, sents in row["context"]]
                  for row in hotpot_rows(config.data_dir, {q.id for q in test})}
    return [(q, paragraphs[q.id], {p.id: spans for p, spans in gold[q.id]}) for q in test if gold.get(q.id)]


def _recall(layout, keeps, gold: dict[str, list], n_gold: int) -> float:
    """Share of the question's gold sentences the keep masks keep (half a sentence covered counts)."""
    hit = 0
    for passage, spans, keep in zip(layout.passages, layout.spans, keeps):
        kept = [s for s, k in zip(spans, keep) if k]
        hit += sum(sum(max(0, min(b, y) - max(a, x)) for x, y in kept) >= (b - a) / 2
                   for a, b in gold.get(passage.id, []))
    return hit / max(n_gold, 1)


def score_question(q, paragraphs, reranker, head, k: int):
    """The top ``k`` paragraphs' layout and each scorer's sentence scores (the top k of a question's ranking are
    a prefix of its top max-k: :func:`prefix` cuts both for a smaller k)."""
    from ragsieve.prune import SentencePruner

    ranked = reranker.rank(q.text, paragraphs).results[:k]
    layout = SentencePruner(reranker).layout(q.text, [r.passage for r in ranked])
    passage_of = np.repeat([r.score for r in ranked], [len(s) for s in layout.spans])
    zero = np.asarray(reranker.score_pairs([q.text] * len(layout.pairs), list(layout.pairs)), float)
    kept = np.asarray(head.score_layout(layout), float)
    return layout, {"zero-shot": zero, "head": kept,
                    "zero-shot + passage": _log_sigmoid(zero) + _log_sigmoid(passage_of),
                    "head + passage": _log_sigmoid(kept) + _log_sigmoid(passage_of)}


def prefix(layout, scores: dict[str, np.ndarray], k: int):
    """The layout and scores of the first ``k`` passages only."""
    from dataclasses import replace

    n = sum(len(s) for s in layout.spans[:k])
    return (replace(layout, passages=layout.passages[:k], spans=layout.spans[:k], pairs=layout.pairs[:n]),
            {name: x[:n] for name, x in scores.items()})


def measure(config: PruneAcrossStudyConfig) -> dict[str, Any]:
    from ragsieve.eval.stats import bootstrap_metric, paired_bootstrap
    from ragsieve.prune import SentencePruner
    from ragsieve.prune.pruner import scorer_token_counter
    from ragsieve.registry import load_reranker

    reranker, head = load_reranker(config.reranker), load_reranker(config.head)
    count = scorer_token_counter(reranker)
    asked = held_out(config)
    per: dict[str, dict[str, list[float]]] = {}
    for n, (q, paragraphs, gold) in enumerate(asked):
        n_gold = sum(len(s) for s in gold.values())
        every = score_question(q, paragraphs, reranker, head, max(config.ks))
        for k in config.ks:
            layout, scores = prefix(*every, k)
            for cap in config.token_caps:
                pruner = SentencePruner(reranker, token_cap=cap, scope="across", count_tokens=count)
                for name in SCORERS:
                    cut = pruner.decide(layout, scores[name])
                    row = per.setdefault(f"top{k}, {cap} tokens", {})
                    row.setdefault(name, []).append(_recall(layout, [c.keep for c in cut], gold, n_gold))
                    row.setdefault(f"{name} tokens", []).append(sum(c.tokens_after for c in cut))
        if (n + 1) % 50 == 0:
            log.info("prune across: %d of %d questions", n + 1, len(asked))
    out: dict[str, Any] = {"n_questions": len(asked), "levels": {}}
    for level, row in per.items():
        entry: dict[str, Any] = {}
        for name in SCORERS:
            est, lo, hi = bootstrap_metric(np.mean, np.asarray(row[name]), n_boot=config.n_boot, seed=config.seed)
            entry[name] = {"recall": est, "ci95": [lo, hi], "tokens": float(np.mean(row[f"{name} tokens"]))}
            if name != "zero-shot":
                d = paired_bootstrap(row[name], row["zero-shot"], n_boot=config.n_boot, seed=config.seed)
                entry[name]["minus_zero_shot"] = {"diff": d.diff, "ci95": [d.low, d.high], "p": d.p_value}
        out["levels"][level] = entry
    return out


def write_report(out_dir: Path, result: dict[str, Any]) -> None:
    lines = ["# Sentences across passages: which scorer finds the evidence (issue #69)", "",
             "Generated by `ragsieve run experiments/prune_across.yaml` (`studies/prune_across.py`; its docstring "
             "says what is measured). HotpotQA distractor setting, the prune study's held-out test questions "
             f"(n = {result['n_questions']}); recall of the supporting-fact sentences over the whole question, "
             "kept sentences across the top-k paragraphs at a token cap (WordPiece tokens; mean kept shown), 95 % "
             "bootstrap intervals over questions; Δ: paired bootstrap against zero-shot.", "",
             "| top-k, cap | " + " | ".join(SCORERS) + " |", "|---" * (len(SCORERS) + 1) + "|"]
    for level, entry in result["levels"].items():
        cells = []
        for name in SCORERS:
            e = entry[name]
            cell = f"{e['recall']:.3f} [{e['ci95'][0]:.3f}, {e['ci95'][1]:.3f}], {e['tokens']:.0f} tok"
            if "minus_zero_shot" in e:
                d = e["minus_zero_shot"]
                cell += f"; Δ {d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
            cells.append(cell)
        lines.append(f"| {level} | " + " | ".join(cells) + " |")
    (out_dir / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


class PruneAcrossStudy:
    Config = PruneAcrossStudyConfig

    def run(self, config: PruneAcrossStudyConfig, out_dir: Path, console) -> dict:
        from studies.common import write_json

        out_dir.mkdir(parents=True, exist_ok=True)
        result = {"config": config.model_dump(), **measure(config)}
        write_json(out_dir / "metrics.json", result)
        write_report(out_dir, result)
        return result
