"""Sentence pruning cost: zero-shot sentence scoring against the keep head, on the passages a sieve keeps.

Each row prunes the same (NQ question, its gold passage) pairs — what the default sieve keeps, its top 1 —
as a :class:`~ragsieve.prune.SentencePruner` scores them:

* ``zero-shot``: ``embedded:base`` on every ``(query, title: sentence)`` pair (one pair per sentence, batched per
  passage), the scorer the default sieve prunes with unless its ``sieve.json`` names a ``pruner``;
* ``prune-head``: the keep head shipped beside the cross-encoder, one forward of ``(query, title: passage)``
  through the frozen lower layers and its two-layer branch.

Passages per second and milliseconds per passage, timed over ``--slices`` equal slices after a warm-up, with a
bootstrap interval over slices; one thread unless ``--threads``.

``against_ranking`` (issue #69): what pruning adds to a query as the default sieve runs it. Per NQ question, its
gold passage and 19 other NQ passages (20 candidates) ranked by the default sieve's reranker, then the top k = 1,
3, 5 pruned by its pruner, each timed on the same query side by side; the ratio of the summed prune time to the
summed rank time, with a bootstrap interval over questions, against the target of ≤ 10 %. The sieve's keep head
carries on from the rank forward's branch-point states (:meth:`~ragsieve.prune.head.SentenceKeepHead.read_rank_states`),
so pruning runs the head's two-layer branch on the kept passages only; each row also says how often it keeps
exactly the sentences the head keeps reading each passage itself in fp32 (how it was trained and measured).
Writes ``bench/results/prune.json``.

    python bench/prune.py [--passages 200] [--threads 1] [--queries 200]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from ragsieve.machine import machine_info

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROWS = {"zero-shot": "embedded:base", "prune-head": "prune-head"}


def pairs(n: int) -> list[tuple[str, object]]:
    """(question, gold passage) of the first ``n`` NQ-oracle questions with a gold passage of ≥ 2 sentences."""
    from ragsieve.data import load_dataset
    from ragsieve.prune import split_sentences

    ds = load_dataset("nq-oracle")
    pool = {p.id: p for p in ds.passages}
    out = []
    for q in ds.questions:
        gold = [pool[i] for i in q.gold_passage_ids if i in pool]
        if gold and len(split_sentences(gold[0].text)) >= 2:
            out.append((q.text, gold[0]))
        if len(out) == n:
            break
    return out


def measure(spec: str, work: list[tuple[str, object]], threads: int, slices: int) -> dict:
    import torch

    from ragsieve.prune import SentencePruner
    from ragsieve.registry import load_reranker

    torch.set_num_threads(threads)
    options = {"threads": threads} if spec.startswith("embedded:") else {}
    pruner = SentencePruner(load_reranker(spec, **options))
    layouts = [pruner.layout(query, [passage]) for query, passage in work]
    for layout in layouts[:10]:  # warm-up: first calls compile kernels and fill caches
        pruner.score(layout)
    bounds = np.linspace(0, len(layouts), slices + 1).astype(int)
    seconds = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        start = time.perf_counter()
        for layout in layouts[a:b]:
            pruner.score(layout)
        seconds.append(time.perf_counter() - start)
    sizes = np.diff(bounds)
    rates = sizes / np.asarray(seconds)
    rng = np.random.default_rng(0)
    boot = [sizes[i].sum() / np.asarray(seconds)[i].sum()
            for i in (rng.integers(0, slices, slices) for _ in range(2000))]
    rate = float(sizes.sum() / sum(seconds))
    return {"spec": spec, "passages_per_s": rate, "passages_per_s_ci95": [float(np.percentile(boot, 2.5)),
                                                                         float(np.percentile(boot, 97.5))],
            "ms_per_passage": 1000 / rate, "sentences_per_passage": float(np.mean([len(lay.pairs) for lay in layouts])),
            "slice_rates": rates.tolist()}


def against_ranking(n_queries: int, ks: tuple[int, ...] = (1, 3, 5), candidates: int = 20) -> dict:
    """Rank ``candidates`` passages, then prune the top k, as the default sieve does: seconds per query side by
    side, and prune / rank with an interval over queries."""
    from dataclasses import replace

    from ragsieve.data import load_dataset
    from ragsieve.eval.qa import contains_answer
    from ragsieve.pipeline.sieve import Sieve
    from ragsieve.prune.head import SentenceKeepHead

    sieve = Sieve.load("embedded:default")
    stages = sieve.stages
    # the same pruner on a head reading every passage itself in fp32 (how the head was trained and measured):
    # does carrying on from the rank's states keep the same sentences?
    own = replace(stages.pruner, scorer=SentenceKeepHead(stages.pruner.scorer.folder))
    ds = load_dataset("nq-oracle")
    pool = list(ds.passages)
    by_id = {p.id: p for p in pool}
    rng = np.random.default_rng(0)
    work = []
    for q in ds.questions:
        gold = [by_id[i] for i in q.gold_passage_ids if i in by_id]
        if not gold:
            continue
        others = [pool[i] for i in rng.choice(len(pool), candidates + 5, replace=False) if pool[i].id != gold[0].id]
        work.append((q.text, [gold[0], *others[: candidates - 1]], q.answers))
        if len(work) == n_queries + 5:
            break
    rank_s, prune_s, same = [], {k: [] for k in ks}, {k: [] for k in ks}
    answered = {k: [] for k in ks}  # (answer in what the sieve kept, in what the fp32 head kept)
    for n, (query, passages, answers) in enumerate(work):
        start = time.perf_counter()
        ranked = stages.reranker.rank(query, passages).results
        seconds = time.perf_counter() - start
        cuts = {}
        for k in ks:
            top = [r.passage for r in ranked[:k]]
            start = time.perf_counter()
            kept = stages.pruner.prune(query, top)
            cuts[k] = time.perf_counter() - start
            reference = own.prune(query, top)
            same[k].append([p.keep for p in kept] == [p.keep for p in reference])
            answered[k].append([contains_answer(" ".join(p.text for p in cut), answers) for cut in (kept, reference)])
        if n >= 5:  # the first queries warm kernels and caches up
            rank_s.append(seconds)
            for k in ks:
                prune_s[k].append(cuts[k])
    rank = np.asarray(rank_s)
    head = stages.pruner.scorer
    out = {"queries": len(rank), "candidates": candidates, "reranker": type(stages.reranker).__name__,
           "pruner_scorer": type(head).__name__, "rank_ms_per_query": float(rank.mean() * 1000),
           "pruner_reads_rank_states": getattr(head, "rank", None) is not None,
           "pruner_precision": getattr(head, "precision", None), "target_ratio": 0.10, "by_k": {}}
    boot = rng.integers(0, len(rank), (2000, len(rank)))
    for k in ks:
        cut = np.asarray(prune_s[k])
        ratios = cut[boot].sum(1) / rank[boot].sum(1)
        ratio = float(cut.sum() / rank.sum())
        low, high = float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))
        agree = np.asarray(same[k], float)  # every query, the warm-up ones too: agreement is not timed
        agree_boot = agree[rng.integers(0, len(agree), (2000, len(agree)))].mean(1)
        hits = np.asarray(answered[k], float)  # the answer string in the kept text: this path, the fp32 head's
        diff_boot = (hits[:, 0] - hits[:, 1])[rng.integers(0, len(hits), (2000, len(hits)))].mean(1)
        out["by_k"][str(k)] = {"prune_ms_per_query": float(cut.mean() * 1000), "prune_over_rank": ratio,
                               "ci95": [low, high], "met": high <= 0.10,
                               "same_sentences_as_fp32_head": float(agree.mean()), "same_n": len(agree),
                               "same_ci95": [float(np.percentile(agree_boot, 2.5)),
                                             float(np.percentile(agree_boot, 97.5))],
                               "answer_kept": float(hits[:, 0].mean()), "answer_kept_fp32_head": float(hits[:, 1].mean()),
                               "answer_kept_diff": float((hits[:, 0] - hits[:, 1]).mean()),
                               "answer_kept_diff_ci95": [float(np.percentile(diff_boot, 2.5)),
                                                         float(np.percentile(diff_boot, 97.5))]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--slices", type=int, default=10)
    parser.add_argument("--queries", type=int, default=200, help="queries for the prune-against-rank rows")
    parser.add_argument("--out", default="bench/results/prune.json")
    args = parser.parse_args()

    work = pairs(args.passages)
    rows = {name: measure(spec, work, args.threads, args.slices) for name, spec in ROWS.items()}
    base = rows["zero-shot"]["passages_per_s"]
    for row in rows.values():
        row["speedup_vs_zero_shot"] = row["passages_per_s"] / base
    vs_rank = against_ranking(args.queries)
    result = {"passages": len(work), "threads": args.threads, "dataset": "nq-oracle (question, gold passage)",
              "rows": rows, "against_ranking": vs_rank, "machine": machine_info(),
              "date": datetime.now(timezone.utc).isoformat()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for name, row in rows.items():
        lo, hi = row["passages_per_s_ci95"]
        print(f"{name:>10}: {row['passages_per_s']:.1f} passages/s [{lo:.1f}, {hi:.1f}], "
              f"{row['ms_per_passage']:.1f} ms each, {row['speedup_vs_zero_shot']:.2f}x zero-shot")
    print(f"rank {vs_rank['candidates']} candidates: {vs_rank['rank_ms_per_query']:.0f} ms a query")
    for k, row in vs_rank["by_k"].items():
        print(f"prune top {k}: {row['prune_ms_per_query']:.0f} ms, {row['prune_over_rank']:.3f} of ranking "
              f"[{row['ci95'][0]:.3f}, {row['ci95'][1]:.3f}] (target <= 0.10: {'met' if row['met'] else 'not met'}); "
              f"same sentences as the fp32 head {row['same_sentences_as_fp32_head']:.3f}, answer kept "
              f"{row['answer_kept']:.3f} vs {row['answer_kept_fp32_head']:.3f} ({row['answer_kept_diff']:+.3f} "
              f"[{row['answer_kept_diff_ci95'][0]:+.3f}, {row['answer_kept_diff_ci95'][1]:+.3f}])")


if __name__ == "__main__":
    main()
