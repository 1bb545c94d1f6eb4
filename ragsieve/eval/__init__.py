"""Evaluation: ranking (ranx), classification (scikit-learn), QA answers, calibration.

Importing this package is cheap: ranx (~4 s, numba), scikit-learn (~2 s) and
matplotlib (~1 s) are imported inside the functions that use them.
"""

from __future__ import annotations

from ragsieve.eval.calibration import (
    ReliabilityBin,
    expected_calibration_error,
    plot_reliability_diagram,
    reliability_bins,
)
from ragsieve.eval.classification import (
    accuracy_interval,
    best_threshold,
    classification_metrics,
    plot_confusion_matrix,
)
from ragsieve.eval.qa import contains_answer, exact_match, normalize_answer, qa_metrics, token_f1
from ragsieve.eval.ranking import RANX_METRICS, ranking_metrics, run_from_rankings

__all__ = [
    "RANX_METRICS",
    "ReliabilityBin",
    "accuracy_interval",
    "best_threshold",
    "classification_metrics",
    "contains_answer",
    "exact_match",
    "expected_calibration_error",
    "normalize_answer",
    "plot_confusion_matrix",
    "plot_reliability_diagram",
    "qa_metrics",
    "ranking_metrics",
    "reliability_bins",
    "run_from_rankings",
    "token_f1",
]
