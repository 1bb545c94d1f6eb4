"""``ragsieve fit``: the knowledge-boundary method end to end for one LLM, on your corpus and questions.

Phases (each writes its result under ``<out>/work`` or ``<out>`` and is skipped when
rerun, so a fit killed at any point resumes where it stopped). Each phase is a module of
:mod:`ragsieve.fit` (``questions``, ``label``, ``probe``, ``gate``, ``prefs``, ``align``, ``grade``,
``sentences``, ``select_phase``, ``evaluate``) working on the shared :class:`~ragsieve.fit.state.FitState`; this
module holds only their order:

1. **split** the QA file into train / dev / test by id;
2. **retrieve** the top ``candidates`` passages per question;
3. **label** closed-book and top-k answers (greedy, answer containment), every generation kept;
4. **probe**: hidden states at each candidate layer, an MLP per layer, the best on dev kept;
5. **gate**: β for the policy, chosen on dev (``parity`` must be shown at ``parity_confidence``:
   the upper bound of the accuracy lost by skipping stays within the tolerance);
6. **prefs**: Inc = Conf(Q+C) − Conf(Q) over the candidates; top-5 / bottom-5 per train question.
   An endpoint LLM (``openai:URL#model``, no local copy) has no hidden states: the probe and the
   gate are skipped, and a passage is preferred when the LLM answers right with it alone and
   wrong closed-book (negatives: the passages it answers wrong with);
7. **rerank**: the reranker fine-tuned on those preferences (InfoNCE) from the shipped base, kept
   only if it ranks the dev candidates that contain an answer no worse (MRR@10, paired bootstrap)
   than the reranker it started from (else the sieve keeps that one, and says so);
8. **sentences** (``sentences.enabled``, off by default): every sentence of each train question's top candidates
   labelled by what it does to the LLM's confidence (alone, and left out of the top context), and the shipped
   keep head trained on those labels into ``<out>/prune_head.safetensors`` (:mod:`ragsieve.fit.sentences`);
9. **grade**: the reranker's score threshold calibrated on dev (a passage that contains a gold
   answer counts as relevant);
10. **select** the configuration by the LLM's answers on dev (:mod:`ragsieve.fit.select`): k ∈ {0 (closed
   book), 1, 2, 3, 5} × order (retriever / the start reranker / the aligned one if kept) × grade (off /
   thresholds) × passage placement × gate β; most accurate wins, ties go to fewer prompt tokens
   (``select.objective: tokens=<budget>`` trades accuracy for context). Do no harm: on test the
   choice is compared with closed book and with the best plain configuration (chosen on dev), by
   exact McNemar and a paired-bootstrap interval; if it is measurably worse, the plain one ships;
11. **evaluate**: ``sieve.json`` with the whole grid, the frontier (accuracy against prompt tokens and
   LLM seconds; also plotted to ``frontier.png``), the choice, the test comparison with Wilson
   intervals, and the probe's AUROC with a bootstrap interval.

Example::

    from ragsieve.fit import FitConfig, fit_sieve
    fit_sieve(FitConfig(index="index/mine", questions="qa.jsonl", out="sieves/mine"))
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Optional

from ragsieve.fit.align import align_reranker
from ragsieve.fit.config import FitConfig
from ragsieve.fit.evaluate import write_sieve
from ragsieve.fit.gate import choose_beta
from ragsieve.fit.grade import calibrate_grade, save_grader
from ragsieve.fit.label import label_answers
from ragsieve.fit.prefs import measure_preferences
from ragsieve.fit.probe import fit_probe
from ragsieve.fit.questions import check_fit_questions, fit_splits, retrieve_candidates, split_train_dev_test
from ragsieve.fit.select_phase import select_configuration
from ragsieve.fit.sentences import label_sentences
from ragsieve.fit.state import FitState, Progress
from ragsieve.pipeline.sieve_config import SieveConfig

if TYPE_CHECKING:
    from ragsieve.fit.select import Choice

log = logging.getLogger(__name__)

#: the phases in order, each a module's function over the shared state (progress reports use these names): a
#: new phase is one entry here and the fields it leaves on :class:`~ragsieve.fit.state.FitState`
PHASES: dict[str, Callable[[FitState], None]] = {
    "split": split_train_dev_test, "retrieve": retrieve_candidates, "label": label_answers, "probe": fit_probe,
    "gate": choose_beta, "prefs": measure_preferences, "rerank": align_reranker, "sentences": label_sentences,
    "grade": calibrate_grade, "select": select_configuration, "evaluate": write_sieve,
}


class Fit(FitState):
    """One fit run: the phases in order over the shared state (:class:`~ragsieve.fit.state.FitState`).

    Resuming is each phase's own: it skips what its outputs under ``config.work`` / ``config.out`` (or the
    records) already hold. :meth:`run_phase` runs one phase, for callers that run a few (``bench/fit.py``)."""

    def run(self) -> SieveConfig:
        self.load()
        for phase in PHASES:
            self.on_phase(phase)
            self.run_phase(phase)
            log.info("fit: %s done in %.1fs", phase, self.timings[phase])
        return self.sieve

    def run_phase(self, name: str) -> None:
        """Phase ``name`` (a key of :data:`PHASES`), its seconds kept in ``timings``."""
        start = time.perf_counter()
        PHASES[name](self)
        self.timings[name] = round(time.perf_counter() - start, 2)

    def _save_grader(self, choice: "Choice", how: str = "dev answer accuracy") -> Optional[str]:
        """:func:`~ragsieve.fit.grade.save_grader` (``bench/fit.py --regrade`` calls it on a Fit)."""
        return save_grader(self, choice, how)


def fit_sieve(config: FitConfig, progress: Optional[Progress] = None,
              on_phase: Optional[Callable[[str], None]] = None) -> SieveConfig:
    """Run every phase (resuming from ``<out>/work``) and return the written ``sieve.json``; ``progress`` gets
    each phase's (done, total) reports, ``on_phase`` each phase's name as it begins."""
    check_fit_questions(config)
    return Fit(config, progress, on_phase).run()


# imported from here before the phases had modules of their own (the CLI, bench/fit.py)
__all__ = ["PHASES", "Fit", "Progress", "check_fit_questions", "fit_sieve", "fit_splits"]
