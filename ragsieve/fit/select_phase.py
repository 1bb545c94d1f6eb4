"""Phase 9 of ``ragsieve fit``: the configuration chosen by the LLM's answers, cross-fitted over dev + test.

Reads the candidates, the rankings of the retriever, the start reranker and the aligned one (if kept), the
probe's Conf(Q), β and the grade thresholds; asks the LLM through the answer cache (``<work>/answers.sqlite``,
so a resumed fit asks nothing twice). The grid and the race are :mod:`ragsieve.fit.select`'s; the choice,
the cross-fitting and the do-no-harm guard :mod:`ragsieve.fit.decide`'s. The grid's thresholds (grade, gate,
prune quantiles) come from dev; the grid is raced and answered on dev + test, so a 150-question fit decides
from its 60 held-out questions, not 30. Writes nothing itself: the state gets the shipped choice
(``shipped``, ``shipped_key``), ``do_no_harm``, the grid's rows (``selection_rows``, ``selection_marks``), the
out-of-fold rows (``test_rows``), the summary (``selection``) and ``confidence`` (question id → Conf(Q)).
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING

from ragsieve.errors import RagsieveError
from ragsieve.fit.config import gate_budget
from ragsieve.fit.probe import closed_book_confidence

if TYPE_CHECKING:
    from ragsieve.fit.select import Selection
    from ragsieve.fit.state import FitState

log = logging.getLogger(__name__)


def select_configuration(state: "FitState") -> None:
    """The configuration chosen by the LLM's answers on every non-train question, cross-fitted (see
    :mod:`ragsieve.fit.decide`), and shipped only where the evidence supports it."""
    from ragsieve.fit.decide import choose, cross_fit, do_no_harm
    from ragsieve.fit.select import Choice

    c = state.config.select
    pool = state.splits["dev"] + state.splits["test"]  # chosen and estimated by cross-fitting over both
    selection, sources = _ranked_selection(state)
    # the user's gate policy bounds the grid: none = no gate, a budget = every retrieval behind its β
    gates = "off" if state.config.gate == "none" else "policy" if gate_budget(state.config.gate) else "choose"
    grid = selection.grid(sources, state.splits["dev"], state.f1_thresholds, state.beta, gates)
    if not state.config.grade:
        grid = [g for g in grid if g.threshold is None]
    start = state.answers.stats()
    # raced: a configuration measurably beaten by one no more expensive stops being answered; the plain
    # ones stay to the end (the do-no-harm baseline is chosen among them on every question)
    plain = selection.plain(c.plain_ks, state.beta if gates == "policy" else None)
    rows, race = selection.race(grid, pool, protect=plain)
    refined = selection.placement_variants(rows)  # other placements, around the best surviving rows only
    rows += selection.evaluate(refined, pool)
    plain_rows = selection.evaluate(plain, pool)
    closed_row = selection.evaluate([Choice(0)], pool)[0]
    used = {k: v - start[k] for k, v in state.answers.stats().items()}
    fitted = cross_fit(rows, plain_rows, closed_row, folds=c.folds, objective=c.objective, margin=c.margin,
                       seed=state.config.seed)
    chosen, best_plain = fitted["chosen_all"], fitted["best_plain_all"]
    held_out = {key: fitted[key] for key in ("chosen", "best_plain", "closed_book")}
    state.do_no_harm = do_no_harm(held_out, margin=c.margin, alpha=c.alpha, n_boot=c.n_boot, seed=state.config.seed)
    (log.info if state.do_no_harm["decided"] else log.warning)("fit: %s", state.do_no_harm["reason"])
    state.shipped_key = state.do_no_harm["shipped"]
    state.shipped = (chosen if state.shipped_key == "chosen" else best_plain)["choice"]
    state.confidence = selection.confidence
    state.selection_rows, state.selection_marks = rows, {"chosen": chosen, "best plain": best_plain,
                                                         "closed book": closed_row}
    state.test_rows = held_out
    vs_most = _against_most_accurate(rows, chosen, c.margin)
    state.selection = _summary(state, selection, fitted, race, used, vs_most=vs_most)
    state.progress("select", 1, 1)


def _against_most_accurate(rows: list[dict], chosen: dict, margin: float) -> dict:
    """The choice against the most accurate configuration on the same questions, at the margin: what a frugal
    or token-budget choice gave up (nothing to say when the choice is the most accurate)."""
    from ragsieve.eval.stats import non_inferior
    from ragsieve.fit.decide import choose

    most = choose(rows)
    if most["choice"] == chosen["choice"]:
        return {"most_accurate": most["name"], "is_most_accurate": True}
    test = non_inferior(chosen["correct"], most["correct"], margin)
    return {"most_accurate": most["name"], "is_most_accurate": False, **test.to_dict()}


def _summary(state: "FitState", selection: "Selection", fitted: dict, race: dict, used: dict, vs_most: dict) -> dict:
    """``sieve.json``'s ``selection``: what was chosen on which questions, how it was estimated, and why it
    shipped."""
    c = state.config.select
    pool = state.splits["dev"] + state.splits["test"]
    chosen, best_plain, closed_row = fitted["chosen_all"], fitted["best_plain_all"], fitted["closed_book"]
    guard = state.do_no_harm
    return {
        "objective": c.objective, "margin": c.margin, "n_dev": len(state.splits["dev"]),
        "n_test": len(state.splits["test"]), "n_held_out": len(pool), "n_configurations": len(state.selection_rows),
        # an endpoint's tokenizer is not at hand: its prompt tokens are estimated (PromptBuilder)
        "prompt_tokens_from": "characters / 4" if state.endpoint_only else "the LLM's tokenizer",
        "chosen": chosen["name"], "best_plain": best_plain["name"],
        "shipped": state.shipped.name,
        "decided": guard["decided"], "reason": guard["reason"], "note": guard["note"],
        "vs_most_accurate": vs_most,
        # chosen on every held-out question (in-sample: optimistic for the winner) ...
        "in_sample": {name: _row_summary(row) for name, row in (("chosen", chosen), ("best_plain", best_plain),
                                                                ("closed_book", closed_row))},
        # ... and estimated out of fold: each fold answered by the choice made on the other folds
        "cross_fitted": {"k": fitted["k"], "folds": fitted["folds"],
                         "chosen": _row_summary(fitted["chosen"]), "best_plain": _row_summary(fitted["best_plain"])},
        "power": guard["power"], "answer_cache": used, "race": race,
        # the prompts the grid, the refinement and the plain rows put to the LLM (or found in the cache)
        "unique_prompts_per_held_out_question": round(len(selection.asked) / max(len(pool), 1), 2),
    }


def _ranked_selection(state: "FitState") -> tuple["Selection", list[str]]:
    """The selection over dev and test with every order's rankings (and Conf(Q) when there is a probe), and
    the orders: the retriever, the start reranker and the aligned one if the guard kept it."""
    from ragsieve.fit.select import RETRIEVER, Selection

    dev, test = state.splits["dev"], state.splits["test"]
    selection = Selection(state.builder, state.answers, state.candidates, state.config.select,
                          progress=lambda done, total: state.progress("select", done, total),
                          scorers=_sentence_scorers(state))
    sources = [RETRIEVER, state.config.align.init] + (["reranker"] if state.reranker_spec == "reranker" else [])
    selection.add_ranking(RETRIEVER, dev + test)
    state.rankings.rank_all(sources[1:], dev + test, "select")
    for name in sources[1:]:
        selection.rankings[name] = {q.id: state.rankings.ranked(name, q) for q in dev + test}
    if state.probe is not None:
        selection.confidence = dict(zip([q.id for q in dev + test],
                                        closed_book_confidence(state, dev + test).tolist()))
    return selection, sources


def _sentence_scorers(state: "FitState") -> dict:
    """The sentence scorers the grid's prune configurations try, by name: zero-shot (the reranker alignment
    started from, ``title: sentence``) and each of ``select.prune_scorers`` that loads (a keep head is refused
    for other cross-encoder weights than its own: then it is left out, and said); each with the store its
    scores outlive the run in, keyed by its weights. None of them when the grid prunes nothing."""
    c = state.config.select
    if not (c.prune_quantiles or c.prune_max_sentences or c.prune_across_sentences or c.prune_token_caps):
        return {}
    from ragsieve.fit.select import ZERO_SHOT
    from ragsieve.prune import SentencePruner
    from ragsieve.registry import load_reranker

    start = state.config.align.init
    zero_shot = SentencePruner(state.rankings.ranker(start))
    scorers = {ZERO_SHOT: (zero_shot, _sentence_store(state, state.ranker_base(start)))}
    for spec in c.prune_scorers:
        try:
            scorers[spec] = (SentencePruner(load_reranker(spec)), _sentence_store(state, spec))
        except RagsieveError as why:
            log.warning("fit: sentence scorer %s left out of the grid: %s", spec, why)
    fitted = getattr(state, "fitted_head", None)
    if fitted is not None:  # the keep head the sentences phase trained on this LLM's labels, named as sieve.json will
        scorers[fitted.name] = (SentencePruner(load_reranker(str(fitted))), _sentence_store(state, str(fitted)))
    return scorers


def _sentence_store(state: "FitState", scorer_spec: str):
    """Sentence scores kept across runs beside the candidate scores, keyed by the scorer's weights."""
    from ragsieve.data.score_records import PairScores
    from ragsieve.registry import reranker_scores_key

    key = reranker_scores_key(scorer_spec)
    if key is None:
        return None
    return PairScores(state.scores_root() / ("sentences-" + hashlib.sha1(key.encode()).hexdigest()[:16]),
                      "sentences", {"scoring_key": key, "unit": "title: sentence"})


def _row_summary(row: dict) -> dict:
    summary = {k: row[k] for k in ("name", "accuracy", "ci95", "n", "prompt_tokens", "llm_seconds")}
    return {**summary, "k": row["choice"].k}  # the demo re-runs the best plain configuration by its k
