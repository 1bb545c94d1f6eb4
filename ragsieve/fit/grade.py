"""Phase 8 of ``ragsieve fit``: the grader's relevance threshold on the sieve's reranker, calibrated on dev.

Reads the sieve's reranker's rankings of every dev candidate (a passage that contains a gold answer counts
as relevant). Writes nothing: the state gets ``f1_thresholds`` (reranker spec → its F1-best threshold, one
of the grade thresholds the selection tries). :func:`save_grader` writes ``<out>/grader`` for the shipped
configuration at the evaluate phase.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ragsieve.fit.select import Choice
    from ragsieve.fit.state import FitState

log = logging.getLogger(__name__)


def calibrate_grade(state: "FitState") -> None:
    """The F1-best relevance threshold of the sieve's reranker on dev (a passage with a gold answer is
    relevant): one of the grade thresholds the selection tries."""
    from ragsieve.eval.classification import best_threshold

    state.f1_thresholds = {}
    if not state.config.grade:
        return
    scores, labels = [], []
    for q in state.splits["dev"]:  # every candidate, not only the top-k: both labels, more of them
        for i, score in state.rankings.ranked(state.reranker_spec, q):
            if state.candidates[q.id][i].text.strip():  # an empty passage is never graded relevant
                scores.append(score)
                labels.append(int(i in state.answer_bearing(q)))
    if len(set(labels)) < 2:
        log.warning("fit: dev passages are all %s: no grader threshold can be calibrated",
                    "relevant" if labels and labels[0] else "irrelevant")
        return
    # what RankerGrader.fit_threshold computes, on the scores the selection ranks by
    state.f1_thresholds[state.reranker_spec] = float(best_threshold(labels, scores, "f1"))
    state.progress("grade", 1, 1)


def save_grader(state: "FitState", choice: "Choice", how: str = "dev answer accuracy") -> Optional[str]:
    """The grader folder of the shipped configuration (its order's reranker and threshold), or None;
    ``how`` the threshold was chosen (recorded in the grader's config)."""
    import shutil

    from ragsieve.registry import new_grader

    shutil.rmtree(state.out / "grader", ignore_errors=True)
    if choice.threshold is None or choice.k == 0:
        return None
    grader = new_grader("ranker", base=state.ranker_base(choice.order))
    trained = {"threshold_metric": f"{how} ({choice.grade})",
               **({"ranker_weights": grader.ranker_weights} if grader.ranker_weights else {})}
    # the grader names its ranker relative to the sieve, so the folder can move
    base = "../reranker" if choice.order == "reranker" else choice.order
    grader.config = grader.config.model_copy(update={"threshold": choice.threshold, "trained": trained,
                                                     "base": base})
    grader.save(state.out / "grader")
    return "grader"
