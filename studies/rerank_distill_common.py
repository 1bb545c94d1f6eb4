"""What the three rerank_distill studies share (``experiments/rerank_distill.yaml`` runs them together).

:mod:`studies.rerank_distill` distils the shipped teacher into students, :mod:`studies.rerank_distill_backends`
runs the teacher itself on faster forwards and longer windows, and :mod:`studies.rerank_distill_calibration`
measures how far one calibration goes. All three read the same held-out evaluation rows: rankers whose scores
are remembered (and recorded by query and passage id), the teacher's identity that the records are tied to,
the shortfall rule and the table cells.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ragsieve.errors import RagsieveError
from ragsieve.rerank.base import BaseRanker

CROSS_ALONE = "teacher-cross-encoder"  # the teacher without its cosine term (a reference row, never shipped)


class Remembered(BaseRanker):
    """A ranker whose scores are remembered per (query, passages): nDCG and ECE read one pass.

    With ``records`` (a :class:`~ragsieve.data.score_records.PairScores`) and ``query_ids`` (query text →
    id), scores are also read from and added to the records by (query id, passage id).
    """

    def __init__(self, inner, name: str, records=None, query_ids: dict[str, str] | None = None) -> None:
        self.inner, self.name = inner, name
        self.score_is_probability = inner.score_is_probability
        self.calibration = getattr(inner, "calibration", None)
        self.memo: dict = {}
        self.records, self.query_ids = records, query_ids or {}

    def score(self, query, passages):
        key = (query, tuple(p.full_text for p in passages))
        if key not in self.memo:
            qid = self.query_ids.get(query) if self.records is not None else None
            got = self.records.lookup(qid, [p.id for p in passages]) if qid is not None else None
            if got is None:
                got = np.asarray(self.inner.score(query, passages), dtype=float)
                if qid is not None:
                    self.records.add((qid, p.id, s) for p, s in zip(passages, got))
            self.memo[key] = np.asarray(got, dtype=float)
        return self.memo[key]


def shortfall(by_dataset: dict[str, dict], key: str, tolerance: float) -> str:
    """Why ranker ``key`` misses a student's targets ("" if it meets them): more than ``tolerance`` nDCG@10
    below the teacher on a set (point estimate), or measurably below MiniLM cosine (interval under 0)."""
    from ragsieve.eval.stats import target_verdict

    short, below = [], []
    for name, rows in by_dataset.items():
        d = rows[key]["vs_teacher"]
        if target_verdict(d["diff"], d["low"], d["high"], -tolerance) == "missed":
            short.append(f"{name} {d['diff']:+.3f}")
        c = rows[key]["vs_cosine"]
        if c["high"] < 0:
            below.append(f"{name} {c['diff']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]")
    return "; ".join(filter(None, [f"more than {tolerance} below the teacher on {', '.join(short)}" if short else "",
                                   f"measurably below cosine on {', '.join(below)}" if below else ""]))


def teacher_identity(teacher: Path) -> dict:
    """What makes the teacher's logits what they are: its weights' sha256 and its truncation length."""
    from ragsieve.artifacts import file_sha256
    from ragsieve.rerank.shipped import read_card

    weights = sorted(teacher.glob("*.safetensors")) or sorted(teacher.glob("pytorch_model*.bin"))
    if not weights:
        raise RagsieveError(f"{teacher}: no weights file (*.safetensors or pytorch_model*.bin)")
    return {"weights_sha256": {w.name: file_sha256(w) for w in weights},
            "max_length": int(read_card(teacher).get("max_length", 256))}


def teacher_scores_identity(encoder: str, teacher: Path) -> dict:
    """What the teacher's recorded held-out scores (``<records>/eval-teacher``) are tied to."""
    from ragsieve.rerank.shipped import read_card

    card = read_card(teacher)
    return {**teacher_identity(teacher), "encoder": encoder, "score": "mixed",
            "cosine_weight": float(card.get("cosine_weight", 0.0)),
            "cosine_scale": float(card.get("cosine_scale", 20.0))}


def cell_mean(d: dict | None) -> str:
    """A table cell: an evaluation row's mean ("–" when the row is absent)."""
    return "–" if d is None else f"{d['mean']:.3f}"


def cell_interval(d: dict | None) -> str:
    """A table cell: mean and 95 % interval."""
    return "–" if d is None else f"{d['mean']:.3f} [{d['low']:.3f}, {d['high']:.3f}]"


def cell_diff(d: dict | None) -> str:
    """A table cell: a paired difference and its 95 % interval."""
    return "–" if d is None else f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
