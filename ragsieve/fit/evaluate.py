"""Phase 10 of ``ragsieve fit``: ``<out>/sieve.json``, the shipped configuration and every number behind it.

Reads the selection's shipped choice, its dev grid and test rows, the probe (its test AUROC is measured
here), the gate's and the alignment guard's results and the phases' timings. Writes ``<out>/grader`` (the
shipped configuration's, if graded), ``<out>/frontier.png`` and ``<out>/sieve.json``; the state gets
``sieve``. It always runs (nothing is skipped): its inputs are all on the state or cached.
"""

from __future__ import annotations

import platform
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

from ragsieve.fit.grade import save_grader
from ragsieve.fit.probe import probe_data
from ragsieve.pipeline.sieve_config import SieveConfig

if TYPE_CHECKING:
    from ragsieve.fit.state import FitState


def _sentence_label_metrics(state: "FitState") -> dict:
    """What the sentences phase measured (ragsieve.fit.sentences) and the head it trained, if any."""
    from ragsieve.fit.sentences import measured_by
    from ragsieve.prune.training import KEEP_LABEL

    examples = [e for group in state.sentence_labels.values() for e in group]
    report = state.fitted_head_report
    return {"from": measured_by(state), "questions": len(state.sentence_labels),
            "sentences": sum(len(e.labels) for e in examples),
            "to_keep": sum(y >= KEEP_LABEL for e in examples for y in e.labels),
            "head": state.fitted_head.name if state.fitted_head else None, "guard": state.head_guard,
            "head_training": {k: report[k] for k in ("chosen_epoch", "dev_map", "epochs") if k in report}}


def write_sieve(state: "FitState") -> None:
    from ragsieve.fit.select import plot_frontier
    from ragsieve.pipeline.sieve import Sieve

    sieve = _shipped_sieve(state)
    test = state.splits["test"]
    metrics = _test_metrics(state)
    if state.probe is not None:
        metrics["probe_test_auroc"] = _probe_test_auroc(state)
        metrics["probe_dev_auroc_by_layer"] = state.probe.config.metrics.get("dev_auroc_by_layer", {})
    else:
        metrics["skipped"] = f"{state.config.llm} is an endpoint (no hidden states): no probe, no gate"
    metrics["gate_dev"] = state.gate_dev
    # the relevance guard's verdict on the aligned reranker (None: guard off or nothing aligned)
    metrics["alignment_check"] = state.align_check
    metrics["alignment_guards"] = {
        **state.config.align.train.model_dump(
            include={"distill_weight", "replay_ratio", "lora_r", "eval_steps", "cosine_mix"}),
        **state.config.align.model_dump(include={"guard", "max_mrr_drop"})}
    if state.config.sentences.enabled:
        metrics["sentence_labels"] = _sentence_label_metrics(state)
    metrics["seconds_by_phase"] = state.timings
    plot = plot_frontier(state.selection_rows, state.out / "frontier.png", state.selection_marks)
    metrics["selection"]["plot"] = plot.name
    state.sieve = sieve.model_copy(update={
        "metrics": metrics, "versions": _versions(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })
    Sieve(state.sieve).save(state.out)
    state.progress("evaluate", len(test), len(test))


def _is_gated(state: "FitState") -> bool:
    """Whether the shipped configuration retrieves only behind the gate's β."""
    return state.shipped.beta is not None and state.shipped.k > 0


def _shipped_sieve(state: "FitState") -> SieveConfig:
    """The shipped choice as a sieve config (no metrics yet); writes its grader folder."""
    from ragsieve.fit.select import RETRIEVER

    shipped, align_init = state.shipped, state.config.align.init
    gated = _is_gated(state)
    policy = (state.config.gate if shipped.gate == "policy" else f"dev accuracy ({shipped.gate})") if gated else ""
    return SieveConfig(
        llm=state.config.llm, probe="probe" if state.probe is not None else None,
        layer=state.probe.config.layer if state.probe is not None else None, beta=shipped.beta if gated else None,
        policy=policy,
        reranker=None if shipped.order == RETRIEVER or shipped.k == 0 else shipped.order,
        grader=save_grader(state, shipped), top_k=shipped.k, passage_order=shipped.placement,
        prune_threshold=shipped.prune_threshold if shipped.k > 0 else None,
        prune_max_sentences=shipped.prune_max if shipped.k > 0 else None,
        prune_scope=shipped.prune_scope if shipped.k > 0 else "passage",
        prune_token_cap=shipped.prune_token_cap if shipped.k > 0 else None,
        pruner=_shipped_pruner(shipped, align_init),
        candidates=state.config.candidates, max_prompt_tokens=state.config.max_prompt_tokens,
        max_new_tokens=state.config.max_new_tokens,
    )


def _shipped_pruner(shipped, align_init: str) -> str | None:
    """The sentence scorer the shipped configuration pruned with, unless it is the sieve's reranker already: a
    keep head by its spec, zero-shot as the reranker alignment started from."""
    from ragsieve.fit.select import ZERO_SHOT

    if shipped.prune == "off" or shipped.k == 0:
        return None
    if shipped.prune_scorer != ZERO_SHOT:
        return shipped.prune_scorer
    return align_init if shipped.order != align_init else None


def _accuracy(correct) -> dict:
    from ragsieve.eval.classification import accuracy_interval

    x = np.asarray(correct)
    lo, hi = accuracy_interval(int(x.sum()), len(x))
    return {"accuracy": float(x.mean()), "ci95": [lo, hi], "n": len(x)}


def _test_metrics(state: "FitState") -> dict[str, Any]:
    """Held-out accuracy (Wilson intervals) of closed book, plain top-k, the best plain configuration and the
    sieve, each on every dev and test question out of fold (cross-fitted: a fold is answered by the choice made
    on the other folds); the retrieval rate, the do-no-harm guard, the grid and the preference groups."""
    from ragsieve.fit.select import public_rows

    held_out, shipped, shipped_key = state.splits["dev"] + state.splits["test"], state.shipped, state.shipped_key
    gated = _is_gated(state)

    def on_held_out(key: str) -> dict:  # an out-of-fold row: accuracy and its mean prompt tokens
        row = state.test_rows[key]
        return {**_accuracy(row["correct"]), "prompt_tokens": float(np.mean(row["tokens_each"]))}

    plain_k = np.array([state.plain[q.id] for q in held_out])
    folds = state.selection.get("cross_fitted", {}).get("k", 0)
    return {
        "n_questions": {k: len(v) for k, v in state.splits.items()},
        # "test": the held-out estimates (the key sieve.json has always had)
        "test": {"closed_book": on_held_out("closed_book"), f"plain_top{state.config.top_k}": _accuracy(plain_k),
                 "best_plain": on_held_out("best_plain"), "sieve": on_held_out(shipped_key)},
        "estimated_on": f"dev + test ({len(held_out)} questions), cross-fitted over {folds} folds" if folds > 1
        else f"dev + test ({len(held_out)} questions), in sample",
        "configurations": {"best_plain": state.test_rows["best_plain"]["name"],
                           "sieve": state.test_rows[shipped_key]["name"]},
        "retrieval_rate": float(np.mean([shipped.k > 0 and (not gated or state.confidence[q.id] <= shipped.beta)
                                         for q in held_out])),
        "margin": state.config.select.margin, "decided": state.do_no_harm["decided"],
        "power_before_fit": getattr(state, "power_before", None),
        "do_no_harm": state.do_no_harm,
        "selection": {**state.selection, "grid": public_rows(state.selection_rows)},
        "preference_groups": {k: len(v) for k, v in state.prefs.items()},
        "preferences_from": "answers" if state.probe is None else "confidence shifts",
    }


def _probe_test_auroc(state: "FitState") -> dict | None:
    """The probe's AUROC on the test prompts with a bootstrap interval; None when test has one class only."""
    from sklearn.metrics import roc_auc_score

    from ragsieve.eval.stats import bootstrap_metric

    test = state.splits["test"]
    try:
        layer = state.probe.config.layer
        states, y = probe_data(state, [layer], "test")
        # two states per question (closed book, top-k): the interval resamples whole questions
        questions = [q.id for q in test] * 2
        est, lo, hi = bootstrap_metric(roc_auc_score, y, state.probe.head.predict_proba(states[layer]),
                                       groups=questions)
        return {"auroc": est, "ci95": [lo, hi], "n": len(y), "n_questions": len(test)}
    except ValueError:
        return None  # one class only in the test split


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("ragsieve", "torch", "transformers", "sentence-transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out
