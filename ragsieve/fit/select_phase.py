"""Phase 9 of ``ragsieve fit``: the configuration chosen by the LLM's answers on dev, checked on test.

Reads the candidates, the rankings of the retriever, the start reranker and the aligned one (if kept), the
probe's Conf(Q), β and the grade thresholds; asks the LLM through the answer cache (``<work>/answers.sqlite``,
so a resumed fit asks nothing twice). The grid, the race and the do-no-harm test are
:mod:`ragsieve.fit.select`'s. Writes nothing itself: the state gets the shipped choice (``shipped``,
``shipped_key``), ``do_no_harm``, the dev rows (``selection_rows``, ``selection_marks``), the test rows
(``test_rows``), the summary (``selection``) and ``confidence`` (question id → Conf(Q)).
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING

from ragsieve.fit.config import gate_budget
from ragsieve.fit.probe import closed_book_confidence

if TYPE_CHECKING:
    from ragsieve.fit.select import Selection
    from ragsieve.fit.state import FitState

log = logging.getLogger(__name__)


def select_configuration(state: "FitState") -> None:
    """The configuration chosen by the LLM's answers on dev, checked on test against closed book and
    the best plain configuration (see :mod:`ragsieve.fit.select`)."""
    from ragsieve.fit.select import Choice, choose, do_no_harm

    c = state.config.select
    dev, test = state.splits["dev"], state.splits["test"]
    selection, sources = _ranked_selection(state)
    # the user's gate policy bounds the grid: none = no gate, a budget = every retrieval behind its β
    gates = "off" if state.config.gate == "none" else "policy" if gate_budget(state.config.gate) else "choose"
    grid = selection.grid(sources, dev, state.f1_thresholds, state.beta, gates)
    if not state.config.grade:
        grid = [g for g in grid if g.threshold is None]
    start = state.answers.stats()
    # raced: a configuration measurably beaten by one no more expensive stops being answered; the plain
    # ones stay to the end (the do-no-harm baseline is chosen among them on every dev question)
    rows, race = selection.race(grid, dev, protect=selection.plain(c.plain_ks))
    refined = selection.placement_variants(rows)  # other placements, around the best surviving rows only
    rows += selection.evaluate(refined, dev)
    plain_rows = selection.evaluate(selection.plain(c.plain_ks), dev)
    used = {k: v - start[k] for k, v in state.answers.stats().items()}
    chosen, best_plain = choose(rows, c.objective, alpha=c.alpha), choose(plain_rows)
    closed_row = selection.evaluate([Choice(0)], dev)[0]
    asked_on_dev = len(selection.asked)  # the test questions are asked below
    on_test = dict(zip(("chosen", "best_plain", "closed_book"), selection.evaluate(
        [chosen["choice"], best_plain["choice"], Choice(0)], test)))
    state.do_no_harm = do_no_harm(on_test, alpha=c.alpha, n_boot=c.n_boot, seed=state.config.seed)
    shipped, note = state.do_no_harm["shipped"], state.do_no_harm["note"]
    if note:
        log.warning("fit: %s", note)
    state.shipped_key = shipped
    state.shipped = on_test[shipped]["choice"]
    state.confidence = selection.confidence
    state.selection_rows, state.selection_marks = rows, {"chosen": chosen, "best plain": best_plain,
                                                         "closed book": closed_row}
    state.test_rows = on_test
    state.selection = {
        "objective": c.objective, "n_dev": len(dev), "n_configurations": len(rows),
        # an endpoint's tokenizer is not at hand: its prompt tokens are estimated (PromptBuilder)
        "prompt_tokens_from": "characters / 4" if state.endpoint_only else "the LLM's tokenizer",
        "chosen": chosen["name"], "best_plain": best_plain["name"], "shipped": on_test[shipped]["name"],
        "note": note,
        "dev": {name: _row_summary(row) for name, row in (("chosen", chosen), ("best_plain", best_plain),
                                                          ("closed_book", closed_row))},
        "answer_cache": used, "race": race,
        # the prompts the grid, the refinement and the plain rows put to the LLM (or found in the cache)
        "unique_prompts_per_dev_question": round(asked_on_dev / max(len(dev), 1), 2),
    }
    state.progress("select", 1, 1)


def _ranked_selection(state: "FitState") -> tuple["Selection", list[str]]:
    """The selection over dev and test with every order's rankings (and Conf(Q) when there is a probe), and
    the orders: the retriever, the start reranker and the aligned one if the guard kept it."""
    from ragsieve.fit.select import RETRIEVER, Selection

    dev, test = state.splits["dev"], state.splits["test"]
    selection = Selection(state.builder, state.answers, state.candidates, state.config.select,
                          progress=lambda done, total: state.progress("select", done, total),
                          pruner=_sentence_pruner(state), sentence_store=_sentence_store(state))
    sources = [RETRIEVER, state.config.align.init] + (["reranker"] if state.reranker_spec == "reranker" else [])
    selection.add_ranking(RETRIEVER, dev + test)
    state.rankings.rank_all(sources[1:], dev + test, "select")
    for name in sources[1:]:
        selection.rankings[name] = {q.id: state.rankings.ranked(name, q) for q in dev + test}
    if state.probe is not None:
        selection.confidence = dict(zip([q.id for q in dev + test],
                                        closed_book_confidence(state, dev + test).tolist()))
    return selection, sources


def _sentence_pruner(state: "FitState"):
    """The pruner the grid's prune configurations score sentences with: the reranker alignment started from
    (zero-shot, ``title: sentence``); None when the grid prunes nothing."""
    if not (state.config.select.prune_quantiles or state.config.select.prune_max_sentences):
        return None
    from ragsieve.prune import SentencePruner

    return SentencePruner(state.rankings.ranker(state.config.align.init))


def _sentence_store(state: "FitState"):
    """Sentence scores kept across runs beside the candidate scores, keyed by the pruning scorer's weights."""
    from ragsieve.data.score_records import PairScores
    from ragsieve.registry import reranker_scores_key

    key = reranker_scores_key(state.ranker_base(state.config.align.init))
    if key is None or _sentence_pruner(state) is None:
        return None
    return PairScores(state.scores_root() / ("sentences-" + hashlib.sha1(key.encode()).hexdigest()[:16]),
                      "sentences", {"scoring_key": key, "unit": "title: sentence"})


def _row_summary(row: dict) -> dict:
    summary = {k: row[k] for k in ("name", "accuracy", "ci95", "n", "prompt_tokens", "llm_seconds")}
    return {**summary, "k": row["choice"].k}  # the demo re-runs the best plain configuration by its k
