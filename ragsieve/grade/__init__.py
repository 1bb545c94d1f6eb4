"""Lightweight relevance grader: is this retrieved passage relevant to the query?

A grader is a ranker plus a threshold. The small-LLM configurations of the
lightweight-grader paper live in :mod:`.lm` (prompted, A generative, B head, C classifier,
C + LoRA), any reranker with a tuned threshold in :mod:`.ranker`; :mod:`.dataset` builds
the grading pairs, :mod:`.judge` labels them with an LLM teacher, :mod:`.train` trains.
Graders are built and loaded through :mod:`ragsieve.registry`.

Example::

    from ragsieve.registry import load_grader, new_grader
    grader = new_grader("classifier")                     # config C on embedded SmolLM2
    grader.fit(queries, passages, labels)                 # GraderTrainConfig defaults
    grader.save("models/grader")
    load_grader("models/grader").grade("who wrote hamlet?", ["Hamlet is by Shakespeare."])
"""

from ragsieve.grade.base import GradeResult, GradeStats, Grader, GraderConfig, read_grader_config
from ragsieve.grade.ranker import RankerGrader

__all__ = [
    "GradeResult",
    "GradeStats",
    "Grader",
    "GraderConfig",
    "RankerGrader",
    "read_grader_config",
]
