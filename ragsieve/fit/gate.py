"""Phase 5 of ``ragsieve fit``: the gate's β, retrieve only when the probe's Conf(Q) ≤ β.

Reads the dev questions' Conf(Q) (the probe) and the label phase's closed-book and top-k correctness.
``gate: parity`` picks the β that skips the most retrievals while the accuracy lost stays within
``parity_tolerance`` at ``parity_confidence``; a budget (``budget=0.3``) puts β at that quantile of Conf(Q);
``none`` and an endpoint (no probe) leave β None. Writes nothing: it is recomputed on resume. The state gets
``beta`` and ``gate_dev`` (the parity search's result, or None).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ragsieve.fit.config import gate_budget
from ragsieve.fit.probe import closed_book_confidence

if TYPE_CHECKING:
    from ragsieve.fit.state import FitState


def choose_beta(state: "FitState") -> None:
    from ragsieve.gate.cbdr import skip_at_parity

    dev = state.splits["dev"]
    state.gate_dev = None
    if state.probe is None:  # an endpoint: no Conf(Q)
        state.beta = None
        return
    conf = closed_book_confidence(state, dev)
    closed = np.array([state.closed[q.id] for q in dev])
    plain = np.array([state.plain[q.id] for q in dev])
    budget = gate_budget(state.config.gate)
    if state.config.gate == "none":
        state.beta = None
    elif budget is not None:
        # retrieve when Conf(Q) <= β: β at the budget's quantile retrieves for that share
        state.beta = 1.0 if budget >= 1.0 else float(np.quantile(conf, budget))
    else:
        best = skip_at_parity(conf, closed, plain, tolerance=state.config.parity_tolerance,
                              confidence_level=state.config.parity_confidence)
        state.beta = float(best["beta"])
        state.gate_dev = {**best, "n": len(dev), "tolerance": state.config.parity_tolerance,
                          "confidence_level": state.config.parity_confidence}
    state.progress("gate", 1, 1)
