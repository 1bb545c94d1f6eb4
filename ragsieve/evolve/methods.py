"""The evolving-reranker methods and one round of the protocol.

Round t (:func:`evolve_round`): M_{t-1} predicts the new batch D_t (accuracy and F1 on
D_t are the evaluation), the method turns D_t into pairs, builds its training set and
trains M_t as a fresh LoRA delta on M_{t-1}. Methods, by name (:data:`METHODS`):

=================  ==========  ===================================================================
name               objective   training set of round t
=================  ==========  ===================================================================
``sft-only``       none        nothing: M0 stays frozen
``sft``            sft         gold labels of D_t
``dpo``            dpo         gold pairs of D_t (new pairs only)
``replay-dpo``     dpo         gold pairs of D_t plus replayed history pairs, so that new pairs
                               are a share ``alpha`` of the set (alpha = 1: plain ``dpo``)
``cautious-dpo``   dpo         no labels after M0: M_{t-1}'s own label where its confidence
                               >= ``tau`` (source ``self``), else the majority vote of the
                               judges plus M_{t-1} (source ``jury``), ties skipped
``checked-``       dpo         ``cautious-dpo`` whose labellers are first checked on the gold labels
``cautious-dpo``               of a sample of the batch (a simulated user's; used for nothing else)
=================  ==========  ===================================================================

CautiousDPO ablations: ``gating: false`` sends every example to the vote (no confidence
gate); ``jury: false`` keeps only the confident self-labels (no multi-judge vote).
``balance: true`` guards against self-training collapse: once DPO has made M_{t-1}
over-confident it may pass the gate on every example with one verdict, and training on those
labels entrenches a constant classifier. Balanced acceptance keeps the accepted labels in the
label prior of the gold pairs seen so far (0.5 if none), dropping the least confident surplus of
the over-represented verdict; a round whose accepted labels are all one verdict adds no pairs
(class-balanced self-training, as in CBST, Zou et al. 2018).
A pair is (prompt, chosen = label word of the accepted label, rejected = the other word).
Replay keeps every new pair and adds ``round(n_new * (1 - alpha) / alpha)`` pairs drawn
without replacement from all earlier rounds (round 0 = the gold SFT set).

Example::

    method = build_method(MethodConfig(kind="replay-dpo", alpha=0.7))
    record, new_pairs = evolve_round(ranker, method, batch, history, round_id=1,
                                     labels={x.id: x.label for x in batch}, train_config=VerdictTrainConfig())
"""

from __future__ import annotations

import random
import time
from abc import ABC
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.models.verdict import VerdictScores
from ragsieve.data.records import LabeledPair

if TYPE_CHECKING:
    from ragsieve.evolve.judges import Judge
    from ragsieve.rerank.pointwise import PointwiseLLMReranker
    from ragsieve.evolve.train import VerdictTrainConfig

SOURCES = ("gold", "self", "jury")


@dataclass(frozen=True)
class Pair:
    """A training pair: ``label`` is the verdict taken as correct (its word is chosen)."""

    example: LabeledPair
    label: int
    source: str  # gold | self | jury
    round: int


@dataclass
class LabelOutcome:
    pairs: list[Pair]
    stats: dict[str, Any] = field(default_factory=dict)


class MethodConfig(StrictConfig):
    """A method by name and its knobs, e.g. ``MethodConfig(kind="cautious-dpo", tau=0.9, jury=False)``."""

    kind: str
    alpha: float = 1.0  # share of new pairs in the training set (replay)
    tau: float = 0.9  # CautiousDPO confidence gate
    gating: bool = True  # ablation: False = every example goes to the vote
    jury: bool = True  # ablation: False = confident self-labels only
    balance: bool = False  # keep accepted labels in the gold label prior (collapse guard)


class EvolveMethod(ABC):
    """Labels a round's batch and assembles the training set."""

    objective: ClassVar[str] = "dpo"  # none | sft | dpo
    replays: ClassVar[bool] = False
    uses_gold: ClassVar[bool] = True  # False: no labels after M0 (only feedback, if any)

    def __init__(self, config: MethodConfig, judges: Sequence["Judge"] = ()):
        if not 0.0 < config.alpha <= 1.0:
            raise RagsieveError(f"alpha must be in (0, 1], got {config.alpha}")
        self.config = config
        self.judges = list(judges)

    @property
    def alpha(self) -> float:
        return self.config.alpha if self.replays else 1.0

    def label(
        self, examples: Sequence[LabeledPair], verdicts: VerdictScores, round_id: int, labels: Mapping[str, int],
        history: Sequence[Pair] = (),
    ) -> LabelOutcome:
        """Default: the labels the method may see (gold / feedback); unlabelled examples are skipped."""
        pairs = [Pair(x, int(labels[x.id]), "gold", round_id) for x in examples if x.id in labels]
        return LabelOutcome(pairs, {"n": len(examples), "accepted": len(pairs), "source": "gold"})

    def training_set(self, new: Sequence[Pair], history: Sequence[Pair], rng: random.Random) -> list[Pair]:
        return list(new) + replay_sample(new, history, self.alpha, rng)


class SFTOnly(EvolveMethod):
    objective = "none"

    def label(self, examples, verdicts, round_id, labels, history=()):
        return LabelOutcome([], {"n": len(examples), "accepted": 0})


class MultiRoundSFT(EvolveMethod):
    objective = "sft"


class MultiRoundDPO(EvolveMethod):
    objective = "dpo"


class ReplayDPO(EvolveMethod):
    objective = "dpo"
    replays = True


class CautiousDPO(EvolveMethod):
    """Self-labels when confident, a jury vote otherwise; gold only where feedback exists."""

    objective = "dpo"
    replays = True
    uses_gold = False
    #: False when the model's confident verdicts failed the labeller check (judges.check_labellers):
    #: it then neither self-labels nor votes, and only the judges label
    trust_self: bool = True

    def label(self, examples, verdicts, round_id, labels, history=()):
        cfg = self.config
        gated = cfg.gating and self.trust_self
        confident = verdicts.confidence >= cfg.tau if gated else np.zeros(len(examples), dtype=bool)
        own = verdicts.predictions
        decided: dict[int, tuple[int, str]] = {}
        to_vote = []
        for i, x in enumerate(examples):
            if x.id in labels:  # feedback: a real label beats any guess
                decided[i] = (int(labels[x.id]), "gold")
            elif confident[i]:
                decided[i] = (int(own[i]), "self")
            elif cfg.jury and (self.judges or self.trust_self):
                to_vote.append(i)
        ties = 0
        if to_vote:
            batch = [examples[i] for i in to_vote]
            ballots = [judge.votes(batch) for judge in self.judges]
            for j, i in enumerate(to_vote):
                votes = [b[j] for b in ballots if b[j] is not None] + ([int(own[i])] if self.trust_self else [])
                yes = sum(votes)
                if 2 * yes == len(votes):
                    ties += 1
                    continue
                decided[i] = (int(2 * yes > len(votes)), "jury")
        extra = {}
        if cfg.balance:
            gold = [p.label for p in history if p.source == "gold"]
            kept = balanced_acceptance(decided, verdicts.confidence, float(np.mean(gold)) if gold else 0.5)
            extra["dropped_for_balance"], decided = len(decided) - len(kept), kept
        pairs = [Pair(examples[i], lab, src, round_id) for i, (lab, src) in sorted(decided.items())]
        return LabelOutcome(pairs, {**pseudo_label_stats(examples, decided, ties), **extra})


class CheckedCautiousDPO(CautiousDPO):
    """CautiousDPO behind the deployment store's labeller check, for simulations (the studies).

    In a store the check runs on the user's labelled feedback (``store._check_labellers``). A
    simulation has none, so each round a user is taken to label ``check_size`` of the incoming
    examples (a seeded sample, balanced by their hidden gold labels): those labels check every
    judge and M_{t-1}'s confident verdicts (:func:`~ragsieve.evolve.judges.check_labellers`) and
    are used for nothing else, so the one difference to ``cautious-dpo`` is the check. A labeller
    that fails does not label this round; with none left the round adds no pair.
    """

    check_size: ClassVar[int] = 50

    def label(self, examples, verdicts, round_id, labels, history=()):
        from ragsieve.evolve.judges import SELF_LABELLER, check_labellers

        if not hasattr(self, "all_judges"):
            self.all_judges, self.base_config = list(self.judges), self.config
        check_set = check_sample(examples, self.check_size, f"{round_id}")
        own = {x.id: (int(p), float(c)) for x, p, c in zip(examples, verdicts.predictions, verdicts.confidence)}
        check = check_labellers(check_set, self.all_judges, own, self.base_config.tau)
        self.judges = [j for j in self.all_judges if j.name in check["used"]]
        self.trust_self = SELF_LABELLER in check["used"]
        self.config = self.base_config if self.judges else self.base_config.model_copy(update={"jury": False})
        if not self.judges and not self.trust_self:
            stats = {**pseudo_label_stats(examples, {}, 0), "labeller_check": check,
                     "skipped": f"no labeller clears chance on {len(check_set)} labelled examples"}
            return LabelOutcome([], stats)
        outcome = super().label(examples, verdicts, round_id, labels, history)
        outcome.stats["labeller_check"] = check
        return outcome


def check_sample(examples: Sequence[LabeledPair], size: int, salt: str) -> list[LabeledPair]:
    """A seeded sample of ``size`` labelled examples, half of each gold label where there are enough."""
    rng = random.Random(f"check:{salt}")
    by_label = {lab: sorted((x for x in examples if x.label == lab), key=lambda x: x.id) for lab in (0, 1)}
    want = {1: size // 2, 0: size - size // 2}
    short = {lab: max(0, want[lab] - len(by_label[lab])) for lab in (0, 1)}
    want = {1: want[1] + short[0], 0: want[0] + short[1]}  # a one-sided batch gives what it has
    return [x for lab in (0, 1) for x in rng.sample(by_label[lab], min(want[lab], len(by_label[lab])))]


def balanced_acceptance(
    decided: Mapping[int, tuple[int, str]], confidence: np.ndarray, prior: float
) -> dict[int, tuple[int, str]]:
    """Keep the guessed labels in proportion ``prior`` : ``1 - prior`` (label 1 : label 0).

    Gold feedback is always kept. Among guesses, the largest set in that proportion is
    kept, the most confident of each label first; guesses of only one label keep none.

    >>> decided = {0: (1, "self"), 1: (1, "self"), 2: (1, "jury"), 3: (0, "jury")}
    >>> sorted(balanced_acceptance(decided, np.array([0.99, 0.95, 0.6, 0.7]), prior=0.5))
    [0, 3]
    """
    if not 0.0 < prior < 1.0:
        return {i: d for i, d in decided.items() if d[1] == "gold"}
    guesses = {lab: sorted((i for i, (guess, src) in decided.items() if guess == lab and src != "gold"),
                           key=lambda i: -confidence[i]) for lab in (0, 1)}
    total = min(len(guesses[1]) / prior, len(guesses[0]) / (1.0 - prior))
    keep = {1: min(len(guesses[1]), round(total * prior)), 0: min(len(guesses[0]), round(total * (1.0 - prior)))}
    chosen = {i for lab in (0, 1) for i in guesses[lab][: keep[lab]]}
    return {i: d for i, d in decided.items() if d[1] == "gold" or i in chosen}


def pseudo_label_stats(examples: Sequence[LabeledPair], decided: Mapping[int, tuple[int, str]], ties: int) -> dict:
    """Accepted labels vs the hidden gold (where known), overall and per source.

    ``accepted_true`` (per source too) is the verdict mix: how many accepted labels say
    "true". A collapse shows as a mix of all-true or all-false with accuracy at the gold
    prior, so it is measured from the record rather than inferred from the model's outputs.
    """
    stats: dict[str, Any] = {"n": len(examples), "accepted": len(decided), "ties_skipped": ties}
    stats["coverage"] = len(decided) / len(examples) if examples else 0.0
    for source in (None, *SOURCES):
        rows = [(examples[i].label, lab) for i, (lab, src) in decided.items() if source in (None, src)]
        known = [(g, lab) for g, lab in rows if g >= 0]
        key = "all" if source is None else source
        stats[key] = {
            "n": len(rows),
            "accuracy": (sum(g == lab for g, lab in known) / len(known)) if known else None,
            "accepted_true": sum(lab for _, lab in rows),
            "gold_true": sum(g == 1 for g, _ in known),
        }
    overall = stats.pop("all")
    stats["accuracy"] = overall["accuracy"]
    stats["accepted_true"], stats["gold_true"] = overall["accepted_true"], overall["gold_true"]
    return stats


def replay_sample(new: Sequence[Pair], history: Sequence[Pair], alpha: float, rng: random.Random) -> list[Pair]:
    """History pairs to add so that new pairs make a share ``alpha`` of the training set."""
    if alpha >= 1.0 or not history or not new:
        return []
    want = min(len(history), round(len(new) * (1.0 - alpha) / alpha))
    ordered = sorted(history, key=lambda p: (p.round, p.example.id))  # input order must not matter
    return rng.sample(ordered, want)


#: method name → class.
METHODS: dict[str, type[EvolveMethod]] = {
    "sft-only": SFTOnly,
    "sft": MultiRoundSFT,
    "dpo": MultiRoundDPO,
    "replay-dpo": ReplayDPO,
    "cautious-dpo": CautiousDPO,
    "checked-cautious-dpo": CheckedCautiousDPO,
}


def build_method(config: MethodConfig, judges: Sequence["Judge"] = ()) -> EvolveMethod:
    try:
        cls = METHODS[config.kind]
    except KeyError:
        raise RagsieveError(f"unknown method '{config.kind}'; known: {', '.join(METHODS)}") from None
    return cls(config, judges)


# --------------------------------------------------------------------------- one round


@dataclass
class RoundRecord:
    round: int
    metrics: dict[str, Any]  # M_{t-1} on D_t
    labels: dict[str, Any]  # pseudo-label stats
    n_new_pairs: int = 0
    n_replayed: int = 0
    train: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "round": self.round, **self.metrics, "labels": self.labels, "n_new_pairs": self.n_new_pairs,
            "n_replayed": self.n_replayed, "train": self.train, "seconds": self.seconds,
        }


def verdict_metrics(examples: Sequence[LabeledPair], verdicts: VerdictScores) -> dict[str, Any]:
    """Accuracy / F1 (class 1) / AUROC of thresholded scores on examples with a known label."""
    from ragsieve.eval.classification import classification_metrics

    known = [i for i, x in enumerate(examples) if x.label >= 0]
    if not known:
        return {"accuracy": None, "f1": None, "n": 0}
    y = [examples[i].label for i in known]
    m = classification_metrics(y, verdicts.predictions[known], verdicts.score[known])
    return {k: m[k] for k in ("accuracy", "f1", "n", "auroc", "positive_rate")}


def evolve_round(
    ranker: "PointwiseLLMReranker",
    method: EvolveMethod,
    examples: Sequence[LabeledPair],
    history: Sequence[Pair],
    *,
    round_id: int,
    labels: Mapping[str, int],
    train_config: "VerdictTrainConfig",
    train: bool = True,
    save_dir: str | Path | None = None,
    seed: int = 0,
    verdicts: VerdictScores | None = None,
) -> tuple[RoundRecord, list[Pair]]:
    """Evaluate M_{t-1} on D_t, label, and (if ``train``) turn ``ranker`` into M_t.

    ``labels`` are the labels the method may use (gold in the experiment, feedback in a
    deployment); ``examples[i].label`` is only read for evaluation (-1 = unknown).
    ``verdicts``: M_{t-1}'s verdicts on ``examples`` if the caller has them (e.g. M0 on D_1,
    the same for every method), so they are not recomputed.
    Returns the round's record and the new pairs (for the history / replay buffer).
    """
    from ragsieve.evolve.train import nan_scores, train_round

    t0 = time.perf_counter()
    verdicts = ranker.predict(examples) if verdicts is None else verdicts
    t_eval = time.perf_counter() - t0
    outcome = method.label(examples, verdicts, round_id, labels, history)
    t_label = time.perf_counter() - t0 - t_eval
    rng = random.Random(f"{seed}:{round_id}")
    train_set = method.training_set(outcome.pairs, history, rng)
    record = RoundRecord(
        round_id, verdict_metrics(examples, verdicts), outcome.stats,
        n_new_pairs=len(outcome.pairs), n_replayed=len(train_set) - len(outcome.pairs),
    )
    if train and method.objective != "none" and train_set:
        truncated_before = ranker.prompter.truncated
        prompts = ranker.prompts([p.example for p in train_set])
        # M_{t-1}'s verdicts on D_t are exactly the DPO reference for this round's pairs.
        ref = nan_scores(len(train_set))
        position = {x.id: i for i, x in enumerate(examples)}
        for j, p in enumerate(train_set):
            if p.round == round_id and p.example.id in position:
                i = position[p.example.id]
                ref.logp_true[j], ref.logp_false[j] = verdicts.logp_true[i], verdicts.logp_false[i]
        config = train_config.model_copy(update={"seed": seed + round_id})
        result = train_round(
            ranker.llm, ranker.tokens, method.objective, prompts, [p.label for p in train_set], config,
            ref=ref, save_dir=save_dir,
        )
        result.truncated_passages = ranker.prompter.truncated - truncated_before
        record.train = result.summary()
    record.seconds = {"eval": round(t_eval, 2), "label": round(t_label, 2), "total": round(time.perf_counter() - t0, 2)}
    return record, outcome.pairs
