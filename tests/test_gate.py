from __future__ import annotations

import numpy as np
import pytest

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.gate import CBDRGate, gate_accuracy, skip_at_parity, sweep_cbdr
from ragsieve.pipeline import RAGPipeline


class _FixedProbe:
    """Conf(Q) from a lookup table: the gate logic is what is under test."""

    def __init__(self, table):
        self.table = table

    def score_batch(self, questions, contexts=None):
        return np.array([self.table[q] for q in questions])


def test_gate_decides_by_beta():
    gate = CBDRGate(_FixedProbe({"a": 0.2, "b": 0.95, "c": 0.9}), beta=0.9)
    assert [d.retrieve for d in gate.decide_many(["a", "b", "c"])] == [True, False, True]  # ties retrieve
    with pytest.raises(RagsieveError):
        CBDRGate(_FixedProbe({}), beta=1.5)


def test_sweep_and_parity_hand_example():
    conf = np.array([0.1, 0.6, 0.8, 0.99])
    closed = np.array([0, 0, 1, 1])
    rag = np.array([1, 0, 1, 1])
    # β=0.5: q2,q3,q4 skip → correct = [1, 0, 1, 1]; RR = 1/4
    assert gate_accuracy(conf, closed, rag, 0.5) == (0.75, 0.25)
    # β=0: everyone with conf > 0 skips → closed-book accuracy
    assert gate_accuracy(conf, closed, rag, 0.0) == (0.5, 0.0)
    rows = sweep_cbdr(conf, closed, {1: rag, 3: rag}, [0.0, 1.0])
    assert rows[0] == {"beta": 0.0, "top_k": 1, "rr": 0.0, "accuracy": 0.5}
    assert rows[1] == {"beta": 1.0, "top_k": 1, "rr": 1.0, "accuracy": 0.75}
    best = skip_at_parity(conf, closed, rag, [0.0, 0.5, 1.0])
    assert best["skip"] == 0.75 and best["beta"] == 0.5 and best["accuracy"] == 0.75
    fine = skip_at_parity(conf, closed, rag)
    assert fine["skip"] == 0.75


def test_pipeline_with_gate_retrieves_only_unconfident(tiny_llm):
    from ragsieve.retrieve import BM25Retriever

    pool = [Passage("p0", "Hamlet was written by William Shakespeare."), Passage("p1", "Paris is in France.")]
    gate = CBDRGate(_FixedProbe({"Who wrote Hamlet?": 0.2, "Where is Paris?": 0.99}), beta=0.9)
    pipe = RAGPipeline(tiny_llm, BM25Retriever.build(pool), top_k=1, max_new_tokens=2, gate=gate)
    low, high = pipe.answer_many(["Who wrote Hamlet?", "Where is Paris?"])
    assert low.retrieved and [p.id for p in low.contexts] == ["p0"] and low.confidence == pytest.approx(0.2)
    assert not high.retrieved and high.contexts == [] and high.confidence == pytest.approx(0.99)


def test_parity_with_a_confidence_level_must_be_shown_not_just_observed():
    """On 61 dev questions a skip that loses nothing observed is still not parity at 95 %; on 2,000
    questions where the confident third is answered closed-book as well, it is."""
    rng = np.random.default_rng(0)
    conf = rng.random(61)
    closed = np.zeros(61, dtype=int)
    rag = (np.arange(61) < 8).astype(int)  # retrieval answers 8 of them, closed-book none
    observed = skip_at_parity(conf, closed, rag)
    shown = skip_at_parity(conf, closed, rag, confidence_level=0.95)
    assert observed["skip"] > 0 and shown == {**shown, "skip": 0.0, "beta": 1.0}
    n = 2000
    conf = rng.random(n)
    closed = (conf > 0.7).astype(int)
    rag = np.where(conf > 0.7, 1, (rng.random(n) < 0.3).astype(int))
    big = skip_at_parity(conf, closed, rag, confidence_level=0.95)
    assert 0.25 < big["skip"] < 0.35 and big["loss_upper"] <= 0.005


def test_random_and_oracle_gates_on_hand_made_outcomes():
    from itertools import combinations

    from ragsieve.eval.classification import accuracy_interval
    from ragsieve.gate import gate_table, oracle_gate, random_gate, skip_at_parity_interval

    closed = np.array([1, 0, 0, 0, 0, 1])
    rag = np.array([1, 1, 1, 0, 0, 0])  # retrieving gains on q2, q3 and loses q6
    # Retrieving for 3 random questions of 6: every subset is equally likely, so the expected
    # accuracy is the mean over all 20 subsets, and the best subset ({q2, q3, +one neutral}) has 3 of 20.
    exact = np.mean([np.where(np.isin(np.arange(6), s), rag, closed).mean() for s in combinations(range(6), 3)])
    r = random_gate(closed, rag, 0.5, observed_accuracy=4 / 6, n_draws=4000, seed=1)
    assert r["retrieve"] == 3 and r["rr"] == 0.5 and r["expected_accuracy"] == pytest.approx(exact) == 2.5 / 6
    assert 1 / 6 <= r["low"] <= r["expected_accuracy"] <= r["high"] <= 4 / 6
    assert 0.12 < r["p_value"] < 0.18  # P(a random gate is as good as the best) = 3/20
    never, always = random_gate(closed, rag, 0.0), random_gate(closed, rag, 1.0)
    assert never["expected_accuracy"] == never["low"] == never["high"] == closed.mean()
    assert always["expected_accuracy"] == always["low"] == always["high"] == rag.mean()

    oracle = oracle_gate(closed, rag)  # retrieve for the 4 closed-book misses: q1, q2, q3, q6 right
    assert oracle["rr"] == pytest.approx(4 / 6) and oracle["accuracy"] == pytest.approx(4 / 6)
    assert oracle["ci95"] == pytest.approx(list(accuracy_interval(4, 6)))

    conf = np.array([0.9, 0.1, 0.2, 0.8, 0.7, 0.3])
    rows = gate_table(conf, closed, {1: rag}, [0.0, 0.5, 1.0], n_draws=500)
    mid = next(x for x in rows if x["beta"] == 0.5)  # retrieves q2, q3, q6: 3 of 6 right
    assert (mid["n"], mid["rr"], mid["correct"]) == (6, 0.5, 3)
    assert mid["ci95"] == pytest.approx(list(accuracy_interval(3, 6))) and mid["random"]["rr"] == 0.5
    assert mid["vs_always_retrieve"]["gate_only"] == 0 and mid["vs_always_retrieve"]["always_only"] == 0
    full = next(x for x in rows if x["beta"] == 1.0)
    assert full["accuracy"] == rag.mean() and full["vs_always_retrieve"]["p_value"] == 1.0

    point = skip_at_parity(conf, closed, rag, [0.0, 0.5, 1.0])
    ci = skip_at_parity_interval(conf, closed, rag, [0.0, 0.5, 1.0], n_boot=300)
    assert ci["skip"] == point["skip"] and ci["beta"] == point["beta"] and 0.0 <= ci["low"] <= ci["skip"] <= ci["high"]
    with pytest.raises(RagsieveError):
        random_gate(closed, rag[:3], 0.5)
