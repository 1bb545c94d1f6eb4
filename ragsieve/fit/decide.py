"""Deciding by evidence (issue #70): which configuration ``fit`` chooses, how well it answers, and what ships.

Three rules, each a function over the answer rows of :class:`~ragsieve.fit.select.Selection` (one row per
configuration: its right/wrong, prompt tokens and LLM seconds per question):

* :func:`choose` — the most accurate configuration; with ``frugal`` or ``tokens=`` a cheaper one only when it
  is *shown* non-inferior to the most accurate at the margin δ (the 95 % interval of the paired accuracy
  difference clears −δ). "No measurable difference" on 29 questions is not "as good".
* :func:`cross_fit` — the choice made and estimated on the same held-out questions without the winner's
  optimism: the questions fall into K folds; each fold is answered by the configuration :func:`choose` picks
  on the other folds. The out-of-fold answers estimate what *choosing this way* gives on new questions.
* :func:`do_no_harm` — the guard: the choice ships when its cross-fitted answers are non-inferior to the best
  plain configuration's (chosen the same way) at δ; when that is not shown, the plain one ships unless the
  choice answers at or above it at the point estimate, and the decision is recorded as ``decided: false``.

Example::

    pool = dev + test                                  # every non-train question
    rows = selection.evaluate(grid, pool); plain = selection.evaluate(selection.plain([1, 2, 3, 5]), pool)
    fitted = cross_fit(rows, plain, closed_row, folds=5, objective="frugal", margin=0.02)
    guard = do_no_harm(fitted, margin=0.02)             # guard["shipped"]: "chosen" or "best_plain"
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from ragsieve.eval.stats import DEFAULT_MARGIN
from ragsieve.fit.config import token_budget

if TYPE_CHECKING:
    from ragsieve.fit.select import Choice


def raced_out(row: dict[str, Any]) -> bool:
    """The row's configuration was dropped by :meth:`Selection.race` (its estimates are on fewer questions)."""
    return row.get("raced_out_after") is not None


def outcome_row(choice: "Choice", correct: Sequence[int], tokens: Sequence[float], seconds: Sequence[float],
                name: Optional[str] = None) -> dict[str, Any]:
    """A configuration's row on some questions: accuracy with its Wilson 95 % interval, mean prompt tokens and
    LLM seconds, and the per-question outcomes (``correct``, ``tokens_each``, ``seconds_each``) that paired
    tests and cross-fitting read."""
    from ragsieve.eval.classification import accuracy_interval

    hits, n = int(sum(correct)), len(correct)
    return {**choice.to_dict(), "name": name or choice.name, "n": n, "correct_count": hits,
            "accuracy": hits / n if n else 0.0, "ci95": list(accuracy_interval(hits, n)) if n else [0.0, 1.0],
            "prompt_tokens": float(np.mean(tokens)) if n else 0.0,
            "llm_seconds": float(np.mean(seconds)) if n else 0.0, "correct": list(correct),
            "tokens_each": list(tokens), "seconds_each": list(seconds), "choice": choice}


def restrict(row: dict[str, Any], keep: np.ndarray) -> dict[str, Any]:
    """``row`` on the questions ``keep`` selects (a boolean mask or indices over the row's questions)."""
    pick = np.arange(len(row["correct"]))[keep]
    return {**outcome_row(row["choice"], [row["correct"][i] for i in pick], [row["tokens_each"][i] for i in pick],
                          [row["seconds_each"][i] for i in pick]),
            "name": row["name"]}


def _most_accurate(pool: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return min(pool, key=lambda r: (-r["correct_count"], round(r["prompt_tokens"], 6), r["choice"].simplicity))


def choose(rows: Sequence[dict[str, Any]], objective: str = "accuracy", *, margin: float = DEFAULT_MARGIN
           ) -> dict[str, Any]:
    """The most accurate row; ties go to fewer prompt tokens, then to the simpler configuration. Rows the race
    dropped cannot win (something no more expensive answered measurably better).

    ``frugal``: the row with the fewest mean prompt tokens among those shown non-inferior to the most accurate
    row on the same questions at ``margin`` (:func:`~ragsieve.eval.stats.non_inferior`); ties go to the more
    accurate, then the simpler. ``tokens=<budget>``: the most accurate row within the budget when it is shown
    non-inferior to the most accurate of all, else the most accurate of all. Closed book is a row like any
    other: cheap, but never "as good" by default.

    Example::

        choose(rows, "frugal", margin=0.02)["name"]   # e.g. "top1, embedded:base, prune best1"
    """
    from ragsieve.eval.stats import non_inferior

    budget = token_budget(objective)
    pool = [r for r in rows if not raced_out(r)] or list(rows)
    most = _most_accurate(pool)
    if objective == "accuracy":
        return most

    def as_good(row: dict[str, Any]) -> bool:
        if row is most:
            return True
        same_questions = len(row["correct"]) == len(most["correct"])
        return same_questions and non_inferior(row["correct"], most["correct"], margin).shown

    if budget is not None:
        within = [r for r in pool if r["prompt_tokens"] <= budget]
        best_within = _most_accurate(within) if within else None
        return best_within if best_within is not None and as_good(best_within) else most
    return min((r for r in pool if as_good(r)),
               key=lambda r: (round(r["prompt_tokens"], 6), -r["correct_count"], r["choice"].simplicity))


def fold_of(n: int, folds: int, seed: int = 0) -> np.ndarray:
    """Each of ``n`` questions' fold in ``0 .. folds-1``: balanced, shuffled by ``seed``."""
    return np.random.default_rng(seed).permutation(n) % max(1, min(folds, n))


def cross_fit(rows: Sequence[dict[str, Any]], plain_rows: Sequence[dict[str, Any]], closed_row: dict[str, Any],
              *, folds: int, objective: str, margin: float = DEFAULT_MARGIN, seed: int = 0) -> dict[str, Any]:
    """Out-of-fold answers of the choice and of the best plain configuration over the rows' questions.

    Every row of ``rows`` / ``plain_rows`` that answered all the questions (the race's survivors) takes part.
    In fold f, :func:`choose` (``objective``) picks among them on the other folds, and the pick's answers to
    fold f's questions are kept; the best plain configuration is picked the same way (``accuracy``). Returns
    rows ``chosen`` and ``best_plain`` (out-of-fold answers, named after the choice made on every question),
    ``closed_book``, ``chosen_all`` / ``best_plain_all`` (the choices on every question: what ships) and
    ``folds`` (per fold: its size and picks). With one question there is nothing to hold out: the rows are
    the in-sample ones and ``folds`` is empty.
    """
    n = len(closed_row["correct"])
    full = [r for r in rows if len(r["correct"]) == n and not raced_out(r)]
    plain = [r for r in plain_rows if len(r["correct"]) == n]
    chosen_all, plain_all = choose(full, objective, margin=margin), choose(plain)
    assignment = fold_of(n, folds, seed)
    k = int(assignment.max()) + 1 if n else 0
    if k < 2:
        return {"chosen": chosen_all, "best_plain": plain_all, "closed_book": closed_row, "chosen_all": chosen_all,
                "best_plain_all": plain_all, "folds": [], "k": k}
    picks = {"chosen": [None] * n, "best_plain": [None] * n}
    by_choice = {r["choice"]: r for r in full + plain}
    record = []
    for f in range(k):
        held = assignment == f
        fold_chosen = choose([restrict(r, ~held) for r in full], objective, margin=margin)
        fold_plain = choose([restrict(r, ~held) for r in plain])
        for key, pick in (("chosen", fold_chosen), ("best_plain", fold_plain)):
            for i in np.flatnonzero(held):
                picks[key][i] = by_choice[pick["choice"]]
        record.append({"n": int(held.sum()), "chosen": fold_chosen["name"], "best_plain": fold_plain["name"]})

    def out_of_fold(key: str, named: dict[str, Any]) -> dict[str, Any]:
        source = picks[key]
        return outcome_row(named["choice"], [source[i]["correct"][i] for i in range(n)],
                           [source[i]["tokens_each"][i] for i in range(n)],
                           [source[i]["seconds_each"][i] for i in range(n)], name=named["name"])

    return {"chosen": out_of_fold("chosen", chosen_all), "best_plain": out_of_fold("best_plain", plain_all),
            "closed_book": closed_row, "chosen_all": chosen_all, "best_plain_all": plain_all, "folds": record,
            "k": k}


def compare(a: Sequence[int], b: Sequence[int], *, alpha: float = 0.05, n_boot: int = 2000,
            seed: int = 0) -> dict[str, Any]:
    """A minus B on the same questions: exact McNemar and the accuracy difference with a paired-bootstrap
    95 % interval; ``measurably_worse`` when A loses with McNemar p < ``alpha``."""
    from ragsieve.eval.stats import mcnemar_exact, paired_bootstrap

    test = mcnemar_exact(a, b)
    diff = paired_bootstrap(np.asarray(a, float), np.asarray(b, float), n_boot=n_boot, seed=seed)
    return {"n": test.n, "a_correct": test.a_correct, "b_correct": test.b_correct, "a_only": test.a_only,
            "b_only": test.b_only, "p_value": test.p_value, "diff": diff.diff, "ci95": [diff.low, diff.high],
            "verdict": test.verdict, "measurably_worse": bool(test.p_value < alpha and test.diff < 0)}


def _ship(chosen: dict[str, Any], plain: dict[str, Any], margin_test: Any) -> tuple[str, bool, str]:
    """(shipped, decided, reason): the guard's rule, in one line with its numbers."""
    acc_c, acc_p = chosen["accuracy"], plain["accuracy"]
    versus = (f"{chosen['name']} vs the best plain configuration ({plain['name']}): {acc_c:.3f} vs {acc_p:.3f}, "
              f"{margin_test.diff:+.3f} [{margin_test.low:+.3f}, {margin_test.high:+.3f}] on "
              f"{margin_test.n} held-out questions")
    if chosen["choice"] == plain["choice"]:
        return "chosen", True, f"the configuration chosen is the best plain one ({plain['name']})"
    if margin_test.shown:
        return "chosen", True, f"{versus}: {margin_test.verdict}, so it ships"
    if acc_c >= acc_p:
        return "chosen", False, (f"{versus}: {margin_test.verdict}; it ships because it answers at or above the "
                                 "best plain configuration at the point estimate")
    return "best_plain", False, f"{versus}: {margin_test.verdict}, so fit ships the plain configuration"


def do_no_harm(held_out: dict[str, dict[str, Any]], *, margin: float = DEFAULT_MARGIN, alpha: float = 0.05,
               n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The guard on the held-out answers (``held_out``: rows ``chosen``, ``best_plain``, ``closed_book`` on the
    same questions, e.g. :func:`cross_fit`'s): the choice ships when it is shown non-inferior to the best plain
    configuration at ``margin``; otherwise the plain one ships, unless the choice answers at or above it at the
    point estimate. ``decided`` is False when non-inferiority was not shown; ``reason`` says why in one line
    (``note`` repeats it when undecided). McNemar comparisons with both baselines and the prompt-token change
    are reported beside it; the power of the comparison too (:func:`power`)."""
    from ragsieve.eval.stats import non_inferior, relative_mean_change

    chosen, plain = held_out["chosen"], held_out["best_plain"]
    vs_plain = compare(chosen["correct"], plain["correct"], alpha=alpha, n_boot=n_boot, seed=seed)
    vs_closed = compare(chosen["correct"], held_out["closed_book"]["correct"], alpha=alpha, n_boot=n_boot, seed=seed)
    margin_test = non_inferior(chosen["correct"], plain["correct"], margin)
    shipped, decided, reason = _ship(chosen, plain, margin_test)
    return {"n_test": vs_plain["n"], "shipped": shipped, "decided": decided, "reason": reason,
            "note": "" if decided else reason, "margin": margin,
            "non_inferiority_vs_best_plain": margin_test.to_dict(),
            "chosen_vs_best_plain": vs_plain, "chosen_vs_closed_book": vs_closed,
            "prompt_tokens_vs_best_plain": relative_mean_change(chosen["tokens_each"], plain["tokens_each"],
                                                                n_boot=n_boot, seed=seed),
            "power": power(vs_plain["a_only"] + vs_plain["b_only"], vs_plain["n"], margin, alpha=alpha),
            "alpha": alpha}


def power(discordant: int, n: int, margin: float, *, alpha: float = 0.05) -> dict[str, Any]:
    """What a paired comparison of ``n`` questions, ``discordant`` of them answered differently, can show: the
    smallest difference it detects (80 % power) and how many questions would bring that to ``margin``."""
    from ragsieve.eval.stats import detectable_difference, questions_needed

    detectable = detectable_difference(discordant, n, alpha=alpha)
    return {"n": n, "discordant": discordant, "detectable_difference": round(detectable, 4),
            "questions_for_margin": questions_needed(discordant, n, margin, alpha=alpha),
            "enough": bool(detectable <= margin)}
