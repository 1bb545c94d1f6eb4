"""Index encoding speed: `ragsieve index`'s default encoder backend against `SentenceTransformer.encode` fp32,
side by side in one run, and `index --ray local` with 1 and 2 actors (issue #74).

What it does
------------
1. Two corpora from the benchmark data (``$RAGSIEVE_DATA``, default ``/work/shared/data``; text is read at run
   time, never written anywhere):
   * **200-token chunks**: the 10 paragraphs of each HotpotQA distractor question (the 1,517-question file) joined
     into one document and cut by `ragsieve index`'s own chunker (200 tokens, 40 overlapping), so nearly every
     chunk is a full 200-token window; the first ``--chunks`` of them.
   * **short passages**: the HotpotQA paragraphs themselves (one passage each, as `index --passages` reads a
     paragraph file), of the first questions, ``--passages`` of them.
2. Speed: the same texts encoded by `SentenceTransformer.encode` (torch fp32, batch 64, normalised: what `index`
   ran before #74) and by `index`'s default path (:func:`ragsieve.retrieve.dense.passage_vectors` on
   :func:`ragsieve.models.encoder.index_encoder_backend`'s choice), in ``--rounds`` interleaved rounds (A B, B A,
   ...: both see the same machine load) after one warm-up pass each over all the texts (OpenVINO compiles its
   kernels per input shape on first sight, a cost a long build pays once); chunks/s = texts / summed seconds; the
   ratio and its 95 % interval over rounds (percentile bootstrap of the per-round time ratios).
3. Tolerance: per-vector cosine of the default backend's vector to fp32's (min, mean; the stated tolerance is
   ``INDEX_MIN_COSINE``), and recall@10 of the index built from the default vectors against the one built from
   fp32 vectors (both `index`'s default HNSW), queried with each backend's own query vectors by the questions whose
   paragraphs are in the corpus: (a) the fraction of the fp32 index's top 10 the built index returns, and (b) gold
   recall@10 (a chunk or paragraph is gold if it holds a supporting paragraph) of each, their paired difference;
   every mean with n queries and a 95 % bootstrap interval by query.
4. `index --ray local`: :func:`ragsieve.retrieve.scale.ray_passage_vectors` (what `index --ray` runs) on the first
   ``--ray-chunks`` 200-token chunks with 1 and then 2 actors (a fresh shard folder each; wall time from the call to
   the last vector, Ray already started, actor start-up and model load included), and the largest cosine gap
   between its vectors and the single-process path's.
5. Writes ``bench/results/index.json``.

Run (a few minutes on 2 cores; heavy: take the shared lock)::

    flock /tmp/ragsieve-heavy.lock .venv/bin/python bench/index.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ragsieve.eval.stats import bootstrap_ci  # noqa: E402
from ragsieve.machine import machine_info  # noqa: E402
from ragsieve.models.specs import DEFAULT_ENCODER  # noqa: E402

DATA = Path(os.environ.get("RAGSIEVE_DATA", "/work/shared/data"))


def hotpot_corpora(n_chunks: int, n_passages: int) -> dict[str, dict]:
    """``{name: {texts, gold_rows (per query), queries}}`` for the 200-token chunks and the short passages."""
    from ragsieve.benchmarks.mining import hotpot_1517
    from ragsieve.retrieve.corpus import Chunker, ChunkConfig, Document

    ds = hotpot_1517(DATA)
    by_title = {p.id: p for p in ds.passages}
    chunker = Chunker(ChunkConfig())
    chunks: list[str] = []
    chunk_gold: list[set[int]] = []
    chunk_queries: list[str] = []
    for q in ds.questions:
        if len(chunks) >= n_chunks:
            break
        text, spans = "", {}
        for title in q.meta["candidate_ids"]:
            start = len(text)
            text += by_title[title].full_text + "\n\n"
            spans[title] = (start, len(text))
        gold = set()
        for passage in chunker.chunk(Document(q.id, text, "", "", {})):
            lo, hi = passage.meta["start"], passage.meta["end"]
            if any(lo < spans[t][1] and spans[t][0] < hi for t in q.gold_passage_ids):
                gold.add(len(chunks))
            chunks.append(passage.full_text)
        chunk_gold.append(gold)
        chunk_queries.append(q.text)
    paragraphs: list[str] = []
    row_of: dict[str, int] = {}
    para_gold: list[set[int]] = []
    para_queries: list[str] = []
    for q in ds.questions:
        if len(paragraphs) >= n_passages:
            break
        for title in q.meta["candidate_ids"]:
            if title not in row_of:
                row_of[title] = len(paragraphs)
                paragraphs.append(by_title[title].full_text)
        para_gold.append({row_of[t] for t in q.gold_passage_ids})
        para_queries.append(q.text)
    return {"chunks_200_tokens": {"texts": chunks, "gold": chunk_gold, "queries": chunk_queries},
            "short_passages": {"texts": paragraphs, "gold": para_gold, "queries": para_queries}}


def timed_rounds(encoders: dict, texts: list[str], rounds: int) -> tuple[dict[str, list[float]], dict]:
    """Seconds per round for each encoder over interleaved slices of ``texts`` (order alternating by round), and
    each encoder's vectors for all of ``texts``."""
    vectors = {name: np.zeros((len(texts), 0), np.float32) for name in encoders}
    seconds: dict[str, list[float]] = {name: [] for name in encoders}
    for name, encode in encoders.items():  # warm-up over every text: the per-shape kernels a long build amortises
        encode(texts)
    parts = [list(range(r, len(texts), rounds)) for r in range(rounds)]
    out = {name: [None] * len(texts) for name in encoders}
    for r, idx in enumerate(parts):
        order = list(encoders) if r % 2 == 0 else list(reversed(encoders))
        for name in order:
            t0 = time.perf_counter()
            vecs = encoders[name]([texts[i] for i in idx])
            seconds[name].append(time.perf_counter() - t0)
            for row, i in enumerate(idx):
                out[name][i] = vecs[row]
    for name in encoders:
        vectors[name] = np.stack(out[name]).astype(np.float32)
    return seconds, vectors


def ratio_interval(fast: list[float], slow: list[float], n_boot: int = 2000) -> list[float]:
    """95 % percentile-bootstrap interval of sum(slow) / sum(fast) over rounds."""
    rng = np.random.default_rng(0)
    f, s = np.asarray(fast), np.asarray(slow)
    boots = [s[i].sum() / f[i].sum() for i in rng.integers(0, len(f), size=(n_boot, len(f)))]
    return [round(float(np.percentile(boots, 2.5)), 3), round(float(np.percentile(boots, 97.5)), 3)]


def mean_ci(values) -> dict:
    est, lo, hi = bootstrap_ci(np.asarray(values, dtype=float))
    return {"mean": round(est, 4), "ci95": [round(lo, 4), round(hi, 4)], "n": len(values)}


def recall_block(corpus: dict, fp32_vecs: np.ndarray, vecs: np.ndarray, backend: str, st) -> dict:
    """Recall@10 of the index built from ``vecs`` against the fp32-built one, and gold recall@10 of each."""
    from ragsieve.data.records import Passage
    from ragsieve.models.encoder import load_backend_encoder
    from ragsieve.retrieve.dense import DenseRetriever, encode_queries

    passages = [Passage(f"p{i}", "x") for i in range(len(vecs))]  # ids only: the vectors are given
    fp32_index = DenseRetriever.build(passages, embeddings=fp32_vecs, encoder_backend="torch", show_progress=False)
    built = DenseRetriever.build(passages, embeddings=vecs, encoder_backend=backend, show_progress=False)
    q_fp32 = encode_queries(st, corpus["queries"])
    q_built = encode_queries(load_backend_encoder(DEFAULT_ENCODER, backend), corpus["queries"], backend=backend)
    top_fp32 = [[int(h.passage.id[1:]) for h in hits] for hits in fp32_index.search_vectors(q_fp32, 10)]
    top_built = [[int(h.passage.id[1:]) for h in hits] for hits in built.search_vectors(q_built, 10)]
    overlap = [len(set(a) & set(b)) / 10 for a, b in zip(top_fp32, top_built)]
    keep = [i for i, g in enumerate(corpus["gold"]) if g]
    gold_fp32 = [len(set(top_fp32[i]) & corpus["gold"][i]) / len(corpus["gold"][i]) for i in keep]
    gold_built = [len(set(top_built[i]) & corpus["gold"][i]) / len(corpus["gold"][i]) for i in keep]
    return {"recall10_of_fp32_top10": mean_ci(overlap),
            "gold_recall10": {"fp32_built": mean_ci(gold_fp32), "default_built": mean_ci(gold_built),
                              "default_minus_fp32": mean_ci(np.subtract(gold_built, gold_fp32))}}


def speed_block(name: str, corpus: dict, st, backend: str, rounds: int) -> tuple[dict, np.ndarray]:
    from ragsieve.data.records import Passage
    from ragsieve.models.encoder import INDEX_MIN_COSINE, INDEX_RECALL_TOLERANCE
    from ragsieve.retrieve.dense import passage_vectors

    texts = corpus["texts"]
    tokens = [len(x) for x in st.tokenizer(texts, add_special_tokens=True, truncation=True,
                                           max_length=st.max_seq_length)["input_ids"]]
    encoders = {
        "sentence_transformers_fp32": lambda t: st.encode(t, batch_size=64, normalize_embeddings=True,
                                                          show_progress_bar=False),
        "index_default": lambda t: passage_vectors([Passage(f"p{i}", x) for i, x in enumerate(t)], backend=backend,
                                                   show_progress=False)[0],
    }
    seconds, vectors = timed_rounds(encoders, texts, rounds)
    rate = {k: round(len(texts) / sum(v), 2) for k, v in seconds.items()}
    ratio = sum(seconds["sentence_transformers_fp32"]) / sum(seconds["index_default"])
    cos = (vectors["index_default"] * vectors["sentence_transformers_fp32"]).sum(1)
    block = {
        "n_texts": len(texts), "mean_tokens": round(float(np.mean(tokens)), 1), "rounds": rounds,
        "chunks_per_s": rate, "seconds_per_round": {k: [round(x, 2) for x in v] for k, v in seconds.items()},
        "speedup": round(ratio, 3), "speedup_ci95": ratio_interval(seconds["index_default"],
                                                                   seconds["sentence_transformers_fp32"]),
        "cosine_to_fp32": {"min": round(float(cos.min()), 6), "mean": round(float(cos.mean()), 6),
                           "tolerance_min": INDEX_MIN_COSINE, "met": bool(cos.min() >= INDEX_MIN_COSINE)},
    }
    block.update(recall_block(corpus, vectors["sentence_transformers_fp32"], vectors["index_default"], backend, st))
    gap = block["gold_recall10"]["default_minus_fp32"]
    block["recall_tolerance"] = INDEX_RECALL_TOLERANCE
    block["recall_met"] = bool(-INDEX_RECALL_TOLERANCE <= gap["ci95"][0] and gap["ci95"][1] <= INDEX_RECALL_TOLERANCE)
    print(f"{name}: {block['chunks_per_s']} → {block['speedup']}× {block['speedup_ci95']}; cosine min "
          f"{block['cosine_to_fp32']['min']}; fp32 top-10 recall {block['recall10_of_fp32_top10']['mean']}; "
          f"gold recall gap {gap['mean']} {gap['ci95']}", flush=True)
    return block, vectors["index_default"]


def ray_block(texts: list[str], backend: str, reference: np.ndarray, actors: list[int]) -> dict:
    from ragsieve.cluster import init_ray
    from ragsieve.retrieve.scale import ray_passage_vectors

    init_ray("local", num_cpus=max(actors))
    out = {"n_texts": len(texts), "by_actors": {}}
    for n in actors:
        with tempfile.TemporaryDirectory() as work:
            t0 = time.perf_counter()
            vecs, _ = ray_passage_vectors(texts, encoder_spec=DEFAULT_ENCODER, backend=backend, address="local",
                                          work_dir=Path(work), workers=n, shard_size=max(1, len(texts) // 8),
                                          show_progress=False)
            seconds = time.perf_counter() - t0
        cos = (vecs * reference).sum(1)
        out["by_actors"][str(n)] = {"seconds": round(seconds, 1), "chunks_per_s": round(len(texts) / seconds, 2),
                                    "min_cosine_to_single_process": round(float(cos.min()), 6)}
        print(f"ray {n} actor(s): {out['by_actors'][str(n)]}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=1000, help="200-token chunks")
    parser.add_argument("--passages", type=int, default=1000, help="short passages")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ray-chunks", type=int, default=400)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "index.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ragsieve.models.encoder import index_encoder_backend, load_encoder

    backend = index_encoder_backend()
    st = load_encoder(DEFAULT_ENCODER)
    corpora = hotpot_corpora(args.chunks, args.passages)
    result = {"bench": "index", "issue": 74, "encoder": DEFAULT_ENCODER, "default_backend": backend,
              "baseline": "SentenceTransformer.encode, torch fp32, batch 64, normalize_embeddings=True",
              "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "corpora": {}}
    t0 = time.perf_counter()
    chunk_vectors = None
    for name, corpus in corpora.items():
        result["corpora"][name], vecs = speed_block(name, corpus, st, backend, args.rounds)
        if name == "chunks_200_tokens":
            chunk_vectors = vecs
    n_ray = min(args.ray_chunks, len(corpora["chunks_200_tokens"]["texts"]))
    result["ray_local"] = ray_block(corpora["chunks_200_tokens"]["texts"][:n_ray], backend,
                                    chunk_vectors[:n_ray], [1, 2])
    result["ray_local"]["note"] = ("2 actors on a 2-core machine share the cores the single process already uses "
                                   "(its backend runs 2 threads): no gain is expected here; actors pay off with "
                                   "their own cores, on more machines")
    result["minutes"] = round((time.perf_counter() - t0) / 60, 1)
    result["machine"] = machine_info()
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
