""":class:`FitConfig`: everything ``ragsieve fit`` needs, validated before any model loads."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import Field, field_validator

from ragsieve.config import StrictConfig
from ragsieve.models.specs import DEFAULT_LLM
from ragsieve.probe.train import ProbeTrainConfig
from ragsieve.prune.training import KeepHeadTrainingConfig
from ragsieve.rerank.training.trainer import CrossEncoderTrainConfig


def _probe_train() -> ProbeTrainConfig:
    # The paper's lr 5e-5 barely moves a fresh MLP on a few hundred states (results/probe_nq).
    return ProbeTrainConfig(lr=1e-3, epochs=30, patience=5)


def _align_train() -> CrossEncoderTrainConfig:
    # Guards while training (ragsieve.rerank.training.trainer, issue #18), measured in results/rerank_align_guard
    # (first 100 held-out queries of six gold sets, 55 preference-test questions). The default is the
    # best measured: cosine_mix (the aligned folder keeps the start's scoring, embedded:base: logit +
    # w · 20 · MiniLM cosine) + distill_weight 1 (KL of each group's scores to the start reranker's), the
    # only guard that kept every set not measurably below the start (MRR@10 −0.014 to 0.000) while keeping
    # a measurable preference gain (P@3 +0.061 [+0.024, +0.103]). replay_ratio (share of rows that are gold
    # groups: train questions' answer-bearing candidates vs the rest) kept more preference gain but lost on
    # HotpotQA and PubMedQA; lora_r (LoRA rank, 0 = full fine-tune) and eval_steps (early stopping on dev
    # answer-bearing nDCG@10, 0 = off) at the same lr learned nothing.
    return CrossEncoderTrainConfig(lr=2e-5, epochs=1.0, batch_size=8, max_length=256, save_fp16=True,
                                   distill_weight=1.0, cosine_mix=True)


class AlignConfig(StrictConfig):
    """Fine-tuning the reranker on this LLM's preferences (InfoNCE, 1 pos vs ``n_neg`` neg).

    ``train`` is the training itself (:class:`~ragsieve.rerank.training.trainer.CrossEncoderTrainConfig`);
    fit sets its ``init`` (from ``init`` below), ``group_size`` (1 + ``n_neg``) and ``seed`` (the fit's).
    """

    init: str = "embedded:base"  # the reranker aligned from: a cross-encoder folder or embedded:base
    n_pos: int = Field(5, ge=1)
    n_neg: int = Field(5, ge=1)
    # "rank": top n_pos / bottom n_neg by Inc (the method's definition); "signed": only Inc > 0 /
    # Inc < 0, which drops every question whose Conf(Q) is below all its Conf(Q+C): most of them
    # for a weak LLM (85 % of NQ questions for SmolLM2)
    selection: Literal["rank", "signed"] = "rank"
    # An endpoint LLM has no hidden states, so its preferences come from answers: each of the first
    # answer_candidates candidates (0 = all) alone in the prompt; a passage is preferred when the LLM
    # answers right with it and wrong closed-book (a question it answers closed-book gives no group).
    answer_candidates: int = Field(0, ge=0)
    # Keep the aligned reranker only if it ranks the dev candidates that contain an answer
    # (MRR@10) no worse than max_mrr_drop below the reranker it started from; else the sieve
    # keeps the start (alignment must not cost relevance, issue #18).
    guard: bool = True
    max_mrr_drop: float = Field(0.02, ge=0)
    train: CrossEncoderTrainConfig = Field(default_factory=_align_train)

    @field_validator("train", mode="before")
    @classmethod
    def _over_fit_defaults(cls, value: object) -> object:
        # `train: {lr: 1e-3}` changes the lr and keeps fit's guards (not the bare training defaults)
        return {**_align_train().model_dump(), **value} if isinstance(value, dict) else value


def _sentence_head_train() -> "KeepHeadTrainingConfig":
    # from the shipped head, not from scratch: a few hundred LLM-labelled questions refine what the annotations
    # taught (its classifier is trained already, so it moves at a tenth of the from-scratch rate); a question's
    # labelled passages are its top candidates, so its sentences also share one softmax (across passages, #69)
    return KeepHeadTrainingConfig(epochs=2, learning_rate=2e-5, classifier_learning_rate=1e-4, dev_share=0.2,
                                  across_weight=1.0)


class SentenceLabelConfig(StrictConfig):
    """The ``sentences`` phase (issue #71, :mod:`ragsieve.fit.sentences`): the sentences of each train question's
    top ``passages`` candidates (the start reranker's order) labelled by what they do to this LLM's confidence,
    alone and left out of the top context, and the shipped keep head trained on those labels."""

    enabled: bool = False
    passages: int = Field(3, ge=1)
    # whose top passages: the reranker alignment starts from (what a sieve prunes), or the retriever's
    order: Literal["reranker", "retriever"] = "reranker"
    # what a sentence does to a local LLM: the likelihood of a gold answer after it (RECOMP's signal: on run 6's 233
    # NQ train questions with an answer sentence among others, SmolLM2's answer likelihood labelled it first for
    # 93 %, its probe's Conf shift for 17 %, a random sentence 14 %: studies/sentence_label_signal.py), or the
    # probe's Conf. An endpoint-only fit measures by its right / wrong answers either way.
    signal: Literal["answer", "conf"] = "answer"
    # also measure each sentence left out of the top passages: what a multi-hop question loses without a bridge
    # sentence, at one long prompt per sentence (≈ 3x the phase's time on 2 cores: on for a larger machine)
    leave_one_out: bool = False
    # labels are shifts over the question's largest, at least this: a question whose sentences barely move Conf
    # keeps low labels (examples_from_row)
    min_shift: float = Field(0.05, gt=0, le=1)
    # the forgetting guard (ragsieve.fit.sentences.forgetting_guard): NQ held-out gold passages, answer sentence at
    # best 1, fitted vs shipped head; 3 points, as the aligned reranker's guard allows 2 of MRR. All 518 such
    # held-out questions: on 400, run 6's fitted head (71.25 % vs 71.5 %, 23 vs 24 discordant) could not show 3 points
    guard_questions: int = Field(600, ge=1)
    guard_margin: float = Field(0.03, gt=0, lt=1)
    train: KeepHeadTrainingConfig = Field(default_factory=_sentence_head_train)


def _grid_default_ks() -> list[int]:
    return [0, 1, 2, 3, 5]


class SelectConfig(StrictConfig):
    """The grid ``fit`` answers on dev with the LLM, to choose the sieve by the LLM's answers (issue #39).

    Every configuration is k passages (0 = closed book) in an order (the retriever's, the reranker
    alignment started from, the aligned one if kept), optionally graded (a passage is dropped when its
    reranker score is below a threshold: the F1-calibrated one, or a quantile of the dev scores), optionally
    pruned to its sentences scoring at least a quantile of the dev sentence scores (the reranker alignment
    started from scores each ``title: sentence``; pruned configurations are not gated), put in
    the prompt best first or best last, optionally behind the CBDR gate (β: the gate policy's, or the
    quantiles of dev Conf(Q), when a probe exists; ``gate: none`` tries no gate, ``gate: budget=x`` keeps
    every retrieving configuration behind the budget's β). The most accurate on dev wins; ties go to fewer
    prompt tokens. ``objective: frugal`` takes the configuration with the fewest prompt tokens among those
    shown non-inferior to the most accurate one at ``margin`` (the paired difference's 95 % lower bound above
    −margin): the same answers from less context, as far as the questions show. ``objective: tokens=300``
    takes the most accurate configuration within 300 mean prompt tokens when it is non-inferior to the most
    accurate of all, else the most accurate of all. Placements are searched around the best
    configurations (``placement_search: refine``) unless ``placement_search: full``. The grid is raced
    (``race``): a configuration measurably beaten by one no more expensive stops being answered early.
    """

    ks: list[int] = Field(default_factory=_grid_default_ks)
    plain_ks: list[int] = [1, 2, 3, 5]  # the best plain configuration (retriever order, no grade, no gate)
    grade_quantiles: list[float] = [0.25, 0.5, 0.75]
    gate_quantiles: list[float] = [0.25, 0.5, 0.75]
    # sentence pruning (issue #61): each kept passage cut to the sentences the base reranker scores at or above a
    # quantile of the dev sentence scores (always its best one); [] tries no threshold
    prune_quantiles: list[float] = [0.5, 0.75, 0.9]
    # and the best n sentences of each kept passage, whatever they score (RECOMP-style top-n); [] tries none
    prune_max_sentences: list[int] = [1, 2]
    # and the best n sentences of all the kept passages together (issue #69: evidence spread over two passages
    # costs two sentences, not two passages), for k >= 2; [] tries none
    prune_across_sentences: list[int] = [2, 3]
    # and the best sentences of all the kept passages within a token budget (what reaches the prompt, in the
    # scorer's tokens), for k >= 2: the prune study's 48 and 96 tokens over the top 3 (results/prune_across); [] none
    prune_token_caps: list[int] = [48, 96]
    # sentence scorers beside zero-shot (the start reranker's (question, title: sentence) pairs): each prune level
    # is tried with each, and the answers choose; a keep head (Provence-style, ragsieve.prune.head) by its spec
    prune_scorers: list[str] = ["prune-head"]
    placements: list[Literal["best_first", "best_last"]] = ["best_first", "best_last"]
    # refine: the grid is answered with the first placement, then the other placements only for the
    # ``refine_top`` best configurations of two or more passages (each placement of a k >= 2 row is a new,
    # long prompt per dev question: searching them everywhere doubles the grid's LLM time for little);
    # full: every placement of every configuration
    placement_search: Literal["refine", "full"] = "refine"
    refine_top: int = Field(3, ge=1)
    objective: str = "accuracy"
    # "as good as" (issue #70): a cheaper configuration replaces the most accurate one (frugal, tokens=) and the
    # choice ships over the best plain configuration only when the 95 % interval of the paired accuracy
    # difference clears -margin (non-inferiority). 2 points: for SmolLM2 on NQ retrieval adds 20 points over
    # closed book (5 % -> 25 %), so a sieve within 2 points keeps at least 90 % of what retrieval buys, the
    # share a non-inferiority trial keeps of the active comparator's effect (ICH E10); wider margins let a
    # small dev set call a lost fifth of retrieval's gain "as good".
    margin: float = Field(0.02, gt=0, lt=1)
    # the choice is made and estimated by cross-fitting over dev + test: in each of ``folds`` folds the
    # configuration chosen on the other folds answers the fold's questions, so the reported accuracy is never
    # the winner's own (optimistic) score; the shipped configuration is chosen on all of them
    folds: int = Field(5, ge=2)
    # the McNemar tests reported beside the margin verdicts, and the race's two-sided level
    alpha: float = Field(0.05, gt=0, lt=1)
    n_boot: int = Field(2000, ge=100)
    # racing (Selection.race): the grid is answered on the dev questions in order, ``race_min`` first, then
    # ``race_batch`` at a time; after each round a configuration is dropped when one no more expensive (mean
    # prompt tokens) answers measurably better on the questions so far (one-sided exact McNemar, p <
    # ``race_alpha``), so the Pareto frontier keeps its cheap points. Closed book and the plain
    # configurations are never dropped; the survivors answer every dev question. ``race: false`` answers
    # every configuration on every dev question.
    race: bool = True
    race_min: int = Field(40, ge=1)
    race_batch: int = Field(40, ge=1)
    race_alpha: float = Field(0.01, gt=0, lt=1)

    @field_validator("prune_max_sentences", "prune_across_sentences", "prune_token_caps")
    @classmethod
    def _caps(cls, value: list[int]) -> list[int]:
        if any(n < 1 for n in value):
            raise ValueError("sentence and token caps must be >= 1")
        return sorted(set(value))

    @field_validator("ks", "plain_ks")
    @classmethod
    def _sizes(cls, value: list[int]) -> list[int]:
        if not value or any(k < 0 for k in value):
            raise ValueError("passage counts must be a non-empty list of k >= 0")
        return sorted(set(value))

    @field_validator("grade_quantiles", "gate_quantiles", "prune_quantiles")
    @classmethod
    def _shares(cls, value: list[float]) -> list[float]:
        if any(not 0 < q < 1 for q in value):
            raise ValueError("quantiles must be in (0, 1)")
        return sorted(set(value))

    @field_validator("objective")
    @classmethod
    def _objective(cls, value: str) -> str:
        token_budget(value)  # raises on a bad objective
        return value


class FitConfig(StrictConfig):
    """``ragsieve fit --index IDX --questions QA --llm SPEC --out SIEVE``.

    ``gate`` is the CBDR policy: ``parity`` (largest skip while accuracy stays within
    ``parity_tolerance`` of always retrieving, on dev), ``budget=0.6`` (retrieve for at
    most 60 % of questions), or ``none`` (always retrieve).

    Example::

        FitConfig(index="index/mine", questions="qa.jsonl", out="sieves/mine", gate="budget=0.6")
    """

    index: str
    questions: str
    out: str
    # A local HF causal LM, or an endpoint only (openai:<url>#<model>): then fit runs what needs only
    # answers (labels, preferences from answers, the selection) and skips the probe and the gate.
    llm: str = DEFAULT_LLM
    # An OpenAI-compatible endpoint serving the same model answers the labelling prompts
    # (fast on a GPU server); the probe still reads the local copy's hidden states.
    generator: Optional[str] = None
    gate: str = "parity"
    parity_tolerance: float = Field(0.005, ge=0, le=1)
    # parity must be shown on dev at this level (upper bound of the accuracy lost by skipping);
    # None: the observed dev loss alone (overfits a small dev set: it skipped half of NQ for SmolLM2)
    parity_confidence: Optional[float] = Field(0.95, gt=0, lt=1)
    split: dict[str, float] = {"train": 0.6, "dev": 0.2, "test": 0.2}
    max_questions: int = Field(0, ge=0, description="0 = every question in the file")
    top_k: int = Field(3, ge=1)  # passages of the labelling prompts (the probe's data); select chooses the sieve's
    candidates: int = Field(20, ge=2)
    layers: list[Union[int, float]] = [0.25, 0.5, 0.75]  # probe layers tried; the best on dev wins
    probe: ProbeTrainConfig = Field(default_factory=_probe_train)
    align: AlignConfig = Field(default_factory=AlignConfig)
    select: SelectConfig = Field(default_factory=SelectConfig)
    sentences: SentenceLabelConfig = Field(default_factory=SentenceLabelConfig)
    grade: bool = True  # calibrate a grader threshold on dev
    max_new_tokens: int = Field(16, ge=1)
    max_prompt_tokens: int = Field(1024, ge=64)
    batch_size: int = Field(8, ge=1)
    seed: int = 0
    data_dir: Optional[str] = None
    # Ray Data for the heavy phases (Conf(Q+C), generations): "local" or a cluster address.
    ray: Optional[str] = None
    # A folder of the fit's text-free records: every LLM answer by prompt digest (answers.jsonl) and the
    # confidence shifts by question and candidate id (shifts.jsonl). Written as the fit runs and read when it
    # starts, so a fit longer than one machine's life resumes on another from committed records.
    records: Optional[str] = None

    @field_validator("gate")
    @classmethod
    def _gate_policy(cls, value: str) -> str:
        gate_budget(value)  # raises on a bad policy
        return value

    @field_validator("split")
    @classmethod
    def _three_splits(cls, value: dict[str, float]) -> dict[str, float]:
        if set(value) != {"train", "dev", "test"} or any(v <= 0 for v in value.values()):
            raise ValueError("split needs positive train, dev and test shares")
        return value

    @property
    def work(self) -> Path:
        """Intermediate files (labels, shifts, states): what lets a killed fit resume."""
        return Path(self.out) / "work"


def _named_number(text: str, name: str) -> Optional[float]:
    """``name=<number>`` → the number; None when ``text`` is not of that form."""
    key, _, value = text.partition("=")
    try:
        return float(value) if key == name else None
    except ValueError:
        return None


def gate_budget(policy: str) -> Optional[float]:
    """``budget=0.6`` → 0.6; ``parity`` / ``none`` → None; anything else is a ValueError."""
    if policy in ("parity", "none"):
        return None
    budget = _named_number(policy, "budget")
    if budget is None or not 0.0 < budget <= 1.0:
        raise ValueError(f"gate policy '{policy}': use parity, none or budget=<share in (0, 1]>")
    return budget


#: the objectives ``select.objective`` takes besides ``tokens=<budget>``
OBJECTIVES = ("accuracy", "frugal")


def token_budget(objective: str) -> Optional[float]:
    """``tokens=300`` → 300.0; ``accuracy`` and ``frugal`` → None; anything else is a ValueError."""
    if objective in OBJECTIVES:
        return None
    budget = _named_number(objective, "tokens")
    if budget is None or budget <= 0:
        raise ValueError(f"objective '{objective}': use accuracy, frugal or tokens=<mean prompt tokens, > 0>")
    return budget
