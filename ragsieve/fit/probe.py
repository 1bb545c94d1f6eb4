"""Phase 4 of ``ragsieve fit``: the confidence probe, an MLP on the LLM's hidden states at one layer.

Reads the train and dev questions' closed-book and top-k prompts (their states from the state cache the
label phase filled) and the label phase's correctness; trains a head per candidate layer and writes the one
with the best dev AUROC to ``<out>/probe`` (skipped when ``probe_config.json`` is there: a resumed fit loads
it). The state gets ``probe`` (None for an endpoint, which has no hidden states).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from ragsieve.data.records import Question
from ragsieve.errors import RagsieveError

if TYPE_CHECKING:
    from ragsieve.fit.state import FitState
    from ragsieve.probe.model import ConfidenceProbe

log = logging.getLogger(__name__)


def fit_probe(state: "FitState") -> None:
    from ragsieve.probe.model import ConfidenceProbe

    probe_dir = state.out / "probe"
    state.probe = None
    if state.endpoint_only:
        log.warning("fit: %s is an endpoint (no hidden states): probe and gate skipped, the sieve always "
                    "retrieves and its reranker learns from answers", state.config.llm)
        return
    if not (probe_dir / "probe_config.json").is_file():
        _train_best_layer(state).save(probe_dir)
    state.probe = ConfidenceProbe.load(
        probe_dir, state.llm, batch_size=state.config.batch_size, cache=state.state_cache
    )


def _train_best_layer(state: "FitState") -> "ConfidenceProbe":
    """A head per candidate layer on train, the one with the best dev AUROC (ties: nearest the middle layer)."""
    from sklearn.metrics import roc_auc_score

    from ragsieve.probe.model import ConfidenceProbe, ProbeConfig
    from ragsieve.probe.train import train_probe_head

    layers = state.probe_layers()
    by_layer: dict[int, float] = {}
    heads = {}
    train_states, y_tr = probe_data(state, layers, "train")
    dev_states, y_dev = probe_data(state, layers, "dev")
    for i, layer in enumerate(layers):
        x_tr, x_dev = train_states[layer], dev_states[layer]
        if len(set(y_tr.tolist())) < 2 or len(set(y_dev.tolist())) < 2:
            raise RagsieveError(
                "the LLM answered every train or dev prompt the same way (all right or all wrong), so a "
                "probe cannot learn its knowledge boundary; give more (or more varied) questions"
            )
        result = train_probe_head(x_tr, y_tr, x_dev, y_dev, state.config.probe)
        heads[layer] = result.head
        by_layer[layer] = float(roc_auc_score(y_dev, result.head.predict_proba(x_dev)))
        state.progress("probe", i + 1, len(layers))
    best = max(by_layer, key=lambda layer: (by_layer[layer], -abs(layer - state.llm.num_layers / 2)))
    config = ProbeConfig(
        llm_spec=state.llm.spec, layer=best, num_layers=state.llm.num_layers, hidden_size=state.llm.hidden_size,
        probe_hidden=state.config.probe.hidden, dropout=state.config.probe.dropout,
        max_prompt_tokens=state.config.max_prompt_tokens, metrics={"dev_auroc_by_layer": by_layer},
    )
    return ConfidenceProbe(state.llm, heads[best], config)


def probe_data(state: "FitState", layers: list[int], split: str) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """States of every candidate layer (one early-exit forward per prompt) and correctness labels:
    the closed-book prompts, then the top-k prompts of the split's questions."""
    from ragsieve.probe.hidden import HiddenStateExtractor, extract_layers

    qs = state.splits[split]
    k = state.config.top_k
    prompts = [state.builder.chat_prompt(q.text) for q in qs]
    prompts += [state.builder.chat_prompt(q.text, state.candidates[q.id][:k]) for q in qs]
    extractor = HiddenStateExtractor(state.llm, layers[0], batch_size=state.config.batch_size,
                                     cache=state.state_cache)
    y = np.array([state.closed[q.id] for q in qs] + [state.plain[q.id] for q in qs], dtype=np.int64)
    from ragsieve.progress import reporting

    # one forward per prompt, minutes of them: the fit's progress shows them as the probe phase's
    with reporting(lambda _task, done, total: state.progress("probe", done, total)):
        return extract_layers(extractor, prompts, layers), y


def closed_book_confidence(state: "FitState", questions: list[Question]) -> np.ndarray:
    """The probe's Conf(Q) of each question, closed book."""
    return state.probe.score_batch([q.text for q in questions])
