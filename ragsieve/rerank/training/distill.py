"""Train the base cross-encoder on gold groups while distilling MiniLM cosine.

Why the distillation term: trained on gold groups alone, the cross-encoder learned these
datasets' shortcuts and ordered a web-search benchmark's candidates worse than BM25,
while the MiniLM cosine it starts from is far above BM25 there. The loss per group
(1 gold passage + N mined negatives, each with its MiniLM cosine ``c``) is

    InfoNCE(s)  +  alpha * KL( softmax(c * teacher_scale) || softmax(s) )

so the cross-encoder keeps the bi-encoder's ordering of the candidates (listwise, the
way cosine ranks them) and moves away from it only where gold labels say so.

Rows: :func:`distill_rows` turns mined rows (:mod:`.mining`) into ``query, docs, label``
rows (``docs[0]`` the positive, ``label`` the teacher cosines), resampling negatives in
each pass. Training checkpoints every ``save_steps``, evaluates on the dev rows at the
same steps, stops early on dev nDCG@10 and resumes from the last checkpoint after a kill.

Example::

    rows = read_mined("work/mined/fever.jsonl")
    train_distilled(rows, DistillConfig(max_steps=20), "work/model")
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
import torch
from sentence_transformers.base.sampler import DefaultBatchSampler
from torch import nn

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER

log = logging.getLogger(__name__)


class DistillConfig(StrictConfig):
    init: str = DEFAULT_ENCODER
    group_size: int = 8  # 1 positive + 7 negatives
    passes: int = 2  # over the train questions, fresh negatives (and positive) each pass
    alpha: float = 1.0  # weight of the cosine distillation term
    teacher_scale: float = 20.0  # cosine → teacher logits (MiniLM was trained at scale 20)
    # "kl": listwise KL to softmax(teacher), which mostly carries the teacher's top passage when its
    # logits are far apart; "margin-mse": every score difference within the group matched (Margin-MSE,
    # Hofstätter et al. 2020), so the teacher's order among the lower passages is learnt too
    distill_loss: Literal["kl", "margin-mse"] = "kl"
    lr: float = 7e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.05
    batch_size: int = 8  # groups per step
    max_length: int = 256  # query + passage; p50 passage ≈ 35–120 tokens except MultiRC (330)
    max_steps: int = -1  # -1 = all passes
    eval_steps: int = 100  # dev evaluation and checkpoint interval
    patience: int = 3  # evaluations without dev improvement before stopping
    # wall-clock cap per (re)start: the machine is shared, so steps cost 5–40 s; a constant
    # LR after warmup lets the run stop at any step, and the best dev checkpoint is kept
    time_budget_minutes: float = 0.0  # 0 = no cap
    lr_scheduler: str = "constant_with_warmup"
    # bf16 autocast for forward and backward (fp32 master weights): ≈ 2.5× the steps/s on a CPU with AMX
    bf16: bool = False
    dev_docs: int = 12  # per dev query (its positives + the best-cosine negatives), to keep evaluation cheap
    seed: int = 0


class DistilInfoNCELoss(nn.Module):
    """Group InfoNCE on the gold positive plus a distillation term to the teacher's scores (listwise KL or
    Margin-MSE, see :func:`group_distill_loss`).

    Inputs: columns ``(query, docs)`` with ``docs[0]`` the positive, and ``label`` the
    teacher cosine of every doc; every row has the same number of docs.
    """

    def __init__(self, model, alpha: float = 1.0, teacher_scale: float = 20.0, kind: str = "kl") -> None:
        super().__init__()
        self.model = model
        self.alpha = alpha
        self.teacher_scale = teacher_scale
        self.kind = kind

    def forward(self, inputs, labels, prompt=None, task=None) -> torch.Tensor:
        queries, docs_list = inputs
        group = len(docs_list[0])
        if any(len(d) != group for d in docs_list):
            raise RagsieveError("every row needs the same number of docs")
        pairs = [(q, d) for q, docs in zip(queries, docs_list) for d in docs]
        from sentence_transformers.util import batch_to_device

        tokens = batch_to_device(self.model.preprocess(pairs, prompt=prompt, task=task), self.model.device)
        scores = self.model(tokens)["scores"].view(len(queries), group).float()
        teacher = torch.stack([torch.as_tensor(lab, dtype=torch.float32) for lab in labels]).to(scores.device)
        return group_distill_loss(scores, teacher, self.alpha, self.teacher_scale, self.kind)

    def get_config_dict(self) -> dict[str, float | str]:
        return {"alpha": self.alpha, "teacher_scale": self.teacher_scale, "distill_loss": self.kind}

    @property
    def citation(self) -> str | None:
        return None


def group_distill_loss(scores: torch.Tensor, teacher: torch.Tensor, alpha: float, teacher_scale: float,
                       kind: str = "kl") -> torch.Tensor:
    """``CE(scores, 0) + alpha * D(scores, teacher * scale)``, batch mean, where ``D`` is

    - ``"kl"``: ``KL(softmax(teacher * scale) || softmax(scores))``;
    - ``"margin-mse"``: the mean squared difference of the group-centred scores, i.e. every score
      difference within a group matched to the teacher's (shift-invariant, like the KL).

    Example::

        group_distill_loss(torch.zeros(2, 8), torch.rand(2, 8), 1.0, 20.0)
    """
    target = torch.zeros(len(scores), dtype=torch.long, device=scores.device)
    info_nce = nn.functional.cross_entropy(scores, target)
    if alpha == 0:
        return info_nce
    scaled = teacher * teacher_scale
    if kind == "margin-mse":
        centred = (scores - scores.mean(-1, keepdim=True)) - (scaled - scaled.mean(-1, keepdim=True))
        return info_nce + alpha * centred.pow(2).mean()
    if kind != "kl":
        raise RagsieveError(f"unknown distillation loss '{kind}': kl or margin-mse")
    log_student = torch.log_softmax(scores, dim=-1)
    log_teacher = torch.log_softmax(scaled, dim=-1)
    kl = nn.functional.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean")
    return info_nce + alpha * kl


def can_tell_rankers_apart(sample: dict) -> bool:
    """Whether a reranking sample ``{query, positive, documents}`` can tell two rankers apart: a relevant and an
    irrelevant passage among its documents. A list of one passage (a FEVER dev claim's retriever found one) or
    of one kind scores every order alike, and sentence-transformers' evaluator fails on the first (sklearn's
    nDCG needs two documents)."""
    relevant = sum(d in sample["positive"] for d in sample["documents"])
    return 0 < relevant < len(sample["documents"])


def distill_rows(mined: Sequence[dict], group_size: int, passes: int, seed: int = 0, batch_size: int = 0) -> list[dict]:
    """``{query, docs, label}`` rows: per pass and question, one positive + sampled negatives.

    A question with fewer negatives than needed repeats its own (every row needs
    ``group_size`` docs). Positives rotate across passes. With ``batch_size``, each pass is
    laid out in batches of one dataset and similar length (longest pair in the row), in
    shuffled batch order: a batch pads to its own longest pair, not to MultiRC's 256 tokens
    (train with :class:`BlockBatchSampler`, which keeps this order). Passes follow each other.
    """
    if group_size < 2:
        raise RagsieveError(f"group_size must be >= 2 (1 positive + negatives), got {group_size}")
    rng = random.Random(seed)
    rows = []
    for p in range(passes):
        pass_rows: dict[str, list[dict]] = {}
        for m in mined:
            if not m["pos"] or not m["neg"]:
                continue
            _, pos_text, pos_cos = m["pos"][p % len(m["pos"])]
            negs = rng.sample(m["neg"], min(len(m["neg"]), group_size - 1))
            while len(negs) < group_size - 1:
                negs.append(rng.choice(m["neg"]))
            pass_rows.setdefault(m.get("dataset", ""), []).append({
                "query": m["query"],
                "docs": [pos_text] + [n[1] for n in negs],
                "label": [pos_cos] + [n[2] for n in negs],
            })
        if not batch_size:
            flat = [r for rs in pass_rows.values() for r in rs]
            rng.shuffle(flat)
            rows += flat
            continue
        blocks = []
        for name in sorted(pass_rows):
            ds_rows = sorted(pass_rows[name], key=lambda r: len(r["query"]) + max(len(d) for d in r["docs"]))
            ds_blocks = [ds_rows[i: i + batch_size] for i in range(0, len(ds_rows), batch_size)]
            while len(ds_blocks[-1]) < batch_size:  # full blocks keep batches aligned to datasets
                ds_blocks[-1].append(rng.choice(ds_rows))
            blocks += ds_blocks
        rng.shuffle(blocks)
        rows += [r for b in blocks for r in b]
    return rows


class BlockBatchSampler(DefaultBatchSampler):
    """Consecutive batches in the dataset's own order (rows are laid out by :func:`distill_rows`).

    Module-level so the trainer can pickle its arguments into checkpoints.
    """

    def __iter__(self):
        n = len(self.sampler)
        for lo in range(0, n, self.batch_size):
            if lo + self.batch_size <= n or not self.drop_last:
                yield list(range(lo, min(lo + self.batch_size, n)))

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


def dev_samples(mined: Sequence[dict], max_docs: int = 12) -> list[dict]:
    """Reranking-evaluator samples, documents in the order of each row's stored score, so the evaluator's
    ``base_*`` is that ranking: MiniLM cosine for freshly mined rows, the teacher's mixed score for rows
    :func:`cache_teacher_scores` returned (the distillation's dev rows)."""
    out = []
    for m in mined:
        negs = sorted(m["neg"], key=lambda n: -n[2])[: max(1, max_docs - len(m["pos"]))]
        docs = sorted([(p[2], p[1]) for p in m["pos"]] + [(n[2], n[1]) for n in negs], reverse=True)
        out.append({"query": m["query"], "positive": [p[1] for p in m["pos"]], "documents": [d for _, d in docs]})
    return out


def _time_budget_callback():
    import time

    from transformers import TrainerCallback

    class TimeBudget(TrainerCallback):
        """Stop (after an evaluation and a save) once the wall-clock budget is spent."""

        def __init__(self, minutes: float):
            self.minutes = minutes
            self.start = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if self.minutes and time.monotonic() - self.start > self.minutes * 60:
                log.warning("time budget of %.0f min spent at step %d: stopping", self.minutes, state.global_step)
                control.should_evaluate = control.should_save = control.should_training_stop = True
            return control

    return TimeBudget


def _TimeBudget(minutes: float):
    return _time_budget_callback()(minutes)


def train_distilled(train: Sequence[dict], dev: Sequence[dict], config: DistillConfig, out_dir: str | Path,
                    dev_lists: Sequence[dict] | None = None) -> Path:
    """Train from mined rows into ``out_dir`` (checkpoints in ``out_dir/checkpoints``, resumed if present).

    The best dev checkpoint is loaded at the end and saved to ``out_dir/final``: by nDCG@10 on ``dev``'s
    mined groups, or, given ``dev_lists`` (reranking samples ``{query, positive, documents}``, e.g. dev
    questions with the candidate lists the model will rerank), by nDCG@10 on those, with ``dev`` still
    logged beside it.
    """
    from datasets import Dataset
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator
    from transformers import EarlyStoppingCallback

    from ragsieve.models.encoder import resolve_encoder_path

    rows = distill_rows(train, config.group_size, config.passes, config.seed, batch_size=config.batch_size)
    if not rows:
        raise RagsieveError("no training rows: every mined row needs a positive and a negative")
    init = config.init if Path(config.init).exists() else resolve_encoder_path(config.init)
    model = CrossEncoder(init, num_labels=1, max_length=config.max_length, device="cpu")
    out_dir = Path(out_dir)
    ckpt_dir = out_dir / "checkpoints"
    evaluator = CrossEncoderRerankingEvaluator(dev_samples(dev, config.dev_docs), at_k=10, name="dev", batch_size=32)
    best = "eval_dev_ndcg@10"
    telling = [s for s in dev_lists or () if can_tell_rankers_apart(s)]
    if dev_lists and len(telling) < len(dev_lists):
        log.info("%d of %d dev lists left out: one passage, or none or all relevant", len(dev_lists) - len(telling),
                 len(dev_lists))
    if telling:
        from sentence_transformers.sentence_transformer.evaluation import SequentialEvaluator

        # only the list is reranked (a positive the list missed is not added back): the metric of use
        lists = CrossEncoderRerankingEvaluator(telling, at_k=10, always_rerank_positives=False,
                                               name="devlists", batch_size=32)
        evaluator, best = SequentialEvaluator([evaluator, lists]), "eval_devlists_ndcg@10"
    args = CrossEncoderTrainingArguments(
        output_dir=str(ckpt_dir),
        num_train_epochs=1,  # the passes are already in the rows
        max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.lr,
        weight_decay=config.weight_decay,
        warmup_steps=config.warmup_ratio,  # transformers 5: a float < 1 is a ratio
        lr_scheduler_type=config.lr_scheduler,
        seed=config.seed,
        eval_strategy="steps",
        eval_steps=config.eval_steps,
        save_strategy="steps",
        save_steps=config.eval_steps,
        save_total_limit=2,  # the best one is kept on top of this
        load_best_model_at_end=True,
        metric_for_best_model=best,
        greater_is_better=True,
        report_to="none",
        logging_steps=10,
        use_cpu=True,
        bf16=config.bf16,
        batch_sampler=BlockBatchSampler,
    )
    trainer = CrossEncoderTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        evaluator=evaluator,
        loss=DistilInfoNCELoss(model, config.alpha, config.teacher_scale, config.distill_loss),
        callbacks=[EarlyStoppingCallback(early_stopping_patience=config.patience),
                   _TimeBudget(config.time_budget_minutes)],
    )
    resume = ckpt_dir.exists() and any(ckpt_dir.glob("checkpoint-*"))
    trainer.train(resume_from_checkpoint=True if resume else None)
    final = out_dir / "final"
    model.save_pretrained(str(final))
    return final


def truncated_student(teacher_folder: str | Path, layers: int, out_dir: str | Path, max_length: int = 256,
                      fresh_head: bool = False) -> Path:
    """A student cross-encoder: the teacher's embeddings, its first ``layers`` transformer layers and its head.

    Starting from the teacher's own lower layers (rather than a fresh head on a smaller encoder)
    keeps the classifier head it trained, so distillation starts near the teacher's ranking. That head
    reads the teacher's last layer: under one layer it scores every pair alike and barely moves
    (``results/rerank_distill``), so ``fresh_head`` re-initialises the pooler and classifier as the
    architecture initialises them. Written once to ``out_dir`` (reused when it exists).

    Example::

        truncated_student("ragsieve/assets/base-reranker", 2, "work/students/fast-init")
    """
    from sentence_transformers import CrossEncoder

    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    ce = CrossEncoder(str(teacher_folder), num_labels=1, max_length=max_length, device="cpu",
                      model_kwargs={"dtype": torch.float32})
    encoder = getattr(ce.model, ce.model.base_model_prefix).encoder
    total = len(encoder.layer)
    if not 1 <= layers <= total:
        raise RagsieveError(f"a student keeps 1..{total} of the teacher's layers, got {layers}")
    encoder.layer = nn.ModuleList(list(encoder.layer)[:layers])
    ce.model.config.num_hidden_layers = layers
    if fresh_head:
        std = float(getattr(ce.model.config, "initializer_range", 0.02))
        head = [getattr(getattr(ce.model, ce.model.base_model_prefix), "pooler", None),
                getattr(ce.model, "classifier", None)]
        linears = [m for part in head if part is not None for m in part.modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise RagsieveError(f"{teacher_folder}: no pooler or classifier to re-initialise")
        with torch.no_grad():
            for linear in linears:
                linear.weight.normal_(0.0, std)
                if linear.bias is not None:
                    linear.bias.zero_()
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    ce.save_pretrained(str(tmp), safe_serialization=True)
    (tmp / "README.md").unlink(missing_ok=True)
    tmp.rename(out_dir)
    return out_dir


def teacher_logit_pairs(rows: Sequence[dict]) -> list[tuple[str, str]]:
    """Every (query, passage) of mined rows, positives then negatives, row by row."""
    return [(m["query"], d[1]) for m in rows for d in m["pos"] + m["neg"]]


def cache_teacher_scores(rows: Sequence[dict], teacher, cache: str | Path, cosine_weight: float,
                         cosine_scale: float = 20.0, chunk: int = 64, records=None) -> list[dict]:
    """The mined rows with each passage's cosine replaced by the teacher's mixed score.

    ``teacher`` is a cross-encoder with ``predict_pairs`` returning raw logits (the teacher's
    cross-encoder part); the mix adds ``cosine_weight · cosine_scale · cosine`` with the cosine the
    mining stored (same MiniLM as the shipped mix). Logits are appended to ``cache`` (one JSON line
    per row, keyed by dataset and question id) every ``chunk`` rows, so a killed run resumes where
    it stopped. Passages keep their order, so the rows feed :func:`train_distilled` unchanged
    (with ``teacher_scale = 1``: the scores are already logits).

    ``records`` (a :class:`ragsieve.data.score_records.PairScores` of this teacher's logits, by question
    and passage id) is read first and extended chunk by chunk: committed, it carries the scores to
    another machine, where only the pairs it lacks are scored.

    Example::

        rows = cache_teacher_scores(read_mined("work/mined/fever.jsonl"), OnnxCrossEncoderRanker(), "t.jsonl", 0.25)
    """
    cache = Path(cache)
    done: dict[str, list[float]] = {}
    if cache.is_file():
        for line in cache.read_text().splitlines():
            try:
                item = json.loads(line)
            except ValueError:  # a line cut by a kill: score that row again
                continue
            done[item["key"]] = item["logits"]

    def key(m: dict) -> str:
        return f"{m.get('dataset', '')}/{m['qid']}"

    def complete(m: dict) -> bool:
        return key(m) in done and len(done[key(m)]) == len(m["pos"]) + len(m["neg"])

    if records is not None:  # scored on another machine (ids and logits only)
        for m in rows:
            if not complete(m):
                got = records.lookup(m["qid"], [d[0] for d in m["pos"] + m["neg"]])
                if got is not None:
                    done[key(m)] = got
    todo = [m for m in rows if not complete(m)]
    cache.parent.mkdir(parents=True, exist_ok=True)
    for lo in range(0, len(todo), chunk):
        part = todo[lo: lo + chunk]
        logits = np.asarray(teacher.predict_pairs(teacher_logit_pairs(part)), dtype=float)
        lines, at = [], 0
        for m in part:
            n = len(m["pos"]) + len(m["neg"])
            done[key(m)] = [float(x) for x in logits[at: at + n]]
            lines.append(json.dumps({"key": key(m), "logits": done[key(m)]}) + "\n")
            at += n
        with cache.open("a") as fh:
            fh.write("".join(lines))
        if records is not None:
            records.add((m["qid"], d[0], s) for m in part for d, s in zip(m["pos"] + m["neg"], done[key(m)]))
        log.info("teacher: %d / %d rows scored", min(lo + chunk, len(todo)), len(todo))
    mix = cosine_weight * cosine_scale
    out = []
    for m in rows:
        logits = done[key(m)]
        docs = [[*d[:2], logit + mix * d[2], *d[3:]] for d, logit in zip(m["pos"] + m["neg"], logits)]
        out.append({**m, "pos": docs[: len(m["pos"])], "neg": docs[len(m["pos"]):]})
    return out
