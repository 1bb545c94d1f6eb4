"""Cross-encoder training on preference groups with sentence-transformers' trainer.

A group is (query, positive, [negatives]) — the FlagEmbedding shape — and the loss is
:class:`~ragsieve.rerank.losses.GroupInfoNCELoss`. Used for the base reranker (gold
relevance data) and the LLM-aligned one (confidence-shift preferences).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Sequence

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.prefs.preferences import PreferenceRecord


class CrossEncoderTrainConfig(StrictConfig):
    """Defaults from the knowledge-boundary paper (lr 6e-5, wd 0.01, 1 epoch)."""

    init: str = DEFAULT_ENCODER  # an encoder spec or a cross-encoder folder
    group_size: int = 8  # 1 positive + 7 negatives
    temperature: float = 1.0
    lr: float = 6e-5
    weight_decay: float = 0.01
    epochs: float = 1.0
    batch_size: int = 8  # groups per step
    query_max_tokens: int = 128
    max_length: int = 512  # query + passage
    warmup_ratio: float = 0.1
    seed: int = 0
    # Trained in fp32, saved in fp16: half the disk (a sieve ships within 50 MB) and the
    # scores differ by < 1e-3 once loaded back in fp32.
    save_fp16: bool = False


def group_rows(records: Sequence[PreferenceRecord], group_size: int, seed: int = 0) -> list[dict[str, str]]:
    """One row per positive: ``query, positive, negative_1..negative_{group_size-1}``.

    Groups with fewer negatives than needed are filled by resampling their own
    negatives (every row needs the same number of columns).
    """
    if group_size < 2:
        raise RagsieveError(f"group_size must be >= 2 (1 positive + negatives), got {group_size}")
    rng = random.Random(seed)
    rows = []
    for rec in records:
        if not rec.neg:
            continue
        for pos in rec.pos:
            negs = rng.sample(rec.neg, min(len(rec.neg), group_size - 1))
            while len(negs) < group_size - 1:
                negs.append(rng.choice(rec.neg))
            row = {"query": rec.query, "positive": pos}
            row.update({f"negative_{i + 1}": n for i, n in enumerate(negs)})
            rows.append(row)
    return rows


def train_cross_encoder(
    records: Sequence[PreferenceRecord], config: CrossEncoderTrainConfig, out_dir: str | Path
) -> Path:
    """Fine-tune a 1-logit cross-encoder on preference groups and save it to ``out_dir``.

    Example::

        train_cross_encoder(read_preferences("prefs.jsonl"), CrossEncoderTrainConfig(), "models/aligned")
        load_reranker("cross-encoder:models/aligned")
    """
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import (
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )

    from ragsieve.models.encoder import resolve_encoder_path
    from ragsieve.rerank.losses import GroupInfoNCELoss

    rows = group_rows(records, config.group_size, config.seed)
    if not rows:
        raise RagsieveError("no training groups: every record needs at least one positive and one negative")
    init = config.init if Path(config.init).exists() else resolve_encoder_path(config.init)
    # From a bi-encoder folder, CrossEncoder keeps the BERT weights and adds a new 1-logit head.
    # fp32 on CPU even from the shipped fp16 weights: fp16 training on CPU is slow and lossy
    model = CrossEncoder(init, num_labels=1, max_length=config.max_length, device="cpu",
                         model_kwargs={"dtype": torch.float32})
    out_dir = Path(out_dir)
    args = CrossEncoderTrainingArguments(
        output_dir=str(out_dir / "checkpoints"),
        num_train_epochs=config.epochs,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.lr,
        weight_decay=config.weight_decay,
        warmup_ratio=config.warmup_ratio,
        seed=config.seed,
        save_strategy="no",
        report_to="none",
        logging_steps=10,
        use_cpu=True,
        dataloader_drop_last=False,
    )
    # The paper caps queries at 128 tokens separately from passages.
    truncated = [
        {**r, "query": _truncate(model.tokenizer, r["query"], config.query_max_tokens)} for r in rows
    ]
    trainer = CrossEncoderTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(truncated),
        loss=GroupInfoNCELoss(model, temperature=config.temperature),
    )
    trainer.train()
    if config.save_fp16:
        model.model.half()
    model.save_pretrained(str(out_dir))
    (out_dir / "README.md").unlink(missing_ok=True)  # the auto card describes a generic CrossEncoder
    return out_dir


def _truncate(tokenizer, text: str, max_tokens: int) -> str:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])
