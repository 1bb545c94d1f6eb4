"""Confidence-Based Dynamic Retrieval (CBDR).

If the probe's closed-book confidence Conf(Q) exceeds β the LLM answers without
retrieval; otherwise the pipeline retrieves (and reranks). Sweeping β trades accuracy
against the retrieval rate (RR, the share of questions that retrieved).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from ragsieve.errors import RagsieveError

if TYPE_CHECKING:
    from ragsieve.probe.model import ConfidenceProbe


@dataclass(frozen=True)
class GateDecision:
    confidence: float
    retrieve: bool


class CBDRGate:
    """Retrieve only when Conf(Q) ≤ β.

    Example::

        gate = CBDRGate(ConfidenceProbe.load("embedded:smollm2-nq", llm), beta=0.9)
        gate.decide_many(["who wrote hamlet?"])[0].retrieve
    """

    def __init__(self, probe: "ConfidenceProbe", beta: float):
        if not 0.0 <= beta <= 1.0:
            raise RagsieveError(f"CBDR beta must be in [0, 1], got {beta}")
        self.probe = probe
        self.beta = beta

    def decide_many(self, questions: Sequence[str]) -> list[GateDecision]:
        conf = self.probe.score_batch(list(questions))
        return [GateDecision(float(c), bool(c <= self.beta)) for c in conf]


def gate_accuracy(
    confidence: np.ndarray, closed_correct: np.ndarray, rag_correct: np.ndarray, beta: float
) -> tuple[float, float]:
    """(accuracy, retrieval rate) when questions with Conf(Q) > β skip retrieval."""
    confidence = np.asarray(confidence, dtype=float)
    if not (len(confidence) == len(closed_correct) == len(rag_correct)) or len(confidence) == 0:
        raise RagsieveError("gate_accuracy: confidence and correctness arrays must be non-empty and equal length")
    retrieve = confidence <= beta
    correct = np.where(retrieve, rag_correct, closed_correct)
    return float(np.mean(correct)), float(np.mean(retrieve))


def sweep_cbdr(
    confidence: np.ndarray,
    closed_correct: np.ndarray,
    rag_correct_by_k: Mapping[int, np.ndarray],
    betas: Sequence[float],
) -> list[dict]:
    """One row per (β, top-k): ``{beta, top_k, rr, accuracy}``."""
    rows = []
    for k, rag in sorted(rag_correct_by_k.items()):
        for beta in betas:
            acc, rr = gate_accuracy(confidence, closed_correct, rag, beta)
            rows.append({"beta": float(beta), "top_k": int(k), "rr": rr, "accuracy": acc})
    return rows


def skip_at_parity(
    confidence: np.ndarray,
    closed_correct: np.ndarray,
    rag_correct: np.ndarray,
    betas: Sequence[float] | None = None,
    tolerance: float = 0.005,
) -> dict:
    """Largest share of retrievals skipped while accuracy stays within ``tolerance`` of always retrieving.

    ``betas`` defaults to every distinct confidence value (the finest possible grid).
    """
    confidence = np.asarray(confidence, dtype=float)
    always = float(np.mean(rag_correct))
    candidates = sorted(set(betas) if betas is not None else set(confidence.tolist()) | {1.0})
    best = {"skip": 0.0, "beta": 1.0, "accuracy": always, "always_retrieve_accuracy": always}
    for beta in candidates:
        acc, rr = gate_accuracy(confidence, closed_correct, rag_correct, beta)
        if always - acc <= tolerance + 1e-12 and 1 - rr > best["skip"]:
            best = {"skip": 1 - rr, "beta": float(beta), "accuracy": acc, "always_retrieve_accuracy": always}
    return best
