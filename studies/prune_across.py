"""Sentences across passages (issue #69): which scorer finds a question's evidence among several passages.

HotpotQA's evidence sits in two paragraphs, so the sieve keeps the best sentences of its top-k paragraphs
*together* (``SentencePruner(scope="across")``) under a token cap, and a sentence score must mean the same in
every paragraph. Measured without the LLM, on the prune study's held-out test questions (none trained
``embedded:base`` or a keep head): HotpotQA — each question's 10 distractor-setting paragraphs ranked by
``embedded:base``, the gold sentences its supporting facts; NQ — the top ``nq_candidates`` passages the prune
study's index retrieves for it, ranked by ``embedded:base``, the gold sentences those of its gold passage that
hold an answer. The top k are cut across passages at equal token caps, and the share of the question's gold
sentences kept is counted (a sentence counts when kept spans cover half of it; those in passages outside the top
k count as missed). Scorers: zero-shot ``(question, title: sentence)`` pairs, each keep head in ``heads`` (the
shipped one trained with a softmax *within* a passage; experiments/prune_head_across.yaml's also across a
question's passages), and each with its passage's rerank probability (log σ(sentence) + log σ(passage): the
sentence is useful when its passage is relevant and it is the part that is), a calibration across passages
that needs no training. Paired bootstrap over questions against zero-shot.

    ragsieve run experiments/prune_across.yaml
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from ragsieve.config import StrictConfig

log = logging.getLogger(__name__)

class PruneAcrossStudyConfig(StrictConfig):
    datasets: list[Literal["hotpotqa", "nq"]] = ["hotpotqa"]
    ks: list[int] = [2, 3]  # paragraphs kept before the cut across them
    token_caps: list[int] = [24, 48, 96]  # WordPiece tokens of the kept sentences, in all
    reranker: str = "embedded:base"
    # name → keep head: "prune-head" (shipped beside the reranker) or a prune_head.safetensors file
    heads: dict[str, str] = {"head": "prune-head"}
    nq_candidates: int = Field(10, ge=1)  # NQ passages retrieved (and ranked) per question
    # the scorers every other one is compared with (paired, per question): zero-shot always; a head's name too
    # (a fitted head against the shipped one: issue #71), with its non-inferiority verdict at ``margin``
    versus: list[str] = ["zero-shot"]
    margin: float = Field(0.03, gt=0, lt=1)  # recall points a scorer may lose and still be non-inferior
    max_questions: int = Field(0, ge=0, description="0: every test question (a smoke run: fewer)")
    n_boot: int = Field(2000, ge=100)
    seed: int = 0
    data_dir: str | None = None


def _log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -np.asarray(x, float))


def scorers(config: PruneAcrossStudyConfig) -> list[str]:
    """Zero-shot, each head, then each of them with its passage's rerank probability."""
    plain = ["zero-shot", *config.heads]
    return plain + [f"{name} + passage" for name in plain]


def held_out(config: PruneAcrossStudyConfig, dataset: str = "hotpotqa") -> list[tuple[Any, list, dict[str, list]]]:
    """(question, its candidate passages, passage id → gold sentence spans) of the prune study's test questions:
    HotpotQA's 10 distractor paragraphs, NQ's top ``nq_candidates`` retrieved passages."""
    from ragsieve.data.qa_files import split_questions
    from ragsieve.data.records import Passage
    from studies.prune import PruneStudyConfig, _gold_paragraphs, _questions, hotpot_rows, retrieved, study_work

    prune = PruneStudyConfig(data_dir=config.data_dir, reranker=config.reranker)
    questions, passages, index_name, ds = _questions(dataset, prune, study_work(dataset))
    test = split_questions(questions, prune.splits[dataset], prune.seed)["test"]
    test = test[: config.max_questions or None]
    gold = _gold_paragraphs(dataset, test, ds, prune)
    if dataset == "hotpotqa":
        candidates = {row["_id"]: [Passage(title, "".join(sents).strip(), title) for title, sents in row["context"]]
                      for row in hotpot_rows(config.data_dir, {q.id for q in test})}
    else:
        candidates = retrieved(test, passages, index_name, prune, config.nq_candidates)
    return [(q, candidates[q.id], {p.id: spans for p, spans in gold[q.id]}) for q in test if gold.get(q.id)]


def load_head(spec: str):
    """A keep head by name: ``prune-head`` (shipped) or a ``prune_head.safetensors`` file on the shipped reranker."""
    from ragsieve.registry import load_reranker

    if spec == "prune-head":
        return load_reranker(spec)
    from ragsieve.prune.head import SentenceKeepHead, read_head
    from ragsieve.rerank.shipped import ASSET_DIR

    return SentenceKeepHead(ASSET_DIR, head=read_head(Path(spec).expanduser(), ASSET_DIR))


def _recall(layout, keeps, gold: dict[str, list], n_gold: int) -> float:
    """Share of the question's gold sentences the keep masks keep (half a sentence covered counts)."""
    hit = 0
    for passage, spans, keep in zip(layout.passages, layout.spans, keeps):
        kept = [s for s, k in zip(spans, keep) if k]
        hit += sum(sum(max(0, min(b, y) - max(a, x)) for x, y in kept) >= (b - a) / 2
                   for a, b in gold.get(passage.id, []))
    return hit / max(n_gold, 1)


def score_question(q, paragraphs, reranker, heads: dict[str, Any], k: int):
    """The top ``k`` paragraphs' layout and each scorer's sentence scores (the top k of a question's ranking are
    a prefix of its top max-k: :func:`prefix` cuts both for a smaller k)."""
    from ragsieve.prune import SentencePruner

    ranked = reranker.rank(q.text, paragraphs).results[:k]
    layout = SentencePruner(reranker).layout(q.text, [r.passage for r in ranked])
    passage_of = np.repeat([r.score for r in ranked], [len(s) for s in layout.spans])
    plain = {"zero-shot": np.asarray(reranker.score_pairs([q.text] * len(layout.pairs), list(layout.pairs)), float)}
    plain.update({name: np.asarray(head.score_layout(layout), float) for name, head in heads.items()})
    return layout, {**plain, **{f"{name} + passage": _log_sigmoid(x) + _log_sigmoid(passage_of)
                                for name, x in plain.items()}}


def prefix(layout, scores: dict[str, np.ndarray], k: int):
    """The layout and scores of the first ``k`` passages only."""
    from dataclasses import replace

    n = sum(len(s) for s in layout.spans[:k])
    return (replace(layout, passages=layout.passages[:k], spans=layout.spans[:k], pairs=layout.pairs[:n]),
            {name: x[:n] for name, x in scores.items()})


def measure(config: PruneAcrossStudyConfig, dataset: str = "hotpotqa") -> dict[str, Any]:
    from ragsieve.eval.stats import bootstrap_metric, paired_bootstrap
    from ragsieve.prune import SentencePruner
    from ragsieve.prune.pruner import scorer_token_counter
    from ragsieve.registry import load_reranker

    reranker = load_reranker(config.reranker)
    heads = {name: load_head(spec) for name, spec in config.heads.items()}
    names = scorers(config)
    count = scorer_token_counter(reranker)
    asked = held_out(config, dataset)
    per: dict[str, dict[str, list[float]]] = {}
    for n, (q, paragraphs, gold) in enumerate(asked):
        n_gold = sum(len(s) for s in gold.values())
        every = score_question(q, paragraphs, reranker, heads, max(config.ks))
        for k in config.ks:
            layout, scores = prefix(*every, k)
            for cap in config.token_caps:
                pruner = SentencePruner(reranker, token_cap=cap, scope="across", count_tokens=count)
                for name in names:
                    cut = pruner.decide(layout, scores[name])
                    row = per.setdefault(f"top{k}, {cap} tokens", {})
                    row.setdefault(name, []).append(_recall(layout, [c.keep for c in cut], gold, n_gold))
                    row.setdefault(f"{name} tokens", []).append(sum(c.tokens_after for c in cut))
        if (n + 1) % 50 == 0:
            log.info("prune across %s: %d of %d questions", dataset, n + 1, len(asked))
    out: dict[str, Any] = {"n_questions": len(asked), "levels": {}}
    for level, row in per.items():
        entry: dict[str, Any] = {}
        for name in names:
            est, lo, hi = bootstrap_metric(np.mean, np.asarray(row[name]), n_boot=config.n_boot, seed=config.seed)
            entry[name] = {"recall": est, "ci95": [lo, hi], "tokens": float(np.mean(row[f"{name} tokens"]))}
            for base in config.versus:
                if name == base:
                    continue
                d = paired_bootstrap(row[name], row[base], n_boot=config.n_boot, seed=config.seed)
                key = "minus_zero_shot" if base == "zero-shot" else f"minus {base}"
                entry[name][key] = {"diff": d.diff, "ci95": [d.low, d.high], "p": d.p_value,
                                    **({} if base == "zero-shot" else
                                       {"margin": config.margin, "non_inferior": bool(d.low > -config.margin)})}
        out["levels"][level] = entry
    return out


GOLD = {"hotpotqa": "HotpotQA distractor setting: the supporting-fact sentences among the question's 10 paragraphs",
        "nq": "NQ retrieval setting: the answer-holding sentences of the gold passage among the top retrieved"}


def write_report(out_dir: Path, result: dict[str, Any]) -> None:
    names = scorers(PruneAcrossStudyConfig(**result["config"]))
    lines = ["# Sentences across passages: which scorer finds the evidence (issue #69)", "",
             f"Generated by `ragsieve run experiments/{out_dir.name}.yaml` (`studies/prune_across.py`; its docstring "
             "says what is measured). The prune study's held-out test questions; recall of the gold sentences over "
             "the whole question, kept sentences across the top-k passages at a token cap (WordPiece tokens; mean "
             "kept shown), 95 % bootstrap intervals over questions; Δ: paired bootstrap against zero-shot (and 'Δ vs' a "
             "named scorer, with the non-inferiority verdict at margin δ in recall). Heads: "
             + ", ".join(f"`{n}` = `{spec}`" for n, spec in result["config"]["heads"].items()) + "."]
    for dataset, res in result["datasets"].items():
        lines += ["", f"## {dataset}: n = {res['n_questions']}", "", GOLD[dataset] + ".", "",
                  "| top-k, cap | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for level, entry in res["levels"].items():
            cells = []
            for name in names:
                e = entry[name]
                cell = f"{e['recall']:.3f} [{e['ci95'][0]:.3f}, {e['ci95'][1]:.3f}], {e['tokens']:.0f} tok"
                if "minus_zero_shot" in e:
                    d = e["minus_zero_shot"]
                    cell += f"; Δ {d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
                for key, d in e.items():
                    if key.startswith("minus "):
                        cell += (f"; Δ vs {key[6:]} {d['diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
                                 f" ({'non-inferior' if d['non_inferior'] else 'not shown non-inferior'} at "
                                 f"δ = {d['margin']:.2f})")
                cells.append(cell)
            lines.append(f"| {level} | " + " | ".join(cells) + " |")
    (out_dir / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


class PruneAcrossStudy:
    Config = PruneAcrossStudyConfig

    def run(self, config: PruneAcrossStudyConfig, out_dir: Path, console) -> dict:
        from studies.common import write_json

        out_dir.mkdir(parents=True, exist_ok=True)
        result = {"config": config.model_dump(),
                  "datasets": {dataset: measure(config, dataset) for dataset in config.datasets}}
        write_json(out_dir / "metrics.json", result)
        write_report(out_dir, result)
        return result
