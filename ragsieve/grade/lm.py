"""Graders built on a small LLM (the embedded SmolLM2-135M by default).

The lightweight-grader paper's configurations, all reading the same prompt
(:mod:`ragsieve.grade.prompt`) and scoring P(relevant) in [0, 1]:

============  =========================================================  ==========================
kind          what                                                       saved weights
============  =========================================================  ==========================
prompted      baseline: P(yes) vs P(no) from the next-token logits       none
generative    config A: full fine-tune to emit the yes/no token          the whole LM
head          config B: frozen backbone + linear head on the last token  the head only
classifier    config C: full fine-tune, sequence classification (2)      the whole model
lora          C with LoRA adapters (PEFT) of rank r and scale alpha      adapters + head
============  =========================================================  ==========================

Batches are left-padded, so the last position is the last prompt token for every row;
position ids follow the attention mask, so batching does not change a score.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Sequence

import numpy as np

from ragsieve.errors import ModelNotAvailable, RagsieveError
from ragsieve.grade.base import WEIGHTS_FILE, Grader, GraderConfig
from ragsieve.grade.prompt import EncodedPrompt, GradePromptEncoder, grade_verdict_tokens
from ragsieve.grade.train import (
    GraderTrainConfig, ProgressFn, TrainResult, make_loss, resample_indices, run_trainer,
)
from ragsieve.models.quiet import quiet_transformers
from ragsieve.specs import DEFAULT_LLM, ModelSpec
from ragsieve.models.verdict import answer_logits, left_pad, two_way_logits

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def load_base(spec: str, head: str) -> tuple["PreTrainedModel", "PreTrainedTokenizerBase"]:
    """The base LLM as a causal LM (``head="causal"``) or a 2-label classifier (``"classify"``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from ragsieve.models.llm import resolve_llm_path

    loaders = {
        "causal": lambda p: AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32),
        "classify": lambda p: AutoModelForSequenceClassification.from_pretrained(p, num_labels=2, dtype=torch.float32),
    }
    path = resolve_llm_path(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        with quiet_transformers():
            model = loaders[head](path)
    except OSError as exc:
        raise ModelNotAvailable(f"cannot load base LLM '{spec}' from {path}: {str(exc).splitlines()[0]}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    # The classifier reads the rightmost non-pad token; it must know the pad id.
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


class LMGrader(Grader):
    """Shared machinery of the LLM graders: prompt encoding, padding, batched scoring, training."""

    default_base: ClassVar[str] = DEFAULT_LLM
    head: ClassVar[str] = "causal"
    batch_size: int = 16
    #: scores are P(relevant), a softmax output: unit_scores is the score itself, calibrate fits on its logit
    score_is_probability = True

    def __init__(self, model: "PreTrainedModel", tokenizer: "PreTrainedTokenizerBase", config: GraderConfig):
        super().__init__(config)
        self.model = model
        self.tokenizer = tokenizer
        self.prompt = GradePromptEncoder(
            tokenizer,
            max_length=config.max_length,
            max_passage_tokens=config.max_passage_tokens,
            max_query_tokens=config.max_query_tokens,
            system=config.system,
            instruction=config.instruction,
        )
        width = int(model.config.hidden_size)
        if config.hidden_size is None:
            self.config = config.model_copy(update={"hidden_size": width})
        elif config.hidden_size != width:
            raise RagsieveError(
                f"grader was trained on a {config.hidden_size}-wide '{config.base}', but that base is now "
                f"{width} wide; retrain the grader"
            )

    @classmethod
    def normalize_base(cls, base: str) -> str:
        return str(ModelSpec.parse(base))

    @classmethod
    def create(cls, config: GraderConfig) -> "LMGrader":
        if ModelSpec.parse(config.base).is_endpoint:
            raise RagsieveError(f"'{config.base}' is an endpoint; graders need a local LLM (embedded:, hf: or a path)")
        model, tokenizer = load_base(config.base, cls.head)
        return cls(model, tokenizer, config)

    # -- inputs -------------------------------------------------------------------------
    def encode(self, queries: Sequence[str], passages: Sequence[str]) -> list[EncodedPrompt]:
        """Token ids per pair; truncations are counted in ``stats``."""
        prompts = [self.prompt.encode(q, p) for q, p in zip(queries, passages, strict=True)]
        self.stats.truncated_passages += sum(p.passage_truncated for p in prompts)
        self.stats.truncated_queries += sum(p.query_truncated for p in prompts)
        return prompts

    def collate(self, rows: list[dict[str, Any]]) -> dict[str, "torch.Tensor"]:
        """Left-pad ``input_ids``; position ids count real tokens only. Carries ``labels`` if present."""
        import torch

        batch = left_pad([r["input_ids"] for r in rows], self.tokenizer.pad_token_id)
        if "labels" in rows[0]:
            batch["labels"] = torch.tensor([int(r["labels"]) for r in rows], dtype=torch.long)
        return batch

    def _batches(self, queries: Sequence[str], passages: Sequence[str]) -> Iterator[tuple[list[int], dict]]:
        """Length-sorted batches (less padding) with the original positions of their rows."""
        prompts = self.encode(queries, passages)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i].input_ids))
        for lo in range(0, len(order), self.batch_size):
            idx = order[lo : lo + self.batch_size]
            yield idx, self.collate([{"input_ids": prompts[i].input_ids} for i in idx])

    def _score(self, queries: list[str], passages: list[str]) -> np.ndarray:
        import torch

        scores = np.zeros(len(queries), dtype=np.float64)
        self.model.eval()
        with torch.inference_mode():
            for idx, batch in self._batches(queries, passages):
                scores[idx] = self.batch_scores(self.model, batch).double().numpy()
        return scores

    # -- model-specific ------------------------------------------------------------------
    def batch_scores(self, model: "torch.nn.Module", batch: dict) -> "torch.Tensor":
        """P(relevant) per row of a collated batch."""
        import torch

        logits, _ = self.training_logits(model, batch, torch.zeros(len(batch["input_ids"]), dtype=torch.long), False)
        return torch.softmax(logits.float(), dim=-1)[:, 1]

    def training_logits(
        self, model: "torch.nn.Module", batch: dict, labels: "torch.Tensor", token_targets: bool
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """(logits, targets) for the loss; 2-class unless ``token_targets`` and the grader is generative."""
        raise NotImplementedError

    # -- training ------------------------------------------------------------------------
    def fit(
        self,
        queries: Sequence[str],
        passages: Sequence[str],
        labels: Sequence[int],
        config: GraderTrainConfig | None = None,
        progress: ProgressFn | None = None,
    ) -> TrainResult:
        """Train on labelled pairs (1 = relevant) with the shared trainer; the model changes in place."""
        config = config or GraderTrainConfig()
        labels = np.asarray(labels, dtype=np.int64)
        # Empty passages are never shown to the model at inference, so they teach it nothing.
        keep = [i for i, p in enumerate(passages) if p.strip()]
        if not keep:
            raise RagsieveError("no non-empty passages to train on")
        before = self.stats.truncated_passages
        prompts = self.encode([queries[i] for i in keep], [passages[i] for i in keep])  # once, before resampling
        kept_labels = labels[keep]
        chosen = resample_indices(kept_labels, config.sampling, config.seed)
        examples = [{"input_ids": prompts[j].input_ids, "labels": int(kept_labels[j])} for j in chosen]
        self._before_training()
        loss = make_loss(config)

        def logits_fn(model, inputs, y):
            return self.training_logits(model, inputs, y, token_targets=loss.accepts_token_targets)

        steps, losses, seconds = run_trainer(self.model, examples, self.collate, logits_fn, config, progress, loss)
        positives = int(sum(e["labels"] for e in examples))
        result = TrainResult(
            steps=steps, examples=len(examples), seconds=seconds, losses=losses, positives=positives,
            negatives=len(examples) - positives, truncated_passages=self.stats.truncated_passages - before,
        )
        self._record_training(result, config)
        return result

    def _record_training(self, result: TrainResult, config: GraderTrainConfig) -> None:
        """Keep the training summary in the config, so a saved grader says how it was trained."""
        trained = {**result.summary(), "train_config": config.model_dump()}
        self.config = self.config.model_copy(update={"trained": trained})

    def _before_training(self) -> None:
        """Hook: put the model in its trainable state."""

    # -- full-model persistence -------------------------------------------------------------
    def _save_full(self, file: Path) -> None:
        from safetensors.torch import save_model

        save_model(self.model, str(file))  # handles tied input/output embeddings

    def _load_full(self, folder: Path) -> None:
        from safetensors.torch import load_model

        file = _weights_file(folder, self.kind)
        try:
            load_model(self.model, str(file), strict=True)
        except RuntimeError as exc:
            raise RagsieveError(
                f"{file}: weights do not fit base '{self.config.base}' ({str(exc).splitlines()[0][:160]})"
            ) from None


def _weights_file(folder: Path, kind: str) -> Path:
    file = folder / WEIGHTS_FILE
    if not file.is_file():
        raise RagsieveError(f"{folder}: a trained '{kind}' grader needs {WEIGHTS_FILE}, which is missing")
    return file


# -- generative graders ---------------------------------------------------------------------


class PromptedGrader(LMGrader):
    """Baseline: ask the LLM the grading question and read P(yes) from its next-token logits.

    The probability mass of the yes-tokens ("yes", "Yes", ...) is compared with that of
    the no-tokens; no generation, one forward pass per pair, nothing trained.

    Example::

        grader = new_grader("prompted")  # embedded SmolLM2
        grader.grade("who wrote hamlet?", ["Hamlet is a tragedy by William Shakespeare."])
    """

    kind: ClassVar[str] = "prompted"
    head: ClassVar[str] = "causal"

    def __init__(self, model, tokenizer, config: GraderConfig):
        super().__init__(model, tokenizer, config)
        self.verdict = grade_verdict_tokens(tokenizer)

    def verdict_logits(self, vocab_logits: "torch.Tensor") -> "torch.Tensor":
        """``(N, vocab)`` next-token logits → ``(N, 2)`` = [log-mass of no, log-mass of yes]."""
        return two_way_logits(vocab_logits, self.verdict)

    def training_logits(self, model, batch, labels, token_targets):
        import torch

        vocab = answer_logits(model, batch)
        if token_targets:  # learn to emit the canonical verdict token
            targets = torch.where(labels == 1, self.verdict.true_id, self.verdict.false_id)
            return vocab, targets
        return self.verdict_logits(vocab), labels

    def scores_from_states(self, states: np.ndarray) -> np.ndarray:
        """P(yes) from final (normed) last-token states, e.g. the ones cached for config B.

        The backbone is shared by every kind, so one forward pass over a dataset serves the
        prompted baseline and the frozen-head config alike.
        """
        import torch

        with torch.inference_mode():
            vocab = self.model.get_output_embeddings()(torch.from_numpy(np.asarray(states, dtype=np.float32)))
            return torch.softmax(self.verdict_logits(vocab), dim=-1)[:, 1].double().numpy()

    def fit(self, *args: Any, **kwargs: Any) -> TrainResult:
        raise RagsieveError("the prompted grader is a baseline and is not trained; use kind 'generative'")


class GenerativeGrader(PromptedGrader):
    """Config A: the whole LLM fine-tuned to answer the grading prompt with "yes" / "no".

    With the cross-entropy loss it is trained on the full next-token distribution (emit
    the verdict token); with the contrastive loss on the two-way yes/no distribution.
    Scores are read exactly as the prompted baseline reads them.

    Example::

        grader = new_grader("generative")
        grader.fit(queries, passages, labels, GraderTrainConfig(max_steps=100))
        grader.save("models/grader-A")
    """

    kind: ClassVar[str] = "generative"

    def fit(self, *args: Any, **kwargs: Any) -> TrainResult:
        return LMGrader.fit(self, *args, **kwargs)

    def _save_weights(self, file: Path) -> None:
        if self.config.trained:
            self._save_full(file)

    def _load_weights(self, folder: Path) -> None:
        self._load_full(folder)


# -- classification graders ------------------------------------------------------------------


class ClassifierGrader(LMGrader):
    """Config C: the LLM as a 2-label sequence classifier, every weight fine-tuned.

    The classifier reads the last prompt token's final hidden state through a linear
    ``score`` layer; P(relevant) is the softmax of its two logits.

    Example::

        grader = new_grader("classifier")
        grader.fit(queries, passages, labels, GraderTrainConfig(max_steps=100, sampling="oversample"))
        grader.grade("who wrote hamlet?", passages)
    """

    kind: ClassVar[str] = "classifier"
    head: ClassVar[str] = "classify"

    def training_logits(self, model, batch, labels, token_targets):
        out = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        )
        return out.logits, labels

    @property
    def score_layer(self) -> "torch.nn.Linear":
        layer = getattr(self.model, "score", None) or getattr(self.model, "classifier", None)
        if layer is None:
            raise RagsieveError(f"'{self.config.base}' has no 'score' / 'classifier' head to train")
        return layer

    def final_states(self, queries: Sequence[str], passages: Sequence[str]) -> np.ndarray:
        """The backbone's final (normed) hidden state at the last prompt token, one row per pair."""
        import torch

        states = np.zeros((len(queries), int(self.model.config.hidden_size)), dtype=np.float32)
        backbone = self.model.base_model
        with torch.inference_mode():
            for idx, batch in self._batches(queries, passages):
                out = backbone(**{k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")})
                states[idx] = out.last_hidden_state[:, -1].float().numpy()
        return states

    def _save_weights(self, file: Path) -> None:
        if self.config.trained:
            self._save_full(file)

    def _load_weights(self, folder: Path) -> None:
        self._load_full(folder)


def state_head_module(layer: "torch.nn.Module") -> "torch.nn.Module":
    """The classifier's ``score`` layer as a module over cached states, for the trainer."""
    from torch import nn

    class StateHead(nn.Module):
        def __init__(self, inner: nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, states):
            return self.inner(states)

    return StateHead(layer)


class HeadGrader(ClassifierGrader):
    """Config B: frozen backbone, only the linear head on the last token is trained.

    The backbone never changes, so its final states are computed once
    (:meth:`final_states`) and the head trains on them in seconds (:meth:`fit_states`).
    Only the head is saved; loading rebuilds the backbone from the base LLM.

    Example::

        grader = new_grader("head")
        states = grader.final_states(queries, passages)  # the one expensive step
        grader.fit_states(states, labels, GraderTrainConfig(lr=1e-3, epochs=20))
    """

    kind: ClassVar[str] = "head"

    def fit(self, queries, passages, labels, config=None, progress=None) -> TrainResult:
        before = self.stats.truncated_passages
        keep = [i for i, p in enumerate(passages) if p.strip()]
        states = self.final_states([queries[i] for i in keep], [passages[i] for i in keep])
        result = self.fit_states(states, np.asarray(labels)[keep], config, progress)
        result.truncated_passages = self.stats.truncated_passages - before
        return result

    def fit_states(
        self, states: np.ndarray, labels: Sequence[int], config: GraderTrainConfig | None = None,
        progress: ProgressFn | None = None,
    ) -> TrainResult:
        """Train the head on precomputed :meth:`final_states` rows."""
        import torch

        config = config or GraderTrainConfig()
        labels = np.asarray(labels, dtype=np.int64)
        if len(states) != len(labels):
            raise RagsieveError(f"got {len(states)} states but {len(labels)} labels")
        chosen = resample_indices(labels, config.sampling, config.seed)
        x = torch.from_numpy(np.asarray(states, dtype=np.float32))
        examples = [{"states": x[i], "labels": int(labels[i])} for i in chosen]
        head = state_head_module(self.score_layer)

        def collate(rows):
            return {"states": torch.stack([r["states"] for r in rows]),
                    "labels": torch.tensor([r["labels"] for r in rows], dtype=torch.long)}

        def logits_fn(model, inputs, y):
            return model(inputs["states"]), y

        steps, losses, seconds = run_trainer(head, examples, collate, logits_fn, config, progress)
        positives = int(labels[chosen].sum())
        result = TrainResult(
            steps=steps, examples=len(chosen), seconds=seconds, losses=losses, positives=positives,
            negatives=len(chosen) - positives,
        )
        self._record_training(result, config)
        return result

    def state_scores(self, states: np.ndarray) -> np.ndarray:
        """P(relevant) from cached states; equals :meth:`score_pairs` on the same pairs."""
        import torch

        with torch.inference_mode():
            logits = self.score_layer(torch.from_numpy(np.asarray(states, dtype=np.float32)))
            return torch.softmax(logits, dim=-1)[:, 1].double().numpy()

    def _save_weights(self, file: Path) -> None:
        from safetensors.torch import save_file

        if self.config.trained:
            save_file({k: v.detach().contiguous() for k, v in self.score_layer.state_dict().items()}, str(file))

    def _load_weights(self, folder: Path) -> None:
        from safetensors.torch import load_file

        file = _weights_file(folder, self.kind)
        try:
            self.score_layer.load_state_dict(load_file(str(file)))
        except RuntimeError as exc:
            reason = str(exc).splitlines()[0][:160]
            raise RagsieveError(f"{file}: head does not fit base '{self.config.base}' ({reason})") from None


class LoraGrader(ClassifierGrader):
    """Config C with LoRA: rank-``r`` adapters (scale ``alpha / r``) on every linear layer, plus the head.

    The adapters are merged into the weights for scoring (no extra cost at inference)
    and unmerged again before any further training. Only adapters and head are saved.

    Example::

        grader = new_grader("lora", lora_r=16, lora_alpha=32)
        grader.fit(queries, passages, labels, GraderTrainConfig(lr=2e-4, max_steps=40))
    """

    kind: ClassVar[str] = "lora"

    def __init__(self, model, tokenizer, config: GraderConfig):
        from peft import LoraConfig, get_peft_model

        if not config.lora_r or not config.lora_alpha:
            raise RagsieveError("a 'lora' grader needs lora_r and lora_alpha")
        peft_config = LoraConfig(
            task_type="SEQ_CLS", r=config.lora_r, lora_alpha=config.lora_alpha,
            target_modules=config.lora_target_modules, lora_dropout=0.0,
        )
        with quiet_transformers():
            super().__init__(get_peft_model(model, peft_config), tokenizer, config)
        self._merged = False

    @property
    def score_layer(self):
        raise RagsieveError("a LoRA grader trains adapters and head together; use kind 'head' for a head only")

    def _before_training(self) -> None:
        if self._merged:
            self.model.unmerge_adapter()
            self._merged = False

    def _score(self, queries, passages):
        if not self._merged:
            self.model.merge_adapter()
            self._merged = True
        return super()._score(queries, passages)

    def _save_weights(self, file: Path) -> None:
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        if self.config.trained:
            state = get_peft_model_state_dict(self.model)
            save_file({k: v.detach().contiguous() for k, v in state.items()}, str(file))

    def _load_weights(self, folder: Path) -> None:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        file = _weights_file(folder, self.kind)
        self._before_training()
        result = set_peft_model_state_dict(self.model, load_file(str(file)))
        if result.unexpected_keys:
            raise RagsieveError(
                f"{file}: adapters do not fit base '{self.config.base}' (e.g. {result.unexpected_keys[0]})"
            )

