"""``embedded:base``: ragsieve's own base cross-encoder, trained once and cached.

All-MiniLM-L6-v2 with a new 1-logit head, trained with :func:`train_cross_encoder`
(InfoNCE, 1 gold positive vs 7 negatives) on :mod:`ragsieve.benchmarks.relevance` groups.
The folder is a standard sentence-transformers CrossEncoder, so
``CrossEncoder(path)`` loads it outside ragsieve too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

from pydantic import Field

from ragsieve.artifacts import cache_rebuild, check_model_folder
from ragsieve.atomic import atomic_directory
from ragsieve.config import StrictConfig
from ragsieve.paths import cache_dir
from ragsieve.prefs.preferences import PreferenceRecord
from ragsieve.benchmarks.relevance import RelevanceSource, default_sources, split_questions, training_groups
from ragsieve.rerank.training.trainer import CrossEncoderTrainConfig

log = logging.getLogger(__name__)

CARD_FILE = "ragsieve_base.json"


def _base_train_config() -> CrossEncoderTrainConfig:
    # lr 6e-5 barely moves a fresh head in one epoch on this data (NOTES: 2e-5 did not move at all)
    return CrossEncoderTrainConfig(lr=1e-4, group_size=8)


class BaseRerankerConfig(StrictConfig):
    sources: dict[str, RelevanceSource] = Field(default_factory=default_sources)
    negatives: int = 7
    train: CrossEncoderTrainConfig = Field(default_factory=_base_train_config)
    seed: int = 0

    def digest(self) -> str:
        return hashlib.sha1(self.model_dump_json().encode()).hexdigest()[:10]


def base_training_groups(config: BaseRerankerConfig, data_dir=None) -> dict[str, list[PreferenceRecord]]:
    """Gold relevance groups per dataset, from train questions only."""
    from ragsieve.data import load_dataset

    groups = {}
    for name, source in config.sources.items():
        ds = load_dataset(name, data_dir=data_dir)
        train, _ = split_questions(ds, source, config.seed)
        groups[name] = training_groups(ds, train, source, config.negatives, config.seed)
    return groups


def train_base_reranker(config: BaseRerankerConfig, out_dir: str | Path, data_dir=None) -> Path:
    """Build the groups, train, and write the folder plus a card with the group counts."""
    from ragsieve.rerank.training.trainer import train_cross_encoder

    groups = base_training_groups(config, data_dir)
    records = [r for recs in groups.values() for r in recs]
    log.info("base reranker: %s groups", {k: len(v) for k, v in groups.items()})
    out_dir = Path(out_dir)
    train_cross_encoder(records, config.train, out_dir)
    shutil.rmtree(out_dir / "checkpoints", ignore_errors=True)
    card = {
        "config": config.model_dump(),
        "groups": {k: len(v) for k, v in groups.items()},
        "positives": {k: sum(len(r.pos) for r in v) for k, v in groups.items()},
    }
    (out_dir / CARD_FILE).write_text(json.dumps(card, indent=2))
    return out_dir


def cached_base_reranker_dir(config: BaseRerankerConfig | None = None) -> Path:
    """Where :func:`ensure_base_reranker` trains ``config``'s base reranker (the shipped one is
    :func:`ragsieve.rerank.shipped.base_reranker_dir`)."""
    config = config or BaseRerankerConfig()
    return cache_dir() / "models" / f"base-reranker-{config.digest()}"


def ensure_base_reranker(config: BaseRerankerConfig | None = None, data_dir=None) -> Path:
    """The cached base reranker folder, training it first (≈15 min on 2 cores) if absent.

    Concurrent callers wait on a file lock; the folder appears atomically.
    """
    from filelock import FileLock

    config = config or BaseRerankerConfig()
    target = cached_base_reranker_dir(config)
    if (target / CARD_FILE).exists():
        check_model_folder(target, cache_rebuild(target) + " (about 15 min of training)")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / CARD_FILE).exists():
            return target
        log.warning("training the base reranker once into %s (about 15 min on 2 cores)", target)
        # overwrite: under the lock, a target without its card is broken, not someone's work
        with atomic_directory(target, overwrite=True) as tmp:
            train_base_reranker(config, tmp, data_dir)
    return target
