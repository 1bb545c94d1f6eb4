"""Evolving LLM reranker (EVO-Reranker, issue #6): a pointwise verdict LLM that keeps
learning over rounds with SFT, DPO, ReplayDPO or CautiousDPO, and its deployment store.

Modules: ``templates`` (prompts as data), ``tasks`` (binary tasks and rounds),
``reranker`` (:class:`PointwiseLLMReranker`), ``lora`` (round deltas), ``train`` (SFT /
TRL DPO), ``verdict_dpo`` (the one-forward DPO loss), ``judges``, ``methods``, ``store``
(SQLite deployment state), ``cli`` (``ragsieve evolve``), ``experiment``.
Names below are imported on first use, so ``import ragsieve.evolve`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "VerdictTemplate": "templates",
    "load_templates": "templates",
    "get_template": "templates",
    "verdict_tokens": "templates",
    "VerdictExample": "tasks",
    "TaskRounds": "tasks",
    "build_task_rounds": "tasks",
    "PointwiseLLMReranker": "reranker",
    "VerdictScores": "reranker",
    "VerdictTrainConfig": "train",
    "train_round": "train",
    "VerdictDPOTrainer": "verdict_dpo",
    "verdict_dpo_loss": "verdict_dpo",
    "JudgeSpec": "judges",
    "build_judges": "judges",
    "MethodConfig": "methods",
    "build_method": "methods",
    "evolve_round": "methods",
    "EvolveStoreConfig": "store",
    "init_store": "store",
    "run_step": "store",
    "add_feedback": "store",
    "store_status": "store",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ragsieve.evolve' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ragsieve.evolve.{_EXPORTS[name]}"), name)
