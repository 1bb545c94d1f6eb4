"""Cross-encoder training on preference groups with sentence-transformers' trainer.

A group is (query, positive, [negatives]) — the FlagEmbedding shape — and the loss is
:class:`~ragsieve.rerank.training.losses.GroupInfoNCELoss`. Used for the base reranker (gold
relevance data) and the LLM-aligned one (confidence-shift preferences).

Aligned on preferences alone, the reranker forgets general relevance (issue #18). Five
guards, each one config field whose default leaves training exactly as before:

* ``replay_ratio`` — that share of the training rows are gold relevance groups replayed
  from ``train_cross_encoder(..., replay=...)``, like ReplayDPO's α;
* ``distill_weight`` — adds ``w · KL(softmax(t) || softmax(s))`` per group, ``t`` the *start*
  model's logits on the group's docs, computed once before training
  (:class:`~ragsieve.rerank.training.losses.GroupInfoNCEDistillLoss`);
* ``lora_r`` — trains rank-r LoRA adapters on BERT's attention and dense layers (the
  classifier head fully) and merges them before saving: the folder is a plain CrossEncoder;
* ``cosine_mix`` — the saved folder keeps the start reranker's scoring function (the shipped
  base adds ``w · 20 ·`` MiniLM cosine to the logit; see :mod:`ragsieve.rerank.mixed`);
* ``eval_steps`` — every that many steps, nDCG@10 on ``relevance_dev`` gold groups
  (sentence-transformers' ``CrossEncoderRerankingEvaluator``); training stops after
  ``patience`` evaluations without improvement and the best evaluated weights are saved.

Example::

    from ragsieve.prefs import read_preferences
    from ragsieve.rerank.training.trainer import CrossEncoderTrainConfig, train_cross_encoder
    from ragsieve.rerank.shipped import base_reranker_dir

    cfg = CrossEncoderTrainConfig(init=str(base_reranker_dir()), group_size=6, distill_weight=1.0)
    train_cross_encoder(read_preferences("prefs_train.jsonl"), cfg, "models/aligned")
    # load_reranker("models/aligned") ranks with it, like any CrossEncoder folder
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Sequence

from pydantic import Field

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.prefs.preferences import PreferenceRecord

log = logging.getLogger(__name__)

#: written next to the weights: rows, replayed rows and the dev history of one training
TRAINING_CARD = "ragsieve_training.json"
#: BERT's linear layers: attention query/key/value, and every `dense` (attention output,
#: intermediate, output, pooler); the classifier head is trained in full
LORA_TARGETS = ["query", "key", "value", "dense"]


class CrossEncoderTrainConfig(StrictConfig):
    """Defaults from the knowledge-boundary paper (lr 6e-5, wd 0.01, 1 epoch); every guard off."""

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
    # --- guards against forgetting general relevance (issue #18); 0 = off
    replay_ratio: float = Field(0.0, ge=0, lt=1, description="share of rows that are replayed gold groups")
    distill_weight: float = Field(0.0, ge=0, description="weight of KL(start model || student) per group")
    lora_r: int = Field(0, ge=0, description="LoRA rank; 0 = full fine-tune")
    eval_steps: int = Field(0, ge=0, description="relevance-dev evaluation interval; 0 = no early stopping")
    patience: int = Field(2, ge=1, description="evaluations without dev improvement before stopping")
    dev_docs: int = Field(12, ge=2, description="docs per relevance-dev query (its positives first)")
    # The shipped base scores cross-encoder logit + w · 20 · MiniLM cosine (its card). A fine-tuned
    # folder without that card scores with the logit alone: it loses the cosine term on top of
    # whatever training changed. True writes the start's mix into the new folder's card.
    cosine_mix: bool = Field(False, description="keep the start reranker's cosine mix (its card) in the saved folder")
    # With train_cross_encoder(..., checkpoint_dir=...): save the trainer's state every this many steps
    # and resume from the last save, so a killed hour-long training loses at most these steps.
    checkpoint_steps: int = Field(0, ge=0, description="steps between resumable checkpoints; 0 = none")


def _prepare_checkpoints(folder: Path, config: CrossEncoderTrainConfig, rows: list[dict]) -> str | None:
    """The last checkpoint in ``folder`` if it was made from these rows and settings, else None
    (and the folder is cleared: a checkpoint of another training must not be resumed)."""
    import hashlib
    import shutil

    key = hashlib.sha1(json.dumps({"config": config.model_dump(), "rows": rows}, sort_keys=True).encode()).hexdigest()
    stamp = folder / "ragsieve_checkpoint_key.txt"
    if folder.is_dir() and (not stamp.is_file() or stamp.read_text().strip() != key):
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stamp.write_text(key + "\n")
    saved = sorted(folder.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]) if p.name.split("-")[-1]
                   .isdigit() else -1, reverse=True)
    for ckpt in saved:
        # the trainer writes trainer_state.json last: without it the save was cut short by a kill
        if (ckpt / "trainer_state.json").is_file():
            return str(ckpt)
        shutil.rmtree(ckpt, ignore_errors=True)
    return None


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


def replay_rows(replay: Sequence[PreferenceRecord], n_rows: int, ratio: float, group_size: int,
                seed: int = 0) -> list[dict[str, str]]:
    """Gold rows to add to ``n_rows`` preference rows so that they make up ``ratio`` of the total.

    ``round(n_rows · ratio / (1 − ratio))`` rows, drawn without repeats while the gold groups
    last; each further pass over them samples fresh negatives.

    Example::

        len(replay_rows(gold, 100, 0.5, 6))   # 100: half of the 200 rows are gold
    """
    if not 0 <= ratio < 1:
        raise RagsieveError(f"replay_ratio must be in [0, 1), got {ratio}")
    want = round(n_rows * ratio / (1 - ratio))
    out: list[dict[str, str]] = []
    rng = random.Random(seed)
    passes = 0
    while len(out) < want:
        rows = group_rows(replay, group_size, seed + 1 + passes)
        if not rows:
            raise RagsieveError("no replay groups: every gold record needs a positive and a negative")
        rng.shuffle(rows)
        out += rows[: want - len(out)]
        passes += 1
    if passes > 1:
        log.info("replay: %d gold rows from %d gold groups (%d passes)", want, len(rows), passes)
    return out


def relevance_samples(records: Sequence[PreferenceRecord], max_docs: int = 12) -> list[dict]:
    """``CrossEncoderRerankingEvaluator`` samples: each record's positives and its first negatives."""
    return [{"query": r.query, "positive": list(r.pos), "negative": list(r.neg[: max(1, max_docs - len(r.pos))])}
            for r in records if r.pos and r.neg]


def is_cross_encoder_folder(path: str | Path) -> bool:
    """True for a saved cross-encoder (a sequence-classification head), False for an encoder or a spec."""
    import json

    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    archs = json.loads(config.read_text()).get("architectures") or []
    return any(a.endswith("ForSequenceClassification") for a in archs)


def train_cross_encoder(
    records: Sequence[PreferenceRecord],
    config: CrossEncoderTrainConfig,
    out_dir: str | Path,
    *,
    replay: Sequence[PreferenceRecord] | None = None,
    relevance_dev: Sequence[PreferenceRecord] | None = None,
    checkpoint_dir: str | Path | None = None,
    start_logits_cache: str | Path | None = None,
) -> Path:
    """Fine-tune a 1-logit cross-encoder on preference groups and save it to ``out_dir``.

    ``replay`` (gold groups, used when ``config.replay_ratio > 0``) and ``relevance_dev``
    (gold groups, used when ``config.eval_steps > 0``) feed the forgetting guards. The
    folder also gets ``ragsieve_training.json`` (row counts, dev history, best step).

    Example::

        train_cross_encoder(read_preferences("prefs.jsonl"), CrossEncoderTrainConfig(), "models/aligned")
        load_reranker("cross-encoder:models/aligned")

        cfg = CrossEncoderTrainConfig(init=str(base_reranker_dir()), replay_ratio=0.5, eval_steps=20)
        train_cross_encoder(prefs, cfg, "models/guarded", replay=gold_train, relevance_dev=gold_dev)

    ``checkpoint_dir`` with ``config.checkpoint_steps > 0``: the trainer's state (weights, optimizer,
    scheduler, RNG) is saved there every that many steps, and a rerun with the same rows and
    config resumes from the last save (anything else there is cleared first). Not with
    ``eval_steps`` or ``lora_r``: their in-memory state (best dev weights, adapters) is not saved.

    ``start_logits_cache`` (a SQLite file) keeps the start model's logits per (query, doc) for
    ``distill_weight``, keyed by the start weights (:func:`~ragsieve.benchmarks.forgetting.weights_key`): a resumed run or another seed over the
    same pairs scores only the pairs it has not seen.
    """
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer

    checkpointing = checkpoint_dir is not None and config.checkpoint_steps > 0
    rows, n_pref, dev, init = _checked_inputs(records, config, replay, relevance_dev, checkpointing)
    # From a bi-encoder folder, CrossEncoder keeps the BERT weights and adds a new 1-logit head.
    # fp32 on CPU even from the shipped fp16 weights: fp16 training on CPU is slow and lossy
    model = CrossEncoder(init, num_labels=1, max_length=config.max_length, device="cpu",
                         model_kwargs={"dtype": torch.float32})
    out_dir = Path(out_dir)
    # The paper caps queries at 128 tokens separately from passages.
    rows = [{**r, "query": _truncate(model.tokenizer, r["query"], config.query_max_tokens)} for r in rows]
    rows, loss = _loss_and_rows(model, rows, config, init, start_logits_cache)
    lora = _attach_lora(model, config.lora_r, config.seed) if config.lora_r else None
    evaluator, callbacks, eval_args = _dev_evaluation(model, dev, config)
    resume, args = _training_arguments(config, rows, out_dir, checkpoint_dir if checkpointing else None, eval_args)
    trainer = CrossEncoderTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(rows), evaluator=evaluator, loss=loss,
        callbacks=callbacks,
    )
    if resume:
        log.info("resuming the training from %s", resume)
    trainer.train(resume_from_checkpoint=resume)
    if lora is not None:
        lora.merge_and_unload()  # in place: the CrossEncoder's BERT is plain again, adapters folded in
    card = {"preference_rows": n_pref, "replay_rows": len(rows) - n_pref, "steps": trainer.state.global_step,
            "resumed_from_step": int(Path(resume).name.split("-")[-1]) if resume else None,
            "guards": config.model_dump(include={"replay_ratio", "distill_weight", "lora_r", "eval_steps", "cosine_mix"})}
    if callbacks:
        card.update(callbacks[0].summary())
    _save_trained(model, config, init, out_dir, card)
    return out_dir


def _checked_inputs(records: Sequence[PreferenceRecord], config: CrossEncoderTrainConfig,
                    replay: Sequence[PreferenceRecord] | None, relevance_dev: Sequence[PreferenceRecord] | None,
                    checkpointing: bool) -> tuple[list[dict], int, list[dict], str]:
    """The training rows (preference groups, then replayed gold groups), how many are preferences, the dev
    samples and the start weights' path; every guard's inputs are checked here, before the model loads."""
    from ragsieve.models.encoder import resolve_encoder_path

    if checkpointing and (config.eval_steps > 0 or config.lora_r > 0):
        raise RagsieveError("checkpoint_steps cannot be combined with eval_steps or lora_r: a resumed run would "
                            "lose the best dev weights or the adapters; set checkpoint_steps 0")
    if config.replay_ratio > 0 and not replay:
        raise RagsieveError(f"replay_ratio {config.replay_ratio} needs gold groups to replay (replay=...)")
    dev = relevance_samples(relevance_dev or [], config.dev_docs)
    if config.eval_steps > 0 and not dev:
        raise RagsieveError(f"eval_steps {config.eval_steps} needs relevance_dev gold groups with a positive "
                            "and a negative")
    rows = group_rows(records, config.group_size, config.seed)
    if not rows:
        raise RagsieveError("no training groups: every record needs at least one positive and one negative")
    n_pref = len(rows)
    if config.replay_ratio > 0:
        rows += replay_rows(replay, n_pref, config.replay_ratio, config.group_size, config.seed)
    init = config.init if Path(config.init).exists() else resolve_encoder_path(config.init)
    if config.distill_weight > 0 and not is_cross_encoder_folder(init):
        # a new head's scores are noise: distilling them would pull the model towards noise
        raise RagsieveError(f"distill_weight {config.distill_weight} needs a trained cross-encoder to start from; "
                            f"{config.init} is an encoder (a new head): set distill_weight 0")
    return rows, n_pref, dev, init


def _loss_and_rows(model, rows: list[dict], config: CrossEncoderTrainConfig, init: str,
                   start_logits_cache: str | Path | None):
    """The group loss, and the rows it reads: with ``distill_weight``, each row labelled with the start
    model's logits (the teacher)."""
    from ragsieve.rerank.training.losses import GroupInfoNCEDistillLoss, GroupInfoNCELoss

    if config.distill_weight <= 0:
        return rows, GroupInfoNCELoss(model, temperature=config.temperature)
    # the teacher is the model as it starts, frozen: scored once, before any adapter or step
    if start_logits_cache is None:
        teacher = start_logits(model, rows, config.group_size)
    else:
        from contextlib import closing

        from ragsieve.probe.cache import StateCache
        from ragsieve.rerank.shipped import weights_key

        with closing(StateCache(start_logits_cache)) as cache:
            teacher = start_logits(model, rows, config.group_size, cache=cache,
                                   model_key=f"{weights_key(init)}|{config.max_length}")
    rows = [{**r, "label": t} for r, t in zip(rows, teacher)]
    return rows, GroupInfoNCEDistillLoss(model, temperature=config.temperature, distill_weight=config.distill_weight)


def _dev_evaluation(model, dev: list[dict], config: CrossEncoderTrainConfig) -> tuple[object, list, dict]:
    """The early-stopping guard: (evaluator, callbacks, training arguments) — none of them without ``eval_steps``."""
    if config.eval_steps <= 0:
        return None, [], {}
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator

    evaluator = CrossEncoderRerankingEvaluator(dev, at_k=10, name="dev", batch_size=32, write_csv=False)
    eval_args = {"eval_strategy": "steps", "eval_steps": config.eval_steps,
                 "metric_for_best_model": "eval_dev_ndcg@10", "greater_is_better": True}
    return evaluator, [_best_on_dev(model, evaluator, config.patience)], eval_args


def _training_arguments(config: CrossEncoderTrainConfig, rows: list[dict], out_dir: Path,
                        checkpoint_dir: str | Path | None, eval_args: dict):
    """(the checkpoint to resume from or None, the trainer's arguments); ``checkpoint_dir`` None: no saves."""
    from sentence_transformers.cross_encoder import CrossEncoderTrainingArguments

    resume, save_args = None, {"save_strategy": "no"}
    if checkpoint_dir is not None:
        resume = _prepare_checkpoints(Path(checkpoint_dir), config, rows)
        save_args = {"save_strategy": "steps", "save_steps": config.checkpoint_steps, "save_total_limit": 1}
    args = CrossEncoderTrainingArguments(
        output_dir=str(checkpoint_dir if checkpoint_dir is not None else out_dir / "checkpoints"),
        num_train_epochs=config.epochs,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.lr,
        weight_decay=config.weight_decay,
        warmup_steps=config.warmup_ratio,  # transformers 5: a float below 1 is a ratio of the total steps
        seed=config.seed,
        report_to="none",
        logging_steps=10,
        use_cpu=True,
        dataloader_drop_last=False,
        **save_args,
        **eval_args,
    )
    return resume, args


def _save_trained(model, config: CrossEncoderTrainConfig, init: str, out_dir: Path, card: dict) -> None:
    """The trained weights, the training card and (``cosine_mix``) the start reranker's scoring card."""
    if config.save_fp16:
        model.model.half()
    model.save_pretrained(str(out_dir))
    (out_dir / "README.md").unlink(missing_ok=True)  # the auto card describes a generic CrossEncoder
    (out_dir / TRAINING_CARD).write_text(json.dumps(card, indent=1) + "\n")
    if config.cosine_mix:
        from ragsieve.rerank.shipped import CARD, inherited_card

        mix = inherited_card(init, config.max_length)
        if mix:  # load_reranker(out_dir) then scores as the start did: logit + w · scale · cosine
            (out_dir / CARD).write_text(json.dumps(mix, indent=1) + "\n")


def start_logits(model, rows: Sequence[dict], group_size: int, batch_size: int = 64, *,
                 cache=None, model_key: str = "") -> list[list[float]]:
    """The model's raw logits on each row's ``positive, negative_1..`` docs (eval mode, no gradient).

    With ``cache`` (a :class:`~ragsieve.probe.cache.StateCache`), pairs stored under the same
    ``model_key`` are read, not scored; the new ones are stored.
    """
    import hashlib

    import numpy as np
    import torch
    from sentence_transformers.util import batch_to_device

    columns = ["positive"] + [f"negative_{i}" for i in range(1, group_size)]
    pairs = [(r["query"], r[c]) for r in rows for c in columns]
    keys = [hashlib.sha1(f"{model_key}\x00{q}\x00{d}".encode()).hexdigest() for q, d in pairs]
    known = {k: float(v[0]) for k, v in cache.get_many(sorted(set(keys))).items()} if cache is not None else {}
    todo = sorted({k: p for k, p in zip(keys, pairs) if k not in known}.items())
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for lo in range(0, len(todo), batch_size):
            chunk = todo[lo: lo + batch_size]
            tokens = batch_to_device(model.preprocess([p for _, p in chunk]), model.device)
            scores = model(tokens)["scores"].view(-1).float().tolist()
            fresh = {k: s for (k, _), s in zip(chunk, scores)}
            known.update(fresh)
            if cache is not None:  # stored per batch: a kill keeps what was scored
                cache.put_many({k: np.array([s], np.float32) for k, s in fresh.items()})
    model.train(was_training)
    logits = [known[k] for k in keys]
    return [logits[i: i + group_size] for i in range(0, len(logits), group_size)]


def _attach_lora(model, r: int, seed: int):
    """Inject LoRA adapters into the CrossEncoder's BERT in place; returns the PEFT wrapper (to merge)."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)  # LoRA's A matrices are random (B = 0: the start model is unchanged)
    # alpha = 2r, the usual scaling; dropout 0.05 on the adapter input only (BERT keeps its own 0.1)
    config = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.05, target_modules=LORA_TARGETS,
                        modules_to_save=["classifier"])
    return get_peft_model(model.model, config)


def _best_on_dev(model, evaluator, patience: int):
    """Early stopping on relevance-dev nDCG@10 that keeps the best weights in memory.

    Why not the trainer's ``load_best_model_at_end``: it reloads a checkpoint folder, which
    cannot rebuild a model with LoRA layers injected (sentence-transformers logs the error and
    keeps the last weights), and it writes model + optimizer state at every evaluation. A
    copy of the weights (≈ 90 MB for MiniLM) is cheaper and works for both. The final step
    competes too: it is evaluated at the end when no evaluation fell on it.
    """
    from transformers import TrainerCallback

    key = "eval_dev_ndcg@10"

    class BestOnDev(TrainerCallback):
        def __init__(self):
            self.best: float | None = None
            self.best_step = 0
            self.weights = None
            self.bad = 0
            self.history: list[dict] = []

        def _seen(self, step: int, value: float) -> bool:
            self.history.append({"step": step, "dev_ndcg@10": value})
            if self.best is None or value > self.best:
                self.best, self.best_step, self.bad = value, step, 0
                self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
                return True
            self.bad += 1
            return False

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            if metrics and key in metrics:
                self._seen(state.global_step, float(metrics[key]))
                if self.bad >= patience:
                    log.info("relevance dev nDCG@10 did not improve for %d evaluations: stopping at step %d",
                             patience, state.global_step)
                    control.should_training_stop = True
            return control

        def on_train_end(self, args, state, control, **kwargs):
            if not self.history or self.history[-1]["step"] != state.global_step:
                self._seen(state.global_step, float(evaluator(model)[key.removeprefix("eval_")]))
            if self.weights is not None and self.best_step != state.global_step:
                model.load_state_dict(self.weights)
            self.weights = None
            return control

        def summary(self) -> dict:
            return {"best_dev_step": self.best_step, "best_dev_ndcg@10": self.best, "dev_history": self.history}

    return BestOnDev()


def _truncate(tokenizer, text: str, max_tokens: int) -> str:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens])
