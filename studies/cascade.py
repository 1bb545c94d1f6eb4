"""How many candidates the ``embedded:fast`` cascade cross-encodes (issue #62): ``experiments/cascade.yaml``.

:class:`~ragsieve.rerank.cascade.CascadeRanker` scores every candidate by MiniLM cosine and runs the
cross-encoder on the best ``n`` only. ``n`` is chosen on **dev** lists of the six in-domain sets (train-side
questions that ``embedded:base`` never trained or early-stopped on, their candidate lists built as the
held-out ones are): the smallest ``n`` whose nDCG@10 stays within ``max_drop`` of the full default on every
set. The held-out lists (the ones every reranker result in ``results/`` reports) are then read from the
committed records of the default's scores (``results/rerank_distill/records/eval-teacher`` and
``eval-cosine``: no model call), per set with a paired bootstrap over queries.

Each cascade's ranking is computed from the full default's two terms (the cross-encoder logit and the cosine),
exactly what :class:`CascadeRanker` does with the same models: the top ``n`` by cosine keep the full score, the
rest fall below them in cosine order.
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from ragsieve.config import StrictConfig

log = logging.getLogger(__name__)

SETS = ["nq-oracle", "hotpotqa-distractor", "fever", "bioasq", "multirc", "pubmedqa"]


class CascadeStudyConfig(StrictConfig):
    datasets: list[str] = SETS
    reranker: str = "embedded:base"
    dev_queries: int = Field(100, ge=10)
    tops: list[int] = [3, 5, 8, 10, 12, 15]
    max_drop: float = 0.01  # nDCG@10 below the full default allowed on every dev set
    heldout_records: str = "results/rerank_distill/records"
    n_boot: int = 2000
    seed: int = 0
    data_dir: str | None = None


def cascade_scores(full: np.ndarray, cos: np.ndarray, top: int, factor: float) -> np.ndarray:
    """One query's scores under a cascade of ``top``: :class:`CascadeRanker`'s rule on precomputed terms."""
    order = np.argsort(-cos, kind="stable")
    chosen, rest = order[:top], order[top:]
    out = np.empty(len(full))
    out[chosen] = full[chosen]
    if len(rest):
        out[rest] = full[chosen].min() - 1.0 - max(factor, 1.0) * (cos[rest].max() - cos[rest])
    return out


def ndcg_per_query(lists: list[dict], top: int | None, factor: float) -> dict[str, float]:
    """nDCG@10 of each list (``full``, ``cos``, ``ids``, ``relevant``) under the full score or a cascade."""
    from ragsieve.eval.ranking import ranking_metrics

    run, qrels = {}, {}
    for x in lists:
        s = x["full"] if top is None else cascade_scores(x["full"], x["cos"], top, factor)
        run[x["qid"]] = {i: float(v) for i, v in zip(x["ids"], s)}
        qrels[x["qid"]] = {i: 1 for i in x["ids"] if i in x["relevant"]} or {"-": 1}  # no relevant: a miss
    return ranking_metrics(qrels, run, ks=(10,), measures=("nDCG",), per_query=True)["nDCG@10"]


def dev_lists(name: str, config: CascadeStudyConfig, ranker, records: Path) -> list[dict]:
    """The dev lists of one set with the default's two terms per candidate, scored once and recorded."""
    from ragsieve.benchmarks.mining import held_out_sources, trained_question_ids
    from ragsieve.benchmarks.relevance import ranking_queries, split_questions
    from ragsieve.data import load_dataset
    from ragsieve.data.score_records import PairScores
    from ragsieve.registry import reranker_folder, reranker_scores_key

    source = held_out_sources()[name]
    ds = load_dataset(name, data_dir=config.data_dir)
    train, _ = split_questions(ds, source.model_copy(update={"train_questions": 10**9}), config.seed)
    trained = trained_question_ids(name, reranker_folder(config.reranker, "reranker"))
    questions = [q for q in train if q.id not in trained][: config.dev_queries]
    queries = ranking_queries(ds, questions, source)
    key = reranker_scores_key(config.reranker, whole_passages=False)
    cross_rec = PairScores(records / "dev-cross", name, {"scoring_key": key, "term": "cross-encoder logit"})
    cos_rec = PairScores(records / "dev-cosine", name, {"scoring_key": key, "term": "cosine"})
    out = []
    for n, q in enumerate(queries):
        ids = [p.id for p in q.candidates]
        cross, cos = cross_rec.lookup(q.query_id, ids), cos_rec.lookup(q.query_id, ids)
        if cross is None or cos is None:
            cross = ranker.cross_logits(q.query, list(q.candidates))
            cos = ranker.cosine.score(q.query, list(q.candidates))
            cross_rec.add([(q.query_id, i, float(s)) for i, s in zip(ids, cross)])
            cos_rec.add([(q.query_id, i, float(s)) for i, s in zip(ids, cos)])
        cross, cos = np.asarray(cross, float), np.asarray(cos, float)
        factor = ranker.weight * ranker.scale
        out.append({"qid": q.query_id, "ids": ids, "relevant": q.relevant, "cos": cos, "full": cross + factor * cos})
        if n % 25 == 0:
            log.info("cascade %s: dev list %d / %d", name, n, len(queries))
    return out


def heldout_lists(name: str, config: CascadeStudyConfig) -> list[dict]:
    """The held-out lists of one set from the committed records of the default's full score and cosine."""
    from ragsieve.benchmarks.forgetting import heldout_queries

    def read(kind: str) -> dict:
        path = Path(config.heldout_records) / f"eval-{kind}"
        out = {}
        for file in sorted(path.glob(f"{name}.*.jsonl.gz")):
            with gzip.open(file, "rt") as f:
                for line in f:
                    r = json.loads(line)
                    out[r["query_id"], r["passage_id"]] = r["score"]
        return out

    full, cos = read("teacher"), read("cosine")
    lists = []
    for q in heldout_queries(name, config.data_dir, config.seed):
        ids = [p.id for p in q.candidates]
        if all((q.query_id, i) in full and (q.query_id, i) in cos for i in ids):
            lists.append({"qid": q.query_id, "ids": ids, "relevant": q.relevant,
                          "full": np.array([full[q.query_id, i] for i in ids]),
                          "cos": np.array([cos[q.query_id, i] for i in ids])})
    return lists


class CascadeStudy:
    Config = CascadeStudyConfig

    def run(self, config: CascadeStudyConfig, out_dir: Path, console) -> dict:
        from ragsieve.eval.stats import paired_bootstrap
        from ragsieve.registry import load_reranker
        from studies.common import write_json

        out_dir.mkdir(parents=True, exist_ok=True)
        ranker = load_reranker(config.reranker, whole_passages=False)
        factor = ranker.weight * ranker.scale
        dev: dict[str, dict[str, Any]] = {}
        for name in config.datasets:
            lists = dev_lists(name, config, ranker, out_dir / "records")
            full = ndcg_per_query(lists, None, factor)
            dev[name] = {"n": len(lists), "full": float(np.mean(list(full.values()))),
                         "cascade": {str(t): float(np.mean(list(ndcg_per_query(lists, t, factor).values())))
                                     for t in config.tops}}
        ok = [t for t in config.tops
              if all(d["cascade"][str(t)] >= d["full"] - config.max_drop for d in dev.values())]
        chosen = min(ok) if ok else None
        heldout: dict[str, dict[str, Any]] = {}
        for name in config.datasets:
            lists = heldout_lists(name, config)
            full = ndcg_per_query(lists, None, factor)
            row = {"n": len(lists), "full": float(np.mean(list(full.values())))}
            for t in config.tops:
                cas = ndcg_per_query(lists, t, factor)
                qids = list(full)
                diff = paired_bootstrap(np.array([cas[q] for q in qids]), np.array([full[q] for q in qids]),
                                        n_boot=config.n_boot, seed=config.seed)
                row[str(t)] = {"ndcg10": float(np.mean(list(cas.values()))), "diff": diff.diff,
                               "ci95": [diff.low, diff.high]}
            heldout[name] = row
        result = {"chosen_top": chosen, "rule": f"smallest n within {config.max_drop} nDCG@10 of the full default "
                  "on every dev set", "dev": dev, "heldout": heldout, "cosine_factor": factor,
                  "stored_vectors": stored_vector_check(config, ranker, out_dir / "records")}
        write_json(out_dir / "metrics.json", result)
        write_report(out_dir, result, config)
        return result


def stored_vector_check(config: CascadeStudyConfig, ranker, records: Path) -> dict[str, Any]:
    """The default with an index's stored vectors (MiniLM in torch fp32, as ``ragsieve index`` encodes) against
    the default as it encodes passages itself (its shipped cosine backend), on the held-out lists: the two differ
    only in the cosine term, so each is the recorded full score with the other cosine swapped in. Per set: the
    largest score difference and nDCG@10 (stored − shipped) with a paired bootstrap over queries."""
    from ragsieve.benchmarks.forgetting import heldout_queries
    from ragsieve.data.score_records import PairScores
    from ragsieve.eval.stats import paired_bootstrap

    factor = ranker.weight * ranker.scale
    backend = getattr(ranker.cosine, "backend", "torch")
    out: dict[str, Any] = {"cosine_backend_shipped": backend, "index_encoder": "torch fp32"}
    for name in config.datasets:
        lists = heldout_lists(name, config)
        by_id = {q.query_id: q for q in heldout_queries(name, config.data_dir, config.seed)}
        shipped_rec = PairScores(records / "heldout-cosine-shipped", name, {"backend": backend})
        stored_lists, shipped_lists, max_diff = [], [], 0.0
        for x in lists:
            got = shipped_rec.lookup(x["qid"], x["ids"])
            if got is None:
                q = by_id[x["qid"]]
                got = [float(v) for v in ranker.cosine.score(q.query, list(q.candidates))]
                shipped_rec.add([(x["qid"], i, v) for i, v in zip(x["ids"], got)])
            shipped_cos = np.asarray(got, float)
            stored_lists.append(x)  # the recorded full score: fp32 cosine, as an index stores it
            shipped_lists.append({**x, "full": x["full"] - factor * x["cos"] + factor * shipped_cos})
            max_diff = max(max_diff, float(np.abs(factor * (x["cos"] - shipped_cos)).max()))
        a, b = ndcg_per_query(stored_lists, None, factor), ndcg_per_query(shipped_lists, None, factor)
        qids = list(a)
        diff = paired_bootstrap(np.array([a[q] for q in qids]), np.array([b[q] for q in qids]),
                                n_boot=config.n_boot, seed=config.seed)
        out[name] = {"n": len(qids), "max_score_diff": max_diff, "ndcg10_stored": float(np.mean(list(a.values()))),
                     "ndcg10_encoded": float(np.mean(list(b.values()))), "diff": diff.diff,
                     "ci95": [diff.low, diff.high]}
    return out


def write_report(out_dir: Path, result: dict, config: CascadeStudyConfig) -> None:
    tops = config.tops
    lines = ["# The embedded:fast cascade: how many candidates to cross-encode (issue #62)", "",
             "Generated by `ragsieve run experiments/cascade.yaml` (`studies/cascade.py`) from "
             "`metrics.json`. nDCG@10 of `embedded:base` (full) and of the cascade that cross-encodes only the "
             "best n candidates by MiniLM cosine (the rest below them in cosine order).", "",
             f"**Chosen n = {result['chosen_top']}**: {result['rule']}.", "",
             "## Dev lists (train-side questions `embedded:base` never trained on; the choice)", "",
             "| set | n | full | " + " | ".join(f"n={t}" for t in tops) + " |",
             "|---|---|---|" + "---|" * len(tops)]
    for name, d in result["dev"].items():
        lines.append(f"| {name} | {d['n']} | {d['full']:.4f} | " + " | ".join(
            f"{d['cascade'][str(t)]:.4f}" for t in tops) + " |")
    lines += ["", "## Held-out lists (the sets every reranker result reports; from the committed records)", "",
              "Cascade − full nDCG@10 with a paired-bootstrap 95 % interval over queries.", "",
              "| set | n | full | " + " | ".join(f"n={t}" for t in tops) + " |", "|---|---|---|" + "---|" * len(tops)]
    for name, h in result["heldout"].items():
        lines.append(f"| {name} | {h['n']} | {h['full']:.4f} | " + " | ".join(
            f"{h[str(t)]['diff']:+.4f} [{h[str(t)]['ci95'][0]:+.4f}, {h[str(t)]['ci95'][1]:+.4f}]" for t in tops)
            + " |")
    sv = result["stored_vectors"]
    lines += ["", "## Stored vectors (the default reading an index's vector instead of encoding the passage)", "",
              f"The index encodes with MiniLM in {sv['index_encoder']}; the default's own cosine runs on "
              f"`{sv['cosine_backend_shipped']}`. nDCG@10 with stored vectors − as it encodes itself, paired "
              "bootstrap over queries, and the largest change of a score (logit scale).", "",
              "| set | n | stored | encoded | diff [95 % CI] | max score change |", "|---|---|---|---|---|---|"]
    for name in config.datasets:
        r = sv[name]
        lines.append(f"| {name} | {r['n']} | {r['ndcg10_stored']:.4f} | {r['ndcg10_encoded']:.4f} | "
                     f"{r['diff']:+.4f} [{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}] | {r['max_score_diff']:.4f} |")
    (out_dir / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
