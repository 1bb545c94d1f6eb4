"""Cross-encoder reranking throughput on one thread: ``CrossEncoder.predict`` fp32 vs ragsieve's default.

Same weights (the shipped ``embedded:base`` unless --asset), held-out questions with BM25
top-20 candidates from their dataset's pool, one timed run each, one thread for both:

* **short** — NQ-oracle pairs, both sides truncated at 128 tokens;
* **long** — MultiRC pairs (passages ≈330 tokens median), both truncated at 512 tokens.

ragsieve's default is ``load_reranker("embedded:base")`` (the card's backend, ONNX int8 with
length-bucketed batches, plus the MiniLM cosine it mixes in when the card's weight is > 0,
which costs a bi-encoder pass); ``predict`` is sentence-transformers on the fp32 copy of the
same weights. Quality: nDCG@10 against the gold passages for both; the speedup counts only if
the default's nDCG@10 is within --max-ndcg-drop of fp32. A third row on the long set is the
default as shipped (its own max_length), for reference. Writes ``bench/results/rerank.json``.

    python bench/rerank.py [--short-queries 30] [--long-queries 8] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pair_set(name: str, n: int):
    """(pairs, owners, qrels) for n held-out questions of ``name`` with BM25 top-20 candidates."""
    from ragsieve.data import load_dataset
    from ragsieve.benchmarks.mining import held_out_sources
    from ragsieve.benchmarks.relevance import ranking_queries, retrieved_candidates, split_questions

    ds = load_dataset(name)
    src = held_out_sources()[name]
    _, test = split_questions(ds, src)
    test = test[:n]
    cands = retrieved_candidates("bm25")(ds, test, 20)
    queries = [q for q in ranking_queries(ds, test, src)]
    pairs, owners = [], []
    for q, row in zip(test, cands):
        for p in row:
            pairs.append((q.text, p.full_text))
            owners.append((q.id, p.id))
    qrels = {q.query_id: {pid: 1 for pid in q.relevant} for q in queries}
    return pairs, owners, qrels


def ndcg10(scores, owners, qrels) -> float:
    from ragsieve.eval.ranking import ranking_metrics

    run: dict[str, dict[str, float]] = {}
    for (qid, pid), s in zip(owners, scores):
        run.setdefault(qid, {}).setdefault(pid, float(s))
    return ranking_metrics(qrels, run, ks=(10,), measures=("nDCG",))["nDCG@10"]


def score_pairs(ranker, pairs):
    """Scores in pair order through the ranker's public contract (``BaseRanker.score_pairs``)."""
    return ranker.score_pairs([q for q, _ in pairs], [p for _, p in pairs])


def timed(fn, pairs):
    fn(pairs[:8])  # warm-up (session start, first allocation)
    t = time.perf_counter()
    scores = np.asarray(fn(pairs), dtype=float)
    return scores, time.perf_counter() - t


def main() -> None:
    import torch
    from sentence_transformers import CrossEncoder

    from ragsieve.registry import load_reranker
    from ragsieve.rerank.shipped import ASSET_DIR, OnnxCrossEncoderRanker, load_shipped_reranker, read_card

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short-queries", type=int, default=30)
    parser.add_argument("--long-queries", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--asset", default=str(ASSET_DIR))
    parser.add_argument("--max-ndcg-drop", type=float, default=0.005)
    parser.add_argument("--out", default="bench/results/rerank.json")
    args = parser.parse_args()

    torch.set_num_threads(1)
    card = read_card(args.asset)
    t = time.perf_counter()
    default = load_reranker("embedded:base", threads=1, batch_size=args.batch_size) if args.asset == str(ASSET_DIR) \
        else load_shipped_reranker(args.asset, threads=1, batch_size=args.batch_size)
    score_pairs(default, [("warm", "up")])  # the cosine encoder loads on first use
    load_seconds = time.perf_counter() - t
    result: dict = {"settings": {}, "default_backend": card.get("default_backend"), "load_seconds": load_seconds}
    for setting, dataset, n, max_length in (("short", "nq-oracle", args.short_queries, 128),
                                            ("long", "multirc", args.long_queries, 512)):
        pairs, owners, qrels = pair_set(dataset, n)
        ce = CrossEncoder(args.asset, max_length=max_length, device="cpu")
        ce.model.float()  # the asset is fp16 on disk; the baseline is the fp32 model
        ref, ref_s = timed(lambda p: ce.predict(p, batch_size=args.batch_size, show_progress_bar=False), pairs)
        # the shipped default (backend, cosine mix, calibration) at this setting's max length
        ours = load_shipped_reranker(args.asset, threads=1, batch_size=args.batch_size, max_length=max_length)
        sc, s = timed(lambda p: score_pairs(ours, p), pairs)
        shipped, shipped_s = timed(lambda p: score_pairs(default, p), pairs)
        lengths = [len(e.ids) for e in OnnxCrossEncoderRanker(args.asset, max_length=max_length).encode_pairs(pairs)]
        nd_ref, nd = ndcg10(ref, owners, qrels), ndcg10(sc, owners, qrels)
        row = {
            "dataset": dataset, "pairs": len(pairs), "max_length": max_length,
            "tokens_mean": float(np.mean(lengths)), "tokens_max": int(np.max(lengths)),
            "predict_fp32": {"pairs_per_s": len(pairs) / ref_s, "ndcg@10": nd_ref},
            "ragsieve_default": {"pairs_per_s": len(pairs) / s, "ndcg@10": nd, "ndcg_delta": nd - nd_ref,
                                 "spearman_vs_fp32": _spearman(sc, ref)},
            "speedup": (ref_s / s),
            "speedup_counts": abs(nd - nd_ref) <= args.max_ndcg_drop,
            "ragsieve_default_as_shipped": {"max_length": card["max_length"], "pairs_per_s": len(pairs) / shipped_s,
                                            "ndcg@10": ndcg10(shipped, owners, qrels)},
        }
        result["settings"][setting] = row
        print(setting, json.dumps({k: row[k] for k in ("pairs", "speedup", "speedup_counts")}),
              f"fp32 {row['predict_fp32']['pairs_per_s']:.1f} pairs/s, default {row['ragsieve_default']['pairs_per_s']:.1f}",
              flush=True)
    result.update({
        "target_speedup": 3.0,
        "threads": 1,
        "batch_size": args.batch_size,
        "asset": args.asset,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_avg_at_end": os.getloadavg()},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


if __name__ == "__main__":
    main()
