"""`ragsieve fit --ray`: the heavy phases on a real local Ray instance (2 CPUs) give what one process gives."""

from __future__ import annotations

import numpy as np
import pytest

from ragsieve.data.records import Passage
from tests.test_fit import fit_inputs  # noqa: F401 - the tiny fit set-up (a fixture)

ray = pytest.importorskip("ray", reason="the ray extra is part of the dev install")

QUESTIONS = [("q1", "who wrote hamlet?", ("Shakespeare",)), ("q2", "what is the capital of france?", ("Paris",)),
             ("q3", "how many legs does a spider have?", ("eight", "8"))]
PASSAGES = [Passage("p1", "Hamlet is a tragedy written by William Shakespeare.", "Hamlet"),
            Passage("p2", "Paris is the capital and largest city of France.", "Paris"),
            Passage("p3", "Spiders are arachnids with eight legs.", "Spider")]


@pytest.fixture(scope="module")
def local_ray():
    from ragsieve.fit.scale import init_ray

    init_ray("local", num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def probe_dir(tiny_llm, tmp_path_factory):
    """A probe head for the tiny LLM, saved like fit saves it."""
    from ragsieve.probe.model import ConfidenceProbe, ProbeConfig
    from ragsieve.probe.train import ProbeTrainConfig, train_probe_head

    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, tiny_llm.hidden_size)).astype(np.float32)
    y = np.array([0, 1] * 8)
    head = train_probe_head(x, y, x, y, ProbeTrainConfig(hidden=8, epochs=2)).head
    config = ProbeConfig(llm_spec=tiny_llm.spec, layer=2, num_layers=tiny_llm.num_layers,
                         hidden_size=tiny_llm.hidden_size, probe_hidden=8, dropout=0.5, max_prompt_tokens=400)
    return ConfidenceProbe(tiny_llm, head, config).save(tmp_path_factory.mktemp("probe"))


def test_confidence_shifts_on_ray_equal_the_single_process_path(local_ray, tiny_llm, tiny_llm_dir, probe_dir):
    from ragsieve.fit.scale import ray_confidence_shifts
    from ragsieve.probe.model import ConfidenceProbe

    probe = ConfidenceProbe.load(probe_dir, tiny_llm, batch_size=8)
    rows = [{"question_id": qid, "question": text, "passages": PASSAGES} for qid, text, _ in QUESTIONS]
    scored = ray_confidence_shifts("local", rows, llm=str(tiny_llm_dir), probe=str(probe_dir), batch_size=8)
    assert set(scored) == {"q1", "q2", "q3"}
    for qid, text, _ in QUESTIONS:
        expected = probe.score_batch([text] * 4, [None, *PASSAGES])
        np.testing.assert_allclose(scored[qid], expected, atol=1e-5)


def test_generations_on_ray_equal_the_single_process_path(local_ray, tiny_llm, tiny_llm_dir):
    from ragsieve.fit.scale import ray_answer_requests
    from ragsieve.probe.labels import LabelRequest, answer_requests
    from ragsieve.prompts.builder import PromptBuilder

    requests = [LabelRequest(qid, text, answers, variant, ctx) for qid, text, answers in QUESTIONS
                for variant, ctx in (("closed", []), ("top1", PASSAGES[:1]))]
    # batch size 1 on both sides: the same forward passes, no padding that could flip a greedy tie
    got = ray_answer_requests("local", requests, llm=str(tiny_llm_dir), max_prompt_tokens=400, max_new_tokens=4,
                              batch_size=1)
    builder = PromptBuilder(tiny_llm, None, 400)
    expected = [g for r in requests for g in answer_requests(tiny_llm, builder, [r], max_new_tokens=4, batch_size=1)]
    assert [g.key for g in got] == [r.key for r in requests]  # matched back by key, in the order given
    assert [(g.generation, g.correct) for g in got] == [(g.generation, g.correct) for g in expected]


def test_labels_answered_on_ray_fill_the_answer_cache(local_ray, fit_inputs, tmp_path, tiny_llm_dir):
    """Labels answered on Ray go into fit's answer cache, as the single-process path's do: the selection's
    closed-book and top-k prompts are then not asked again."""
    from ragsieve.fit.config import FitConfig
    from ragsieve.fit.run import Fit

    index, qa, _ = fit_inputs
    fit = Fit(FitConfig(index=str(index), questions=str(qa), llm=str(tiny_llm_dir), out=str(tmp_path / "sieve"),
                        ray="local", max_new_tokens=3, max_prompt_tokens=400))
    fit.load()
    fit.run_phase("split")
    fit.run_phase("retrieve")
    fit.run_phase("label")
    k = fit.config.top_k
    messages = [fit.builder.with_context(q.text, ctx).text for q in fit.questions
                for ctx in ([], fit.candidates[q.id][:k])]
    fit.answers.answers(messages)
    assert fit.answers.answered == 0 and fit.answers.unique == len(set(messages))  # every one from the cache


def test_sentence_shifts_on_ray_equal_the_single_process_path(local_ray, fit_inputs, tmp_path, tiny_llm_dir):
    """The sentences phase on Ray measures the rows one process measures (the answer's likelihood, alone and left
    out), matched back by question, and a rerun measures nothing again."""
    from ragsieve.fit.config import FitConfig
    from ragsieve.fit.run import Fit
    from ragsieve.fit.sentence_shifts import measure_sentences
    from ragsieve.fit.sentences import SHIFTS_FILE, _confidence, _sentence_shifts, _top

    index, qa, _ = fit_inputs
    fit = Fit(FitConfig(index=str(index), questions=str(qa), llm=str(tiny_llm_dir), out=str(tmp_path / "sieve"),
                        ray="local", max_new_tokens=3, max_prompt_tokens=400,
                        sentences={"enabled": True, "order": "retriever", "passages": 2, "leave_one_out": True}))
    fit.load()
    fit.run_phase("split")
    fit.run_phase("retrieve")
    train = fit.splits["train"]
    rows = _sentence_shifts(fit, train)
    assert set(rows) == {q.id for q in train}
    for q in train:
        expected = measure_sentences(q, _top(fit, q), "answer likelihood", lambda c, q=q: _confidence(fit, q, c),
                                     True)
        got = rows[q.id]
        assert {k: got[k] for k in ("passage_ids", "spans", "signal")} == {
            k: expected[k] for k in ("passage_ids", "spans", "signal")}
        np.testing.assert_allclose([got["conf_q"], got["conf_top"], *got["alone"]],
                                   [expected["conf_q"], expected["conf_top"], *expected["alone"]], atol=1e-4)
        assert [w is None for w in got["without"]] == [w is None for w in expected["without"]]
        np.testing.assert_allclose([w for w in got["without"] if w is not None],
                                   [w for w in expected["without"] if w is not None], atol=1e-4)
    lines = (fit.work / SHIFTS_FILE).read_text().count("\n")
    assert _sentence_shifts(fit, train) == rows and (fit.work / SHIFTS_FILE).read_text().count("\n") == lines
