"""Cross-encoder reranking throughput: ragsieve's backends vs ``CrossEncoder.predict``.

Same weights (``embedded:base`` unless --model), same 100 held-out NQ questions × 20 hybrid
candidates, one timed run each. Every backend gets the CrossEncoder's own tokenised,
length-sorted batches; one-time costs (ONNX export, quantisation) are reported apart.
Quality: nDCG@10 against the gold passages for each backend vs fp32 ``predict``.
``speedup`` is the fastest backend whose nDCG@10 stays within --max-ndcg-drop of fp32.
Writes ``bench/results/rerank.json``.

    python bench/rerank.py [--queries 100] [--candidates 20] [--batch-size 32]
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


def main() -> None:
    import torch

    from ragsieve.data import held_out_questions, load_dataset
    from ragsieve.eval.ranking import ranking_metrics
    from ragsieve.models.specs import DEFAULT_ENCODER
    from ragsieve.rerank.embedded import ensure_base_reranker
    from ragsieve.rerank.neural import CrossEncoderRanker
    from ragsieve.retrieve.cached import build_or_load_index

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--candidates", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", default="", help="cross-encoder folder (default: embedded:base)")
    parser.add_argument("--backends", default="torch-int8,onnx,onnx-int8")
    parser.add_argument("--max-ndcg-drop", type=float, default=0.005)
    parser.add_argument("--out", default="bench/results/rerank.json")
    args = parser.parse_args()

    model_dir = args.model or str(ensure_base_reranker())
    ds = load_dataset("nq-oracle")
    questions = held_out_questions(ds.questions)[: args.queries]
    index, _ = build_or_load_index("nq-oracle", ds.passages, "hybrid", DEFAULT_ENCODER)
    hits = index.search_batch([q.text for q in questions], k=args.candidates)
    pairs, owners = [], []
    for q, row in zip(questions, hits):
        for h in row:
            pairs.append((q.text, h.passage.full_text))
            owners.append((q.id, h.passage.id))
    qrels = {q.id: {pid: 1 for pid in q.gold_passage_ids} for q in questions}

    def ndcg10(scores: np.ndarray) -> float:
        run: dict[str, dict[str, float]] = {}
        for (qid, pid), s in zip(owners, scores):
            run.setdefault(qid, {}).setdefault(pid, float(s))
        return ranking_metrics(qrels, run, ks=(10,), measures=("nDCG",))["nDCG@10"]

    reference = CrossEncoderRanker(model_dir, batch_size=args.batch_size)
    t = time.perf_counter()
    ref_scores = np.asarray(reference.model.predict(pairs, batch_size=args.batch_size, show_progress_bar=False))
    ref_seconds = time.perf_counter() - t
    ref_ndcg = ndcg10(ref_scores)
    rows = {"CrossEncoder.predict (fp32)": {"seconds": ref_seconds, "pairs_per_s": len(pairs) / ref_seconds,
                                            "ndcg@10": ref_ndcg, "ndcg_delta": 0.0, "max_abs_score_diff": 0.0}}
    for backend in [b for b in args.backends.split(",") if b]:
        t = time.perf_counter()
        ranker = CrossEncoderRanker(model_dir, batch_size=args.batch_size, backend=backend)
        ranker.predict_pairs(pairs[:4])  # warm-up: export / quantise / session start
        setup = time.perf_counter() - t
        t = time.perf_counter()
        scores = ranker.predict_pairs(pairs)
        seconds = time.perf_counter() - t
        nd = ndcg10(scores)
        rows[backend] = {
            "seconds": seconds, "pairs_per_s": len(pairs) / seconds, "setup_seconds": setup,
            "ndcg@10": nd, "ndcg_delta": nd - ref_ndcg,
            "max_abs_score_diff": float(np.max(np.abs(scores - ref_scores))),
            "spearman_vs_fp32": float(_spearman(scores, ref_scores)),
        }
        print(f"{backend}: {rows[backend]['pairs_per_s']:.1f} pairs/s, nDCG@10 {nd:.4f} (fp32 {ref_ndcg:.4f})")
    keeps = {k: v for k, v in rows.items() if k != "CrossEncoder.predict (fp32)"
             and abs(v["ndcg_delta"]) <= args.max_ndcg_drop}
    best = max(keeps, key=lambda k: keeps[k]["pairs_per_s"]) if keeps else None
    result = {
        "speedup": (rows[best]["pairs_per_s"] / rows["CrossEncoder.predict (fp32)"]["pairs_per_s"]) if best else 1.0,
        "ndcg_delta": rows[best]["ndcg_delta"] if best else 0.0,
        "chosen_backend": best,
        "target_speedup": 2.0,
        "backends": rows,
        "pairs": len(pairs),
        "queries": len(questions),
        "model": model_dir,
        "batch_size": args.batch_size,
        "torch_threads": torch.get_num_threads(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("speedup", "ndcg_delta", "chosen_backend")}))


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


if __name__ == "__main__":
    main()
