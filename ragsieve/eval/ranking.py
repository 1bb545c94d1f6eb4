"""Ranking metrics (P@k, R@k, MRR@k, nDCG@k) computed with ranx.

Inputs are plain dicts in the TREC/ranx shape::

    qrels = {"q1": {"d1": 1, "d3": 2}}          # graded judgments, >= 1 is relevant
    run = {"q1": {"d1": 0.9, "d2": 0.4}}        # retrieval scores, higher is better

Behaviour worth knowing (checked against ranx 0.3.21):

* The mean is over the queries in ``qrels``. A query missing from ``run`` (or with an
  empty ranking) scores 0 on every metric; queries in ``run`` without qrels are ignored.
  ranx itself refuses mismatched query sets unless ``make_comparable=True`` is passed,
  which does the same thing; we do it before calling ranx.
* A query whose judgments are all 0 (no relevant document) scores 0 and still counts
  in the mean -- ranx does this, and so do we.
* ``P@k`` divides by ``k`` even when fewer than ``k`` documents were retrieved
  (P@10 of a 3-document ranking with one hit is 0.1); R, MRR and nDCG just use
  what is there.
* ``nDCG`` is ranx's ``ndcg``: linear gain (Järvelin & Kekäläinen), i.e.
  ``sum(rel_i / log2(i + 1))``, not the exponential ``2**rel - 1`` (``ndcg_burges``).
* Ties: ranx orders a query's documents with numba's (unstable) quicksort on the
  scores, so tied documents come out in an order that is an artefact of the sort
  (with ``Run`` 30 tied docs came out as d28, d27, ..., d0, d29). We break ties
  ourselves -- tied documents keep the order they have in the input dict (so the list
  order of :func:`run_from_rankings`) -- and hand ranx strictly decreasing scores.
* Cost: ``import ranx`` takes 3-5 s (numba, pandas), so it happens inside the function.
  The metric kernels are numba ``cache=True`` functions: the very first call in a fresh
  environment JIT-compiles them (~30-45 s on 2 cores) and writes the cache into ranx's
  ``__pycache__``; later processes load it in well under a second. We pass ranx numba
  typed lists (one of its documented input types) rather than ``Qrels``/``Run``
  objects, which skips the numba typed-dict code (another 2-3 s per process) and
  ranx's per-process randomised ``hash(doc_id)``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ragsieve.errors import DataError, RagsieveError

# Our short names -> ranx metric names.
RANX_METRICS: dict[str, str] = {
    "P": "precision",
    "R": "recall",
    "MRR": "mrr",
    "nDCG": "ndcg",
    "MAP": "map",
    "HR": "hit_rate",
}

Qrels = Mapping[str, Mapping[str, int]]
RunDict = Mapping[str, Mapping[str, float]]


def run_from_rankings(
    rankings: Mapping[str, Iterable[tuple[str, float]]],
) -> dict[str, dict[str, float]]:
    """Turn ``{qid: [(doc_id, score), ...]}`` (best first) into a run dict.

    The list order is kept, so tied scores are ranked in list order by
    :func:`ranking_metrics`. A doc id repeated within one ranking keeps its first
    (highest-ranked) occurrence.

    >>> run_from_rankings({"q1": [("d2", 0.9), ("d1", 0.9), ("d2", 0.1)]})
    {'q1': {'d2': 0.9, 'd1': 0.9}}
    """
    run: dict[str, dict[str, float]] = {}
    for qid, ranking in rankings.items():
        docs: dict[str, float] = {}
        for doc_id, score in ranking:
            if doc_id not in docs:
                docs[doc_id] = float(score)
        run[qid] = docs
    return run


def ranking_metrics(
    qrels: Qrels,
    run: RunDict,
    ks: Sequence[int] = (1, 3, 5, 10),
    measures: Sequence[str] = ("P", "R", "MRR", "nDCG"),
    per_query: bool = False,
) -> dict[str, float] | dict[str, dict[str, float]]:
    """Mean (or per-query) ranking metrics at each cutoff, computed by ranx.

    Args:
        qrels: ``{qid: {doc_id: grade}}``; grades >= 1 are relevant, nDCG uses the grade.
        run: ``{qid: {doc_id: score}}``, higher score = ranked higher.
        ks: cutoffs (positive ints).
        measures: names from :data:`RANX_METRICS` ("P", "R", "MRR", "nDCG", "MAP", "HR").
        per_query: return ``{metric: {qid: value}}`` (qids in qrels order) instead of means.

    Returns:
        ``{"P@1": ..., "P@3": ..., "R@1": ..., ...}`` -- measures outer, ks inner.

    >>> ranking_metrics({"q1": {"d1": 1}}, {"q1": {"d2": 0.9, "d1": 0.5}}, ks=(1, 2),
    ...                 measures=("P", "MRR"))
    {'P@1': 0.0, 'P@2': 0.5, 'MRR@1': 0.0, 'MRR@2': 0.5}
    """
    unknown = [m for m in measures if m not in RANX_METRICS]
    if unknown:
        raise RagsieveError(
            f"unknown ranking measure(s) {unknown}; use some of {sorted(RANX_METRICS)}"
        )
    bad_ks = [k for k in ks if isinstance(k, bool) or not isinstance(k, int) or k < 1]
    if bad_ks:
        raise RagsieveError(f"cutoffs must be positive integers, got {bad_ks}")
    if not qrels:
        raise DataError("qrels is empty: there are no queries to evaluate")
    if not ks or not measures:
        return {}

    qids = list(qrels)
    qrels_arrays, run_arrays = _to_arrays(qids, qrels, run)

    names = {f"{m}@{k}": f"{RANX_METRICS[m]}@{k}" for m in measures for k in ks}
    scores = _ranx_evaluate(qrels_arrays, run_arrays, list(names.values()))

    if per_query:
        return {
            ours: {qid: float(v) for qid, v in zip(qids, scores[theirs])}
            for ours, theirs in names.items()
        }
    return {ours: float(scores[theirs].mean()) for ours, theirs in names.items()}


def _to_arrays(qids: list[str], qrels: Qrels, run: RunDict) -> tuple[list[Any], list[Any]]:
    """Build ranx's array input: per query an (n, 2) float array of (doc number, value).

    Doc ids become small integers (exact in float64, identical across processes);
    qrels rows are sorted by grade (ranx computes the ideal DCG from them as given);
    run rows are ranked by (score desc, input order) and given scores n, n-1, ..., 1
    so ranx's own unstable sort has no ties to break.
    """
    import numpy as np

    doc_numbers: dict[str, int] = {}

    def doc_number(doc_id: str) -> float:
        return float(doc_numbers.setdefault(doc_id, len(doc_numbers)))

    qrels_arrays, run_arrays = [], []
    for qid in qids:
        judged = qrels[qid]
        rows = [(doc_number(d), _number(g, f"qrels[{qid!r}][{d!r}]")) for d, g in judged.items()]
        rows.sort(key=lambda r: -r[1])
        qrels_arrays.append(np.array(rows, dtype=np.float64).reshape(-1, 2))

        docs = {d: _number(s, f"run[{qid!r}][{d!r}]") for d, s in (run.get(qid) or {}).items()}
        ranked = sorted(docs, key=lambda d: -docs[d])  # stable: ties keep input order
        n = len(ranked)
        rows = [(doc_number(d), float(n - i)) for i, d in enumerate(ranked)]
        run_arrays.append(np.array(rows, dtype=np.float64).reshape(-1, 2))
    return qrels_arrays, run_arrays


def _number(value: Any, where: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if math.isnan(x):
        raise DataError(f"{where} = {value!r} is not a number")
    return x


def _ranx_evaluate(
    qrels_arrays: list[Any], run_arrays: list[Any], metrics: list[str]
) -> dict[str, Any]:
    """ranx.evaluate on typed lists; returns {ranx metric name: per-query score array}."""
    from numba.core.errors import NumbaTypeSafetyWarning
    from numba.typed import List as TypedList
    from ranx import evaluate

    if len(metrics) == 1:
        # ranx 0.3.21 bug: with a single metric, evaluate() looks its result up under
        # the metric name stripped of "@k" and raises KeyError. Asking twice avoids it.
        metrics = metrics * 2
    with warnings.catch_warnings():
        # ranx's prange kernels emit "unsafe cast from uint64 to int64" while compiling.
        warnings.simplefilter("ignore", NumbaTypeSafetyWarning)
        out = evaluate(
            TypedList(qrels_arrays),
            TypedList(run_arrays),
            metrics,
            return_mean=False,
            # One thread: per-query kernels take microseconds, and evaluate() would
            # otherwise keep whatever numba thread count was set last.
            threads=1,
            save_results_in_run=False,
        )
    return out
