"""HNSW vs exact inner-product search on >= 100k MiniLM vectors (one run).

What it does
------------
1. Collects every real passage in ``/work/shared/data`` (``$RAGSIEVE_DATA`` overrides):
   FEVER wiki docs split into sentences (one per line of ``text``), BioASQ snippets,
   NQ oracle passages, HotpotQA distractor paragraphs, PubMedQA contexts and MultiRC
   passages split into sentences; de-duplicated by text.
2. Embeds them with the embedded all-MiniLM-L6-v2 (normalised), cached as .npy under
   ``$RAGSIEVE_CACHE/bench/`` (default ``~/.cache/ragsieve/bench``) so reruns skip it.
3. If fewer than ``--n-vectors`` real passages exist, fills the rest with synthetic vectors:
   a random real vector plus isotropic Gaussian noise of total norm ~``--noise`` (0.5),
   renormalised (expected cosine to its source ~ 1/sqrt(1+0.25) = 0.89). This keeps the
   synthetic points on the data manifold instead of uniform on the sphere (which would be
   unrealistically hard for HNSW and unlike any real corpus). ``n_real`` / ``n_synthetic``
   are in the JSON.
4. Queries: ``--n-queries`` (1000) held-out real question texts, an equal share from NQ-open
   dev questions, HotpotQA dev questions, BioASQ question bodies and FEVER claims (seeded
   sample; none is a passage), embedded with the same encoder.
5. Ground truth = ``faiss.IndexFlatIP`` top-10. For each HNSW ``M`` it builds
   ``IndexHNSWFlat(METRIC_INNER_PRODUCT)`` once and sweeps ``efSearch``; the reported
   operating point is the smallest efSearch with recall@10 >= ``--target-recall`` at the
   default ``M``.
   All faiss work runs on ONE thread (``faiss.omp_set_num_threads(1)``), build and search,
   and QPS is measured one query at a time (``index.search(q[i:i+1], 10)``), so the numbers
   are per-core latency, not batch throughput.
6. With ``--pgvector URL`` (or ``local``: a throwaway PostgreSQL with the ``vector`` extension, the
   one the tests start), the same vectors go into a pgvector table (``ragsieve index --store``'s code,
   HNSW with the first ``M`` and ``--ef-construction``) and the same queries are searched there one
   at a time for each efSearch; the JSON's ``pgvector`` block holds its recall@10 against the faiss
   flat ground truth and against the same table's exact scan (``ORDER BY`` without the index).
   PostgreSQL builds the graph with its own (parallel) maintenance workers, so its build time is
   not single-threaded; its QPS includes a round trip per query.
7. Every recall@10 carries n (queries) and a 95 % percentile-bootstrap interval by query.
8. Writes ``bench/results/retrieval.json`` (see ``--out``).

Run::

    HF_HUB_OFFLINE=1 .venv/bin/python bench/retrieval.py --n-vectors 100000
    HF_HUB_OFFLINE=1 .venv/bin/python bench/retrieval.py --n-vectors 100000 --pgvector local
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import gzip
import hashlib
import json
import os
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
from ragsieve.machine import machine_info

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ragsieve.eval.stats import bootstrap_ci  # noqa: E402
from ragsieve.models.specs import DEFAULT_ENCODER  # noqa: E402
from ragsieve.paths import cache_dir  # noqa: E402
from ragsieve.retrieve.dense import count_truncated, embed_texts, make_faiss_index  # noqa: E402

DATA = Path(os.environ.get("RAGSIEVE_DATA", "/work/shared/data"))
_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def _fever_title(docid: str) -> str:
    return docid.replace("_", " ").replace("-LRB-", "(").replace("-RRB-", ")").replace("-COLON-", ":")


def collect_passages(data: Path = DATA) -> tuple[list[str], dict[str, int]]:
    """All real passage texts (title-prefixed like ``Passage.full_text``), de-duplicated, in a fixed order."""
    sources: dict[str, list[str]] = {k: [] for k in ("fever", "bioasq", "nq", "hotpotqa", "pubmedqa", "multirc")}
    with open(data / "fever/docs.jsonl", encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)
            title = _fever_title(doc["docid"])
            sources["fever"] += [f"{title}: {s.strip()}" for s in doc["text"].split("\n") if s.strip()]
    for path in sorted(glob.glob(str(data / "bioasq/*_golden.json"))):
        with open(path, encoding="utf-8") as fh:
            for q in json.load(fh)["questions"]:
                sources["bioasq"] += [s["text"].strip() for s in q.get("snippets", []) if s.get("text", "").strip()]
    with gzip.open(data / "nq/nq-open-oracle.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            sources["nq"] += [f"{c['title']}: {c['text']}" for c in json.loads(line)["ctxs"]]
    with open(data / "hotpotqa/hotpot_dev_distractor_sample100.jsonl", encoding="utf-8") as fh:
        for line in fh:
            ctx = json.loads(line)["context"]
            sources["hotpotqa"] += [f"{t}: {''.join(s)}" for t, s in zip(ctx["title"], ctx["sentences"])]
    with open(data / "pubmedqa/ori_pqal.json", encoding="utf-8") as fh:
        for rec in json.load(fh).values():
            sources["pubmedqa"] += rec["CONTEXTS"]
    for split in ("train", "val"):
        with open(data / f"multirc/{split}.jsonl", encoding="utf-8") as fh:
            for line in fh:
                text = re.sub(r"<[^>]+>", " ", json.loads(line)["passage"]["text"])
                sources["multirc"] += [s.strip() for s in _SENT_SPLIT.split(text) if len(s.strip()) > 20]
    seen: set[str] = set()
    texts: list[str] = []
    counts: dict[str, int] = {}
    for name, items in sources.items():
        before = len(texts)
        for t in items:
            if t not in seen:
                seen.add(t)
                texts.append(t)
        counts[name] = len(texts) - before
    return texts, counts


def collect_queries(n: int, exclude: set[str], seed: int, data: Path = DATA) -> tuple[list[str], dict[str, int]]:
    """``n`` real questions, an equal share per source (seeded), none equal to a passage text."""
    pools: dict[str, list[str]] = {}
    with open(data / "nq/NQ-open.dev.jsonl", encoding="utf-8") as fh:
        pools["nq"] = [json.loads(line)["question"] for line in fh]
    with open(data / "hotpotqa/hotpot_dev_v1_simplified.json", encoding="utf-8") as fh:
        pools["hotpotqa"] = [q["question"] for q in json.load(fh)]
    pools["bioasq"] = []
    for path in sorted(glob.glob(str(data / "bioasq/*_golden.json"))):
        with open(path, encoding="utf-8") as fh:
            pools["bioasq"] += [q["body"] for q in json.load(fh)["questions"]]
    with open(data / "fever/val.jsonl", encoding="utf-8") as fh:
        pools["fever"] = [json.loads(line)["query"] for line in fh]
    rng = random.Random(seed)
    out: list[str] = []
    counts: dict[str, int] = {}
    seen = set(exclude)
    share = n // len(pools)
    for i, (name, pool) in enumerate(pools.items()):
        want = share + (1 if i < n - share * len(pools) else 0)
        pool = sorted(set(pool))
        rng.shuffle(pool)
        picked = [q for q in pool if q.strip() and q not in seen][:want]
        seen.update(picked)
        out += picked
        counts[name] = len(picked)
    return out, counts


def cached_embeddings(texts: list[str], tag: str, encoder_spec: str, batch_size: int, show_progress: bool) -> tuple[np.ndarray, dict]:
    """Embed ``texts`` or load them from the cache (keyed by a hash of encoder + texts)."""
    h = hashlib.sha256(encoder_spec.encode())
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\0")
    key = h.hexdigest()[:16]
    folder = cache_dir() / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    npy, meta_path = folder / f"{tag}-{key}.npy", folder / f"{tag}-{key}.json"
    if npy.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        meta["from_cache"] = True
        return np.load(npy), meta
    from ragsieve.models.encoder import load_encoder

    encoder = load_encoder(encoder_spec)
    t0 = time.perf_counter()
    truncated = count_truncated(encoder, texts)
    vecs = embed_texts(encoder, texts, batch_size=batch_size, show_progress=show_progress, description=f"embedding {tag}")
    seconds = time.perf_counter() - t0
    meta = {
        "n": len(texts),
        "encoder": encoder_spec,
        "seconds": round(seconds, 1),
        "ms_per_text": round(1000 * seconds / max(len(texts), 1), 2),
        "truncated": truncated,
        "max_seq_length": encoder.max_seq_length,
    }
    np.save(npy, vecs)
    meta_path.write_text(json.dumps(meta, indent=2))
    meta["from_cache"] = False
    return vecs, meta


def synthesize(real: np.ndarray, n: int, noise: float, seed: int) -> np.ndarray:
    """``n`` vectors = random real row + N(0, noise^2/dim) per coordinate, renormalised."""
    rng = np.random.default_rng(seed)
    src = real[rng.integers(0, len(real), size=n)]
    out = src + rng.standard_normal(src.shape, dtype=np.float32) * np.float32(noise / np.sqrt(real.shape[1]))
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out.astype(np.float32)


def time_single_queries(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """Search one query at a time; return ids and queries/second."""
    index.search(queries[:10], k)  # warm caches
    ids = np.empty((len(queries), k), dtype=np.int64)
    t0 = time.perf_counter()
    for i in range(len(queries)):
        ids[i] = index.search(queries[i : i + 1], k)[1][0]
    return ids, len(queries) / (time.perf_counter() - t0)


def recall_per_query(found: np.ndarray, truth: np.ndarray) -> np.ndarray:
    k = truth.shape[1]
    return np.array([len(set(f) & set(t)) / k for f, t in zip(found, truth)])


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean(recall_per_query(found, truth)))


def recall_with_ci(found: np.ndarray, truth: np.ndarray, seed: int = 0) -> dict:
    """recall@k, its n (queries) and a 95 % percentile-bootstrap interval by query (the sampled unit)."""
    est, lo, hi = bootstrap_ci(recall_per_query(found, truth), seed=seed)
    return {"recall_at_10": round(est, 4), "recall_at_10_ci95": [round(lo, 4), round(hi, 4)], "n_queries": len(truth)}


def pgvector_search(retriever, queries: np.ndarray, k: int, *, exact: bool = False) -> tuple[np.ndarray, float]:
    """Search a pgvector index one query at a time (a transaction and a round trip each); ids and queries/second."""
    retriever.search_vectors(queries[:10], k, exact=exact)  # warm the connection and the buffer cache
    ids = np.empty((len(queries), k), dtype=np.int64)
    t0 = time.perf_counter()
    for i in range(len(queries)):
        ids[i] = [int(h.passage.id) for h in retriever.search_vectors(queries[i : i + 1], k, exact=exact)[0]]
    return ids, len(queries) / (time.perf_counter() - t0)


def measure_pgvector(url: str, xb: np.ndarray, xq: np.ndarray, truth: np.ndarray, texts: list[str], args) -> dict:
    """The same vectors in a pgvector table: build time, and recall@10 / QPS for each efSearch (see the module doc)."""
    from contextlib import nullcontext

    from ragsieve.data.records import Passage
    from ragsieve.retrieve.pgvector import StoreURL, build_store_index, connect

    k = truth.shape[1]
    if url == "local":
        from tools.postgres import PostgresServer

        server = PostgresServer()
    else:
        server = nullcontext()
    with server as pg:
        url = pg.url(table="bench_retrieval") if url == "local" else url
        passages = [Passage(str(i), texts[i] if i < len(texts) else f"synthetic {i}") for i in range(len(xb))]
        t0 = time.perf_counter()
        retriever = build_store_index(passages, url, embeddings=xb, m=args.m[0], ef_construction=args.ef_construction,
                                      overwrite=True, show_progress=False)
        build = time.perf_counter() - t0
        exact_ids, exact_qps = pgvector_search(retriever, xq, k, exact=True)
        sweep = []
        for ef in args.ef_search:
            retriever.ef_search = ef
            found, qps = pgvector_search(retriever, xq, k)
            row = {"ef_search": ef, **recall_with_ci(found, truth, args.seed),
                   "recall_at_10_vs_table_exact": round(recall_at_k(found, exact_ids), 4),
                   "qps": round(qps, 1), "qps_ratio": round(qps / exact_qps, 2)}
            sweep.append(row)
            print(f"pgvector M={args.m[0]} ef_search={ef}: {row}", flush=True)
        retriever.close()
        with connect(StoreURL.parse(url)) as conn:
            version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
            server_version = conn.execute("SHOW server_version").fetchone()[0]
    ok = [r for r in sweep if r["recall_at_10"] >= args.target_recall]
    chosen = ok[0] if ok else max(sweep, key=lambda r: r["recall_at_10"])
    return {
        "recall_at_10": chosen["recall_at_10"],
        "recall_at_10_ci95": chosen["recall_at_10_ci95"],
        "n_queries": chosen["n_queries"],
        "ef_search": chosen["ef_search"],
        "target_met": bool(ok),
        "m": args.m[0],
        "ef_construction": args.ef_construction,
        "build_seconds": round(build, 1),
        "exact_qps": round(exact_qps, 1),
        "exact_recall_at_10_vs_faiss_flat": round(recall_at_k(exact_ids, truth), 4),
        "sweep": sweep,
        "pgvector_version": version,
        "postgres_version": server_version,
        "protocol": "ragsieve.retrieve.pgvector.build_store_index on the same vectors (binary COPY, then CREATE INDEX "
        "USING hnsw (embedding vector_cosine_ops)); one query per search_vectors call (one round trip on loopback; "
        "the session has hnsw.ef_search set and enable_seqscan off, so the HNSW graph is always searched); recall@10 = |pgvector top-10 ∩ IndexFlatIP top-10| / 10 per "
        "query, 95 % percentile bootstrap over queries; exact = the same table with the index scan disabled",
    }


def retrieval_machine_info() -> dict:
    import faiss

    return machine_info(faiss=faiss.__version__, faiss_threads=1)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-vectors", type=int, default=100_000, help="index size (real passages, topped up with synthetic)")
    ap.add_argument("--n-queries", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/retrieval.json")
    ap.add_argument("--encoder", default=DEFAULT_ENCODER)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--m", type=int, nargs="+", default=[32, 16], help="HNSW M values; the first is the reported default")
    ap.add_argument("--ef-construction", type=int, default=200)
    ap.add_argument("--ef-search", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    ap.add_argument("--target-recall", type=float, default=0.98)
    ap.add_argument("--noise", type=float, default=0.5, help="norm of the Gaussian noise added to synthetic vectors")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-real", type=int, default=None,
                    help="embed only a seeded sample of this many real passages, across sources (the rest synthetic); "
                    "default: the first --n-vectors")
    ap.add_argument("--pgvector", default=None, metavar="URL",
                    help="also measure a pgvector index: postgresql://... or 'local' (a throwaway server)")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    import faiss

    faiss.omp_set_num_threads(1)
    machine = retrieval_machine_info()
    k = 10

    texts, per_source = collect_passages()
    print(f"real passages: {len(texts)} {per_source}", flush=True)
    if args.n_real and args.n_real < min(len(texts), args.n_vectors):
        # a seeded sample across every source, in corpus order (the first N would all be FEVER sentences)
        keep = sorted(random.Random(args.seed).sample(range(len(texts)), args.n_real))
        texts = [texts[i] for i in keep]
        bounds = np.cumsum(list(per_source.values()))  # collect_passages returns the sources in blocks
        per_source = dict(zip(per_source, np.bincount(np.searchsorted(bounds, keep, side="right"),
                                                      minlength=len(bounds)).tolist()))
        print(f"sampled real passages: {len(texts)} {per_source}", flush=True)
    texts = texts[: args.n_vectors]
    passages_vecs, pmeta = cached_embeddings(texts, "passages", args.encoder, args.batch_size, not args.no_progress)
    queries, q_sources = collect_queries(args.n_queries, set(texts), args.seed)
    query_vecs, qmeta = cached_embeddings(queries, "queries", args.encoder, args.batch_size, not args.no_progress)
    n_real = len(passages_vecs)
    n_synth = max(0, args.n_vectors - n_real)
    xb = passages_vecs if n_synth == 0 else np.vstack([passages_vecs, synthesize(passages_vecs, n_synth, args.noise, args.seed)])
    xb = np.ascontiguousarray(xb, dtype=np.float32)
    xq = np.ascontiguousarray(query_vecs, dtype=np.float32)
    print(f"vectors: {len(xb)} ({n_real} real, {n_synth} synthetic), queries: {len(xq)}", flush=True)

    t0 = time.perf_counter()
    exact = make_faiss_index(xb, exact=True)
    exact_build = time.perf_counter() - t0
    truth, exact_qps = time_single_queries(exact, xq, k)
    exact_bytes = len(faiss.serialize_index(exact))
    print(f"exact: {exact_qps:.1f} qps, {exact_bytes / 2**20:.1f} MiB", flush=True)

    per_m: list[dict] = []
    for m in args.m:
        t0 = time.perf_counter()
        hnsw = make_faiss_index(xb, exact=False, m=m, ef_construction=args.ef_construction, ef_search=args.ef_search[0])
        build = time.perf_counter() - t0
        hnsw_bytes = len(faiss.serialize_index(hnsw))
        sweep = []
        for ef in args.ef_search:
            hnsw.hnsw.efSearch = ef
            found, qps = time_single_queries(hnsw, xq, k)
            row = {
                "ef_search": ef,
                **recall_with_ci(found, truth, args.seed),
                "hnsw_qps": round(qps, 1),
                "qps_ratio": round(qps / exact_qps, 2),
            }
            sweep.append(row)
            print(f"M={m} efSearch={ef}: {row}", flush=True)
        ok = [r for r in sweep if r["recall_at_10"] >= args.target_recall]
        per_m.append(
            {
                "m": m,
                "ef_construction": args.ef_construction,
                "build_seconds": round(build, 1),
                "index_bytes": hnsw_bytes,
                "graph_overhead_bytes": hnsw_bytes - exact_bytes,
                "sweep": sweep,
                "chosen": ok[0] if ok else None,
            }
        )
        del hnsw

    main_cfg = per_m[0]
    chosen = main_cfg["chosen"] or max(main_cfg["sweep"], key=lambda r: r["recall_at_10"])
    machine["loadavg_at_end"] = list(os.getloadavg())
    result = {
        "recall_at_10": chosen["recall_at_10"],
        "recall_at_10_ci95": chosen["recall_at_10_ci95"],
        "qps_ratio": chosen["qps_ratio"],
        "hnsw_qps": chosen["hnsw_qps"],
        "exact_qps": round(exact_qps, 1),
        "ef_search": chosen["ef_search"],
        "target_recall": args.target_recall,
        "target_met": main_cfg["chosen"] is not None and chosen["qps_ratio"] >= 10,
        "m": main_cfg["m"],
        "ef_construction": args.ef_construction,
        "hnsw_build_seconds": main_cfg["build_seconds"],
        "exact_build_seconds": round(exact_build, 2),
        "hnsw_index_bytes": main_cfg["index_bytes"],
        "exact_index_bytes": exact_bytes,
        "n_vectors": len(xb),
        "n_real": n_real,
        "n_synthetic": n_synth,
        "real_sources": per_source,
        "real_sample": f"seeded sample of {args.n_real} across sources (seed {args.seed})" if args.n_real else "the first n_real",
        "synthetic_method": f"random real vector + N(0, {args.noise}^2/dim) noise, renormalised",
        "dim": int(xb.shape[1]),
        "n_queries": len(xq),
        "query_sources": q_sources,
        "k": k,
        "sweep": main_cfg["sweep"],
        "per_m": per_m,
        "encoder": args.encoder,
        "embedding": {"passages": pmeta, "queries": qmeta},
        "protocol": "faiss.omp_set_num_threads(1) for build and search; QPS = 1000 single-query index.search calls; "
        "recall@10 = |HNSW top-10 ∩ IndexFlatIP top-10| / 10, averaged over queries",
        "machine": machine,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if args.pgvector:
        result["pgvector"] = measure_pgvector(args.pgvector, xb, xq, truth, texts, args)
        machine["loadavg_at_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k_: result[k_] for k_ in ("recall_at_10", "recall_at_10_ci95", "qps_ratio", "hnsw_qps", "exact_qps", "ef_search", "n_vectors", "n_real", "n_synthetic")}))
    if args.pgvector:
        print(json.dumps({k_: result["pgvector"][k_] for k_ in ("recall_at_10", "recall_at_10_ci95", "n_queries", "ef_search", "build_seconds")}))
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
