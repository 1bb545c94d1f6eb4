"""Judges: the jury CautiousDPO asks when the model is not confident.

A judge votes 1 (true word), 0 (false word) or ``None`` (abstains) per example. Judges
are configured as a list of specs and built through :data:`JUDGES` (kind → class):

* ``llm:<local LLM spec>``: a prompted local causal LM (zero-shot, same template), score
  P(true) / (P(true) + P(false)), thresholded.
* ``cross-encoder:<folder, HF id or embedded:base>``: a cross-encoder's logit, thresholded.
* ``reranker:<load_reranker spec>``: any ragsieve reranker (``bi-encoder``, ``bm25``, ...), thresholded.
* ``openai:<url>#<model>``: an OpenAI-compatible endpoint; its answer's first word is
  matched to the label words (anything else abstains).

Thresholds are a number or ``calibrate``: the accuracy-maximising cut on the labelled SFT
set (the only labels CautiousDPO may use), via :func:`ragsieve.eval.classification.best_threshold`.

Example::

    judges = build_judges(["llm:embedded:smollm2-135m-instruct", "reranker:bi-encoder"], "fever")
    for judge in judges:
        judge.calibrate(task.initial)
    votes = [judge.votes(batch) for judge in judges]
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, Literal, Optional, Union

import numpy as np
from pydantic import model_validator

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.data.records import LabeledPair
from ragsieve.prompts.verdicts import VerdictTemplate, get_template
from ragsieve.specs import judge_spec, parse_judge_spec, reranker_spec_or

Vote = Optional[int]


class JudgeSpec(StrictConfig):
    """``kind`` (a key of :data:`JUDGES`) and its model; a string ``"kind:model"`` also works.

    Example::

        JudgeSpec.model_validate("cross-encoder:embedded:base")   # kind cross-encoder, model embedded:base
        JudgeSpec(kind="llm", model="embedded:smollm2-135m-instruct", threshold=0.5)
    """

    kind: str
    model: str = ""
    threshold: Union[float, Literal["calibrate"]] = "calibrate"
    max_prompt_tokens: int = 384

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        if isinstance(data, str):
            return cls.parse_fields(data)
        return data

    @staticmethod
    def parse_fields(text: str) -> dict[str, str]:
        kind, model = parse_judge_spec(text)  # an endpoint keeps its own scheme: openai:<url>#<model>
        return {"kind": kind, "model": model}

    @property
    def label(self) -> str:
        return judge_spec(self.kind, self.model)


class Judge(ABC):
    """Votes on examples; scores are cached by example id (judges never change)."""

    def __init__(self, spec: JudgeSpec, template: VerdictTemplate):
        self.spec = spec
        self.template = template
        self.threshold: float | None = spec.threshold if isinstance(spec.threshold, float) else None
        self._cache: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return self.spec.label

    def calibrate(self, examples: Sequence[LabeledPair]) -> None:
        """Pick the threshold on labelled examples when the spec asks for ``calibrate``."""

    @abstractmethod
    def votes(self, examples: Sequence[LabeledPair]) -> list[Vote]: ...

    def describe(self) -> dict[str, Any]:
        return {"judge": self.name, "threshold": self.threshold}


class ScoreJudge(Judge):
    """Any ranker as a judge: its pair score per example, voting ``score >= threshold``.

    The ranker comes from :func:`ragsieve.registry.load_reranker`: ``llm:<spec>`` is the
    pointwise verdict of that LLM under the dataset's template, ``cross-encoder:<model>``
    and ``reranker:<spec>`` the named reranker.
    """

    def __init__(self, spec: JudgeSpec, template: VerdictTemplate):
        from ragsieve.registry import load_reranker

        super().__init__(spec, template)
        ranker_spec, options = self.reranker_args(spec, template)
        self.ranker = load_reranker(ranker_spec, **options)

    @staticmethod
    def reranker_args(spec: JudgeSpec, template: VerdictTemplate) -> tuple[str, dict[str, Any]]:
        """The registry spec and keyword arguments of the ranker behind this judge."""
        if spec.kind == "llm":
            # the template object, not its name: a user's own template is in no packaged file
            return "pointwise", {"template": template, "llm": spec.model, "max_prompt_tokens": spec.max_prompt_tokens}
        if spec.kind == "cross-encoder":  # a folder or HF id, or already a reranker spec (embedded:base)
            return reranker_spec_or(spec.model, "cross-encoder"), {}
        return spec.model, {}

    def compute_scores(self, examples: Sequence[LabeledPair]) -> np.ndarray:
        return np.asarray(self.ranker.score_pairs([x.query for x in examples], [x.passage for x in examples]))

    def scores(self, examples: Sequence[LabeledPair]) -> np.ndarray:
        todo = [x for x in examples if x.id not in self._cache]
        if todo:
            for x, s in zip(todo, self.compute_scores(todo)):
                self._cache[x.id] = float(s)
        return np.array([self._cache[x.id] for x in examples], dtype=np.float64)

    def calibrate(self, examples: Sequence[LabeledPair]) -> None:
        from ragsieve.eval.classification import best_threshold

        if self.spec.threshold != "calibrate":
            return
        labels = [x.label for x in examples]
        if len(set(labels)) < 2:
            raise RagsieveError(f"judge {self.name}: calibration needs both labels in the labelled set")
        self.threshold = best_threshold(labels, self.scores(examples), metric="accuracy")

    def votes(self, examples: Sequence[LabeledPair]) -> list[Vote]:
        if self.threshold is None:
            raise RagsieveError(f"judge {self.name} has threshold 'calibrate' but was never calibrated")
        return [int(s >= self.threshold) for s in self.scores(examples)]


class EndpointJudge(Judge):
    """An OpenAI-compatible endpoint answering the template; the first word is the vote."""

    def __init__(self, spec: JudgeSpec, template: VerdictTemplate):
        from ragsieve.models.llm import load_llm

        super().__init__(spec, template)
        self.generator = load_llm(spec.model)

    def parse(self, answer: str) -> Vote:
        first = re.sub(r"[^\w]", "", (answer.split() or [""])[0]).lower()
        words = {self.template.true_word.lower(): 1, self.template.false_word.lower(): 0}
        return words.get(first)

    def votes(self, examples):
        todo = [x for x in examples if x.id not in self._cache]
        if todo:
            answers = self.generator.generate([self.template.render(x.fields) for x in todo], max_new_tokens=8)
            for x, a in zip(todo, answers):
                self._cache[x.id] = self.parse(a)
        return [self._cache[x.id] for x in examples]


#: judge kind → class.
JUDGES: dict[str, type[Judge]] = {
    "llm": ScoreJudge,
    "cross-encoder": ScoreJudge,
    "reranker": ScoreJudge,
    "openai": EndpointJudge,
}


def build_judges(specs: Sequence[JudgeSpec | str | dict], template: VerdictTemplate | str) -> list[Judge]:
    """Judges for a dataset's template from their specs (see the module doc)."""
    from ragsieve.config import build_config

    template = get_template(template) if isinstance(template, str) else template
    judges = []
    for raw in specs:
        spec = raw if isinstance(raw, JudgeSpec) else build_config(JudgeSpec, raw, source="judge spec")
        try:
            cls = JUDGES[spec.kind]
        except KeyError:
            raise RagsieveError(f"unknown judge kind '{spec.kind}'; known: {', '.join(sorted(JUDGES))}") from None
        judges.append(cls(spec, template))
    return judges


# --------------------------------------------------------------------------- the check before labelling

#: the labeller name of the model's own confident verdicts in a check
SELF_LABELLER = "self (confident)"


def labeller_accuracy(name: str, gold: Sequence[int], guesses: Sequence[Vote]) -> dict[str, Any]:
    """One labeller against the gold labels it did not abstain on: accuracy, its Wilson 95 % interval,
    and whether the interval's low end clears chance.

    Chance is the accuracy of always answering the majority label of those same examples
    (``max(prior, 1 - prior)``), not 0.5: on feedback that is 80 % "relevant", a labeller that
    calls everything relevant is right 80 % of the time and teaches nothing. With no labelled
    example the interval is [0, 1] and the labeller is not used.

    >>> r = labeller_accuracy("j", [1, 1, 0, 0] * 10, [1, 1, 0, 0] * 10)
    >>> r["used"], r["chance"], round(r["low"], 2)
    (True, 0.5, 0.91)
    >>> labeller_accuracy("always-true", [1, 1, 1, 0] * 10, [1] * 40)["used"]
    False
    """
    from ragsieve.eval.stats import proportion_interval

    known = [(g, v) for g, v in zip(gold, guesses) if v is not None]
    n = len(known)
    if not n:
        return {"labeller": name, "n": 0, "accuracy": None, "low": 0.0, "high": 1.0, "chance": 0.5, "used": False}
    correct = [int(g == v) for g, v in known]
    accuracy, low, high = proportion_interval(correct)  # every example its own unit: Wilson
    prior = sum(g for g, _ in known) / n
    chance = max(prior, 1.0 - prior)
    return {"labeller": name, "n": n, "accuracy": accuracy, "low": low, "high": high, "chance": chance,
            "used": bool(low > chance)}


def check_labellers(
    examples: Sequence[LabeledPair], judges: Sequence[Judge], self_verdicts: dict[str, tuple[int, float]], tau: float
) -> dict[str, Any]:
    """Measure every judge, and the model's confident verdicts, on labelled ``examples``.

    ``self_verdicts`` maps an example id to the model's (verdict, confidence) from BEFORE it
    trained on that label (an example without one is not counted for the model); only
    verdicts with confidence >= ``tau`` count, the ones CautiousDPO would self-label.
    Returns ``{"n_labelled", "labellers": [...], "used": [names]}`` (see :func:`labeller_accuracy`).
    """
    gold = [x.label for x in examples]
    rows = []
    for judge in judges:
        rows.append(labeller_accuracy(judge.name, gold, judge.votes(examples) if examples else []))
    own = [(x.label, self_verdicts[x.id][0]) for x in examples
           if x.id in self_verdicts and self_verdicts[x.id][1] >= tau]
    rows.append(labeller_accuracy(SELF_LABELLER, [g for g, _ in own], [v for _, v in own]))
    return {"n_labelled": len(examples), "chance": "majority share of the labels each labeller answered",
            "labellers": rows, "used": [r["labeller"] for r in rows if r["used"]]}
