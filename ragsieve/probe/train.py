"""Training the probe head on (hidden state, answered-correctly) pairs."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.probe.model import ProbeHead

log = logging.getLogger(__name__)


class ProbeTrainConfig(StrictConfig):
    """Defaults follow the knowledge-boundary paper (lr 5e-5, 30 epochs, dropout 0.5)."""

    hidden: int = 256
    dropout: float = 0.5
    lr: float = 5e-5
    weight_decay: float = 0.0
    epochs: int = 30
    batch_size: int = 32
    patience: int = 5  # epochs without dev-AUROC gain before stopping
    seed: int = 0


@dataclass
class ProbeTrainResult:
    head: ProbeHead
    best_epoch: int
    history: list[dict] = field(default_factory=list)


def train_probe_head(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_dev: np.ndarray,
    y_dev: np.ndarray,
    config: ProbeTrainConfig | None = None,
) -> ProbeTrainResult:
    """Cross-entropy over {incorrect, correct}; keeps the epoch with the best dev AUROC.

    Example::

        result = train_probe_head(x_tr, y_tr, x_dev, y_dev, ProbeTrainConfig(epochs=10))
        result.head.predict_proba(x_test)
    """
    import torch
    from sklearn.metrics import roc_auc_score

    config = config or ProbeTrainConfig()
    y_train = np.asarray(y_train, dtype=np.int64)
    y_dev = np.asarray(y_dev, dtype=np.int64)
    if len(x_train) != len(y_train) or len(x_dev) != len(y_dev):
        raise RagsieveError("probe training: states and labels differ in length")
    if len(set(y_train.tolist())) < 2:
        raise RagsieveError("probe training needs both correct and incorrect examples in the train split")
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)

    head = ProbeHead(x_train.shape[1], config.hidden, config.dropout)
    head.fit_scaler(x_train)
    opt = torch.optim.AdamW(head.mlp.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    xt = torch.from_numpy(np.asarray(x_train, dtype=np.float32))
    yt = torch.from_numpy(y_train)
    dev_has_both = len(set(y_dev.tolist())) == 2

    best = (-1.0, 0, head.state_dict())
    history, stale = [], 0
    for epoch in range(1, config.epochs + 1):
        head.mlp.train()
        order = rng.permutation(len(xt))
        total = 0.0
        for lo in range(0, len(order), config.batch_size):
            idx = torch.from_numpy(order[lo : lo + config.batch_size])
            loss = torch.nn.functional.cross_entropy(head.logits(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        dev_prob = head.predict_proba(x_dev)
        dev_auroc = float(roc_auc_score(y_dev, dev_prob)) if dev_has_both else float("nan")
        dev_acc = float(((dev_prob > 0.5) == y_dev).mean()) if len(y_dev) else float("nan")
        history.append({"epoch": epoch, "train_loss": total / len(xt), "dev_auroc": dev_auroc, "dev_accuracy": dev_acc})
        score = dev_auroc if dev_has_both else -total
        if score > best[0]:
            best, stale = (score, epoch, head.state_dict()), 0
        else:
            stale += 1
            if stale >= config.patience:
                log.info("early stop at epoch %d (best %d)", epoch, best[1])
                break
    head.load_state_dict(best[2])
    return ProbeTrainResult(head, best[1], history)
