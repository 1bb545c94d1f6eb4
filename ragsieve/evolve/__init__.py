"""Evolving LLM reranker (EVO-Reranker, issue #6): a pointwise verdict LLM that keeps
learning over rounds with SFT, DPO, ReplayDPO or CautiousDPO, and its deployment store.

The model itself is :class:`ragsieve.rerank.pointwise.PointwiseLLMReranker` (prompts in
:mod:`ragsieve.prompts.verdicts`, LoRA deltas in :mod:`ragsieve.models.lora`); this package
trains it. Modules: ``tasks`` (binary tasks and rounds), ``train`` (SFT / TRL DPO),
``verdict_dpo`` (the one-forward DPO loss), ``judges``, ``methods``, ``store`` (deployment
state, its rows in SQLite or PostgreSQL: :mod:`ragsieve.evolve_db`). ML libraries load inside
functions, so importing this stays light.
"""

from ragsieve.evolve.judges import JudgeSpec, build_judges
from ragsieve.evolve.methods import MethodConfig, build_method, evolve_round
from ragsieve.evolve.store import EvolveStoreConfig, add_feedback, init_store, run_step, store_status
from ragsieve.evolve.tasks import TaskRounds, build_task_rounds
from ragsieve.evolve.train import VerdictDPOTrainer, VerdictTrainConfig, train_round
from ragsieve.evolve.verdict_dpo import verdict_dpo_loss

__all__ = [
    "EvolveStoreConfig",
    "JudgeSpec",
    "MethodConfig",
    "TaskRounds",
    "VerdictDPOTrainer",
    "VerdictTrainConfig",
    "add_feedback",
    "build_judges",
    "build_method",
    "build_task_rounds",
    "evolve_round",
    "init_store",
    "run_step",
    "store_status",
    "train_round",
    "verdict_dpo_loss",
]
