"""Lightweight relevance grader: is this retrieved passage relevant to the query?

A small LLM with a classification head (the lightweight-grader paper), its baselines,
the grading dataset (retrieved top-5 with gold or LLM-judge labels) and the study that
compares them. :data:`GRADERS` maps each kind to its class ("module:Class", imported on
first use so ``import ragsieve.grade`` loads no ML code).

Example::

    from ragsieve.grade import load_grader, new_grader
    grader = new_grader("classifier")                     # config C on embedded SmolLM2
    grader.fit(queries, passages, labels)                 # GraderTrainConfig defaults
    grader.save("models/grader")
    load_grader("models/grader").grade("who wrote hamlet?", ["Hamlet is by Shakespeare."])
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ragsieve.errors import RagsieveError
from ragsieve.grade.base import GradeResult, GradeStats, Grader, GraderConfig, read_grader_config

GRADERS: dict[str, str] = {
    "prompted": "ragsieve.grade.lm:PromptedGrader",
    "generative": "ragsieve.grade.lm:GenerativeGrader",
    "head": "ragsieve.grade.lm:HeadGrader",
    "classifier": "ragsieve.grade.lm:ClassifierGrader",
    "lora": "ragsieve.grade.lm:LoraGrader",
    "cosine": "ragsieve.grade.baselines:CosineGrader",
    "cross-encoder": "ragsieve.grade.baselines:CrossEncoderGrader",
}


def grader_class(kind: str) -> type[Grader]:
    """The class registered for ``kind``; one-line error naming the known kinds."""
    try:
        module, _, name = GRADERS[kind].partition(":")
    except KeyError:
        raise RagsieveError(f"unknown grader kind '{kind}'; known: {', '.join(GRADERS)}") from None
    return getattr(importlib.import_module(module), name)


def new_grader(kind: str, base: str | None = None, **options: Any) -> Grader:
    """A fresh (untrained) grader of ``kind`` on ``base`` (default: the kind's default model).

    ``options`` are :class:`GraderConfig` fields (``max_length``, ``lora_r``, ...).

    Example::

        new_grader("lora", lora_r=16, lora_alpha=32, max_passage_tokens=192)
    """
    from ragsieve.config import build_config

    cls = grader_class(kind)
    base = base or cls.default_base
    if not base:
        raise RagsieveError(f"a '{kind}' grader needs a base model")
    config = build_config(GraderConfig, {"kind": kind, "base": cls.normalize_base(base), **options}, "grader options")
    return cls.create(config)


def load_grader(path: str | Path, base: str | None = None) -> Grader:
    """Load a grader saved with :meth:`Grader.save`.

    ``base``, when given, must be the model the grader was trained on; a grader is
    refused on any other base (its weights would be meaningless there).
    """
    config = read_grader_config(path)
    cls = grader_class(config.kind)
    if base is not None and cls.normalize_base(base) != config.base:
        raise RagsieveError(
            f"grader at {path} was trained on '{config.base}', not '{cls.normalize_base(base)}'; "
            "train one for that model"
        )
    return cls.load(path, config)


__all__ = [
    "GRADERS",
    "GradeResult",
    "GradeStats",
    "Grader",
    "GraderConfig",
    "grader_class",
    "load_grader",
    "new_grader",
]
