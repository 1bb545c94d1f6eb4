"""Training a keep head: :class:`KeepHeadTrainingConfig` + :class:`KeepHeadTrainer`.

The trunk (the cross-encoder's frozen lower layers) reads every training passage once; its states are cached in
``work_dir`` so a rerun or a resumed run reads instead of encoding. Only the branch trains: a pointwise loss
(binary cross-entropy of each sentence's keep logit) and a listwise one (softmax over the sentences of one
passage against its gold sentences), since a pruner keeps a passage's best sentences. With ``across_weight`` a
third term, a softmax over *all* the sentences of one question's passages, puts a question's sentences from
different passages on one scale, as a pruner cutting across passages needs (issue #69); batches then hold whole
questions. The epoch with the best mean average precision of the gold sentences — within their passage, or over
the question's passages with ``across_weight`` — on a dev share of the questions, is kept.
Each epoch is checkpointed: a run killed with ``kill -9`` goes on from its last finished epoch.

Example::

    head = SentenceKeepHead.untrained(branch_layers=2)
    examples = [KeepExample("q1", "who wrote hamlet?", Passage("p", "Hamlet is a play. Shakespeare wrote it.",
                                                            "Hamlet"), ((0, 17), (18, 39)), (0, 1))]
    KeepHeadTrainer(head, KeepHeadTrainingConfig(epochs=1)).train(examples)
    head.save("prune_head.safetensors")
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from pydantic import Field

from ragsieve.config import StrictConfig
from ragsieve.data.records import Passage
from ragsieve.progress import report
from ragsieve.prune.head import SentenceKeepHead, TrunkStates

log = logging.getLogger(__name__)


def _digest(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


#: a sentence counts as one to keep for the dev metric (average precision) when its label is at least this
KEEP_LABEL = 0.5


@dataclass(frozen=True)
class KeepExample:
    """One training passage: its sentences' character spans in ``passage.text`` and a keep label each, 1 / 0
    from annotations (supporting facts, answer sentences) or graded in [0, 1] (what a sentence does to an LLM's
    answer: :mod:`ragsieve.fit.sentences`); the losses take them as soft targets. ``group`` (the question) keeps
    a question's passages on one side of the dev split."""

    group: str
    query: str
    passage: Passage
    spans: tuple[tuple[int, int], ...]
    labels: tuple[float, ...]


class KeepHeadTrainingConfig(StrictConfig):
    epochs: int = Field(3, ge=1)
    learning_rate: float = Field(3e-5, gt=0)  # the branch's copied layers
    classifier_learning_rate: float = Field(1e-3, gt=0)  # its token classifier, which starts at zero
    batch_size: int = Field(16, ge=1)
    listwise_weight: float = Field(1.0, ge=0)
    # softmax over every sentence of a question's passages against its gold sentences (0: off, batches of passages)
    across_weight: float = Field(0.0, ge=0)
    dev_share: float = Field(0.1, gt=0, lt=1)  # of the questions (groups), for choosing the epoch
    seed: int = 0


class KeepHeadTrainer:
    """Trains ``head``'s branch in place on :class:`KeepExample` rows; ``work_dir`` holds the trunk-state cache
    and the per-epoch checkpoints (none: no cache, no resume)."""

    def __init__(self, head: SentenceKeepHead, config: KeepHeadTrainingConfig | None = None,
                 work_dir: str | Path | None = None):
        self.head, self.config = head, config or KeepHeadTrainingConfig()
        self.work_dir = Path(work_dir) if work_dir is not None else None

    def train(self, examples: Sequence[KeepExample]) -> dict[str, Any]:
        """Train, keep the best epoch's branch in ``head``, and say how each epoch did on dev."""
        import torch

        states_key = self._states_key(examples)
        # a checkpoint belongs to these states, these labels (a fit's labels change with its signal on the same
        # passages), this config (but for the epochs: a run may be extended) and the branch's shape
        checkpoint = None if self.work_dir is None else self.work_dir / "checkpoint-{}.pt".format(_digest(
            [states_key, [e.labels for e in examples], self.config.model_dump(exclude={"epochs"}),
             len(self.head.branch.layers)]))
        read = self._trunk_states(examples, states_key)
        train, dev = self._split(examples)
        branch = self.head.branch
        groups = [{"params": list(branch.classifier.parameters()), "lr": self.config.classifier_learning_rate}]
        if len(branch.layers):
            groups.append({"params": list(branch.layers.parameters()), "lr": self.config.learning_rate})
        optimizer = torch.optim.AdamW(groups, weight_decay=0.01)
        state = self._resume(checkpoint, optimizer)
        report("keep head epochs", state["epoch"], self.config.epochs)
        for epoch in range(state["epoch"], self.config.epochs):
            branch.train()
            losses = [self._step(optimizer, [examples[i] for i in batch], [read[i] for i in batch])
                      for batch in self._batches(train, read, epoch, examples)]
            branch.eval()
            score = self._dev_map([examples[i] for i in dev], [read[i] for i in dev])
            state["history"].append({"epoch": epoch + 1, "train_loss": float(np.mean(losses)), "dev_map": score})
            log.info("keep head: epoch %d, loss %.4f, dev MAP %.4f", epoch + 1, np.mean(losses), score)
            report("keep head epochs", epoch + 1, self.config.epochs)
            if score > state["best_map"]:
                state["best_map"], state["best"] = score, {k: v.clone() for k, v in branch.state_dict().items()}
            state["epoch"] = epoch + 1
            self._checkpoint(checkpoint, state, optimizer)
        branch.load_state_dict(state["best"])
        branch.eval()
        best = max(state["history"], key=lambda h: h["dev_map"])
        return {"epochs": state["history"], "chosen_epoch": best["epoch"], "dev_map": best["dev_map"],
                "n_train_passages": len(train), "n_dev_passages": len(dev),
                "n_sentences": int(sum(len(e.labels) for e in examples)),
                "positives": int(sum(y >= KEEP_LABEL for e in examples for y in e.labels)),
                "n_questions": len({e.group for e in examples})}

    # -- the steps ---------------------------------------------------------------------------------
    def _step(self, optimizer, batch: list[KeepExample], read: list[TrunkStates]) -> float:
        import torch
        import torch.nn.functional as F

        from ragsieve.prune.branch import sentence_logits

        logits = sentence_logits(self.head.branch, [r.states for r in read], [r.sentence_of_token for r in read],
                                 [r.n_sentences for r in read])
        pointwise, listwise, across = [], [], []
        for group in self._by_question(batch) if self.config.across_weight else []:
            s = torch.cat([logits[i] for i in group])
            y = torch.cat([torch.tensor(batch[i].labels, dtype=torch.float32) for i in group])
            ok = torch.isfinite(s)
            if y[ok].sum() > 0 and len(group) > 1:
                across.append(-(y[ok] / y[ok].sum() * torch.log_softmax(s[ok], 0)).sum())
        for example, s in zip(batch, logits):
            y = torch.tensor(example.labels, dtype=torch.float32)
            ok = torch.isfinite(s)
            if not ok.any():
                continue
            pointwise.append(F.binary_cross_entropy_with_logits(s[ok], y[ok], reduction="sum"))
            if y[ok].sum() > 0:
                target = y[ok] / y[ok].sum()
                listwise.append(-(target * torch.log_softmax(s[ok], 0)).sum())
        if not pointwise:
            return 0.0
        n_sentences = sum(int(torch.isfinite(s).sum()) for s in logits)
        loss = torch.stack(pointwise).sum() / max(n_sentences, 1)
        if listwise and self.config.listwise_weight:
            loss = loss + self.config.listwise_weight * torch.stack(listwise).mean()
        if across:
            loss = loss + self.config.across_weight * torch.stack(across).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.branch.parameters(), 1.0)
        optimizer.step()
        return float(loss.detach())

    def _dev_map(self, examples: list[KeepExample], read: list[TrunkStates]) -> float:
        """Mean average precision of the sentences to keep (label ≥ :data:`KEEP_LABEL`) within each dev passage
        that has one (with ``across_weight``: over all of a dev question's passages together)."""
        from sklearn.metrics import average_precision_score

        scores = [np.nan_to_num(s, neginf=-1e9) for s in self.head.sentence_logits(read)]
        units = self._by_question(examples) if self.config.across_weight else [[i] for i in range(len(examples))]
        aps = []
        for unit in units:
            labels = [int(y >= KEEP_LABEL) for i in unit for y in examples[i].labels]
            if 0 < sum(labels) < len(labels):
                aps.append(average_precision_score(labels, np.concatenate([scores[i] for i in unit])))
        return float(np.mean(aps)) if aps else 0.0

    @staticmethod
    def _by_question(examples: Sequence[KeepExample]) -> list[list[int]]:
        """Positions of ``examples`` grouped by question, in first-seen order."""
        groups: dict[str, list[int]] = {}
        for i, e in enumerate(examples):
            groups.setdefault(e.group, []).append(i)
        return list(groups.values())

    def _split(self, examples: Sequence[KeepExample]) -> tuple[list[int], list[int]]:
        groups = sorted({e.group for e in examples})
        rng = np.random.default_rng(self.config.seed)
        dev_groups = set(rng.choice(groups, size=max(1, int(len(groups) * self.config.dev_share)), replace=False))
        dev = [i for i, e in enumerate(examples) if e.group in dev_groups]
        return [i for i, e in enumerate(examples) if e.group not in dev_groups], dev

    def _batches(self, indices: list[int], read: list[TrunkStates], epoch: int,
                 examples: Sequence[KeepExample] = ()) -> list[list[int]]:
        """Batches of passages of similar length (less padding), in a shuffled order that depends on the epoch;
        with ``across_weight``, whole questions (about ``batch_size`` passages a batch) of similar length."""
        rng = np.random.default_rng(self.config.seed + epoch)
        size = self.config.batch_size
        if self.config.across_weight:
            groups = [[indices[i] for i in g] for g in self._by_question([examples[i] for i in indices])]
            lengths = np.array([max(len(read[i].states) for i in g) for g in groups]) + rng.uniform(0, 8, len(groups))
            batches, current = [], []
            for g in (groups[i] for i in np.argsort(lengths)):
                if current and len(current) + len(g) > size:
                    batches.append(current)
                    current = []
                current = current + g
            batches += [current] if current else []
        else:
            lengths = np.array([len(read[i].states) for i in indices]) + rng.uniform(0, 8, len(indices))
            ordered = [indices[i] for i in np.argsort(lengths)]
            batches = [ordered[k: k + size] for k in range(0, len(ordered), size)]
        return [batches[i] for i in rng.permutation(len(batches))]

    # -- the cache and the checkpoints ---------------------------------------------------------------
    def _states_key(self, examples: Sequence[KeepExample]) -> str:
        """What the trunk states of ``examples`` depend on: the cross-encoder's weights, the trunk's depth, the
        window and the examples."""
        from ragsieve.artifacts import weights_key

        return _digest([weights_key(self.head.folder), len(self.head.encoder.encoder.layer), self.head.max_length]
                       + [[e.group, e.query, e.passage.id, e.passage.title, len(e.passage.text), e.spans]
                          for e in examples])

    def _trunk_states(self, examples: Sequence[KeepExample], key: str) -> list[TrunkStates]:
        import torch

        from ragsieve.atomic import atomic_file

        if self.work_dir is None:
            return self._read_all(examples)
        cache = self.work_dir / f"trunk-{key}.pt"
        if cache.is_file():
            return [TrunkStates(**r) for r in torch.load(cache, weights_only=False)]
        read = self._read_all(examples)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with atomic_file(cache) as tmp:
            torch.save([r.__dict__ for r in read], tmp)
        return read

    def _read_all(self, examples: Sequence[KeepExample]) -> list[TrunkStates]:
        """Every example through the trunk, in batches of similar length (less padding)."""
        order = sorted(range(len(examples)), key=lambda i: len(examples[i].query) + len(examples[i].passage.full_text))
        out: list[TrunkStates | None] = [None] * len(examples)
        step = self.head.batch_size * 16
        report("keep head states", 0, len(order))  # a log reads a task's first report as "N to do"
        for lo in range(0, len(order), step):
            part = [examples[i] for i in order[lo: lo + step]]
            got = self.head.trunk_states([e.query for e in part], [e.passage for e in part], [e.spans for e in part])
            for i, r in zip(order[lo: lo + step], got):
                out[i] = r
            report("keep head states", min(lo + step, len(order)), len(order))  # minutes for a fit's passages
        return out  # type: ignore[return-value]

    def _resume(self, path: Path | None, optimizer) -> dict[str, Any]:
        import torch

        if path is not None and path.is_file():
            saved = torch.load(path, weights_only=False)
            self.head.branch.load_state_dict(saved["branch"])
            optimizer.load_state_dict(saved["optimizer"])
            log.info("keep head: resuming after epoch %d", saved["state"]["epoch"])
            return saved["state"]
        return {"epoch": 0, "history": [], "best_map": -1.0,
                "best": {k: v.clone() for k, v in self.head.branch.state_dict().items()}}

    def _checkpoint(self, path: Path | None, state: dict[str, Any], optimizer) -> None:
        import torch

        from ragsieve.atomic import atomic_file

        if path is None:
            return
        with atomic_file(path) as tmp:
            torch.save({"state": state, "branch": self.head.branch.state_dict(),
                        "optimizer": optimizer.state_dict()}, tmp)
