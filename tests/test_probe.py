from __future__ import annotations

import numpy as np
import pytest

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.probe.cache import StateCache
from ragsieve.probe.hidden import HiddenStateExtractor, full_forward_state, resolve_layer
from ragsieve.probe.model import ConfidenceProbe, ProbeConfig, ProbeHead
from ragsieve.probe.train import ProbeTrainConfig, train_probe_head

PROMPT_TEXTS = [
    "Who wrote Hamlet?",
    "the quick brown fox jumps over the lazy dog and the lazy dog jumps over the fox again",
    "yes",
    "Paris is the capital of France. What is the capital of France?",
]


def test_resolve_layer():
    assert resolve_layer(0.5, 30) == 15
    assert resolve_layer(15, 30) == 15
    assert resolve_layer(-1, 30) == 30
    assert resolve_layer(1.0, 30) == 1  # an integral float is an index, not a fraction
    for bad in (0, 31, 1.5, -31):
        with pytest.raises(RagsieveError):
            resolve_layer(bad, 30)


@pytest.mark.parametrize("layer", [1, 2, 3, 0.5])
def test_early_exit_batched_equals_full_forward(tiny_llm, layer):
    prompts = [tiny_llm.format_prompt(t) for t in PROMPT_TEXTS]
    extractor = HiddenStateExtractor(tiny_llm, layer, batch_size=3)  # mixed lengths → left padding
    batched = extractor.extract(prompts)
    for i, prompt in enumerate(prompts):
        np.testing.assert_allclose(batched[i], full_forward_state(tiny_llm, prompt, extractor.layer), atol=1e-5)


def test_early_exit_skips_later_layers(tiny_llm):
    calls = []
    handles = [layer.register_forward_hook(lambda m, i, o, n=n: calls.append(n))
               for n, layer in enumerate(tiny_llm.model.model.layers)]
    try:
        HiddenStateExtractor(tiny_llm, 2).extract([tiny_llm.format_prompt("hi")])
    finally:
        for h in handles:
            h.remove()
    assert calls == [0, 1]


def test_state_cache_avoids_recompute(tiny_llm, tmp_path, monkeypatch):
    prompts = [tiny_llm.format_prompt(t) for t in PROMPT_TEXTS]
    cache = StateCache(tmp_path / "s.sqlite")
    first = HiddenStateExtractor(tiny_llm, 2, cache=cache).extract(prompts)
    assert len(cache) == len(prompts)
    again = HiddenStateExtractor(tiny_llm, 2, cache=StateCache(tmp_path / "s.sqlite"))
    monkeypatch.setattr(again, "_forward_batch", lambda p: (_ for _ in ()).throw(AssertionError("recomputed")))
    np.testing.assert_array_equal(again.extract(prompts), first)
    other_layer = HiddenStateExtractor(tiny_llm, 3, cache=cache)  # a different key: must compute
    assert not np.allclose(other_layer.extract(prompts[:1]), first[:1])


def _separable(n: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    x[:, 0] += 3.0 * y  # one informative direction ...
    x[:, 1] *= 100.0  # ... and one huge uninformative one (like mid-layer outlier dims)
    return x, y


def test_probe_head_learns_and_early_stops():
    x, y = _separable(600, 32, 0)
    xd, yd = _separable(200, 32, 1)
    xt, yt = _separable(300, 32, 2)
    result = train_probe_head(x, y, xd, yd, ProbeTrainConfig(hidden=16, lr=1e-3, epochs=40, patience=3))
    from sklearn.metrics import roc_auc_score

    assert roc_auc_score(yt, result.head.predict_proba(xt)) > 0.95
    assert result.best_epoch <= len(result.history) <= 40
    with pytest.raises(RagsieveError, match="both correct and incorrect"):
        train_probe_head(x, np.zeros_like(y), xd, yd)


def _probe(tiny_llm, layer=2) -> ConfidenceProbe:
    head = ProbeHead(tiny_llm.hidden_size, 8)
    cfg = ProbeConfig(llm_spec=tiny_llm.spec, layer=layer, num_layers=tiny_llm.num_layers,
                      hidden_size=tiny_llm.hidden_size, probe_hidden=8, max_prompt_tokens=250)
    return ConfidenceProbe(tiny_llm, head, cfg)


def test_probe_save_load_and_refusals(tiny_llm, tmp_path):
    probe = _probe(tiny_llm)
    ctx = Passage("p", "Hamlet was written by Shakespeare.", "Hamlet")
    before = probe.score_batch(["Who wrote Hamlet?", "Who wrote Hamlet?"], [None, ctx])
    assert before.shape == (2,) and np.all((before >= 0) & (before <= 1))
    probe.save(tmp_path / "p")
    loaded = ConfidenceProbe.load(tmp_path / "p", tiny_llm)
    np.testing.assert_allclose(loaded.score_batch(["Who wrote Hamlet?", "Who wrote Hamlet?"], [None, ctx]), before)
    with pytest.raises(RagsieveError, match="trained on layer 2, not layer 3"):
        ConfidenceProbe.load(tmp_path / "p", tiny_llm, layer=3)
    tiny_llm_spec = tiny_llm.spec
    try:
        tiny_llm.spec = "embedded:smollm2-135m-instruct"
        with pytest.raises(RagsieveError, match="trained on LLM"):
            ConfidenceProbe.load(tmp_path / "p", tiny_llm)
    finally:
        tiny_llm.spec = tiny_llm_spec
    with pytest.raises(RagsieveError, match="no probe at .*nothing; build one"):
        ConfidenceProbe.load(tmp_path / "nothing", tiny_llm)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RagsieveError, match="not a saved probe"):
        ConfidenceProbe.load(tmp_path / "empty", tiny_llm)
    with pytest.raises(RagsieveError, match="empty question"):
        probe.score("  ")


def test_probe_prompts_truncate_context_keep_question(tiny_llm):
    probe = _probe(tiny_llm)
    long = Passage("p", "the lazy dog " * 500, "Dog")
    prompt = probe.prompts(["Who wrote Hamlet?"], [long])[0]
    assert "Who wrote Hamlet?" in prompt
    assert tiny_llm.count_tokens(prompt) <= 250
    assert np.isfinite(probe.score("Who wrote Hamlet?", long))


def test_label_generations_resume(tiny_llm, tmp_path, monkeypatch):
    from ragsieve.probe.labels import LabelRequest, label_generations, read_generations
    from ragsieve.prompts.builder import PromptBuilder

    builder = PromptBuilder(tiny_llm, max_prompt_tokens=200)
    reqs = [LabelRequest(f"q{i}", f"question {i}?", ("fox",), "closed") for i in range(5)]
    out = tmp_path / "gens.jsonl"
    first = label_generations(tiny_llm, builder, reqs[:3], out, max_new_tokens=3, batch_size=2)
    assert len(read_generations(out)) == 3
    seen = []
    real = tiny_llm.generate
    monkeypatch.setattr(tiny_llm, "generate", lambda msgs, **kw: seen.extend(msgs) or real(msgs, **kw))
    all_gens = label_generations(tiny_llm, builder, reqs, out, max_new_tokens=3, batch_size=2)
    assert len(seen) == 2 and [g.question_id for g in all_gens] == [r.question_id for r in reqs]
    assert [g.generation for g in all_gens[:3]] == [g.generation for g in first]
    with open(out, "a") as f:
        f.write('{"question_id": "half')  # a crash mid-line must not break the next resume
    assert len(read_generations(out)) == 5


@pytest.mark.integration
def test_smollm2_middle_layer_equivalence(smollm2):
    prompts = [smollm2.format_prompt(t) for t in PROMPT_TEXTS[:3]]
    extractor = HiddenStateExtractor(smollm2, 0.5, batch_size=3)
    assert extractor.layer == 15 and extractor.dim == 576
    states = extractor.extract(prompts)
    for i, p in enumerate(prompts):
        ref = full_forward_state(smollm2, p, 15)
        np.testing.assert_allclose(states[i], ref, atol=1e-3 * np.abs(ref).max())


def test_states_captured_during_generation_match_extractor(tiny_llm, tmp_path):
    from ragsieve.probe.hidden import prompt_key
    from ragsieve.probe.labels import LabelRequest, label_generations
    from ragsieve.prompts.builder import PromptBuilder

    texts, states = tiny_llm.generate_with_states(PROMPT_TEXTS, 2, max_new_tokens=3, batch_size=3)
    assert texts == tiny_llm.generate(PROMPT_TEXTS, max_new_tokens=3, batch_size=3)
    reference = HiddenStateExtractor(tiny_llm, 2).extract([tiny_llm.format_prompt(t) for t in PROMPT_TEXTS])
    np.testing.assert_allclose(states, reference, atol=1e-5)

    builder = PromptBuilder(tiny_llm, max_prompt_tokens=250)
    cache = StateCache(tmp_path / "s.sqlite")
    reqs = [LabelRequest("q1", "Who wrote Hamlet?", ("Shakespeare",), "gold", [Passage("p", "By Shakespeare.")])]
    label_generations(tiny_llm, builder, reqs, tmp_path / "g.jsonl", max_new_tokens=2, state_layer=2, state_cache=cache)
    prompt = tiny_llm.format_prompt(builder.with_context(reqs[0].question, reqs[0].contexts).text, builder.prompts.system)
    stored = cache.get_many([prompt_key(tiny_llm.spec, 2, prompt)])
    assert len(stored) == 1
    np.testing.assert_allclose(next(iter(stored.values())), HiddenStateExtractor(tiny_llm, 2).extract([prompt])[0],
                               atol=1e-5)


def test_extract_layers_equals_one_layer_at_a_time(tiny_llm, tmp_path):
    """The layer sweep's one-forward capture gives each layer's early-exit state, cached per layer."""
    from ragsieve.probe.cache import StateCache
    from ragsieve.probe.hidden import HiddenStateExtractor, extract_layers, full_forward_state

    prompts = [tiny_llm.format_prompt(q) for q in ("Who wrote Hamlet?", "What is the capital of France, please?")]
    cache = StateCache(tmp_path / "states.sqlite")
    by_layer = extract_layers(HiddenStateExtractor(tiny_llm, 1, batch_size=2, cache=cache), prompts, [1, 3])
    assert set(by_layer) == {1, 3}
    for layer, states in by_layer.items():
        np.testing.assert_allclose(states, HiddenStateExtractor(tiny_llm, layer).extract(prompts), atol=1e-5)
        np.testing.assert_allclose(states[0], full_forward_state(tiny_llm, prompts[0], layer), atol=1e-4)
    cached = HiddenStateExtractor(tiny_llm, 3, cache=cache)
    cached._forward_batch = None  # everything must come from the cache now
    np.testing.assert_allclose(cached.extract(prompts), by_layer[3])


def test_all_layer_state_cache_resumes_after_interruption(tiny_llm, tmp_path, monkeypatch):
    """Every layer's state is captured in the answer's own prefill and cached batch by batch: a run
    killed after one batch keeps it, the rerun answers only the rest, and nothing stored is recomputed."""
    import sqlite3

    from ragsieve.probe.hidden import fill_layer_cache, prompt_key, read_layer_states
    from ragsieve.probe.labels import LabelRequest, label_generations, read_generations
    from ragsieve.prompts.builder import PromptBuilder

    builder = PromptBuilder(tiny_llm, max_prompt_tokens=250)
    hamlet = Passage("p1", "Hamlet was written by William Shakespeare.", "Hamlet")
    reqs = [LabelRequest(f"q{i}", f"Who wrote play number {i}?", ("Shakespeare",), "closed") for i in range(3)]
    reqs += [LabelRequest(f"q{i}", f"Who wrote play number {i}?", ("Shakespeare",), "gold", [hamlet]) for i in range(3)]
    layers = list(range(1, tiny_llm.num_layers + 1))
    out, cache = tmp_path / "gens.jsonl", StateCache(tmp_path / "states.sqlite")

    class Killed(Exception):
        pass

    def kill_after_first_batch(n):
        if n:  # the first call reports the already-stored rows (0 here), the next one a finished batch
            raise Killed

    with pytest.raises(Killed):
        label_generations(tiny_llm, builder, reqs, out, max_new_tokens=2, batch_size=2, state_cache=cache,
                          state_layers=layers, progress=kill_after_first_batch)
    assert len(read_generations(out)) == 2 and len(cache) == 2 * len(layers)

    answered = []
    real = tiny_llm.generate_with_layer_states
    monkeypatch.setattr(tiny_llm, "generate_with_layer_states",
                        lambda msgs, ls, **kw: answered.extend(msgs) or real(msgs, ls, **kw))
    gens = label_generations(tiny_llm, builder, reqs, out, max_new_tokens=2, batch_size=2,
                             state_cache=StateCache(tmp_path / "states.sqlite"), state_layers=layers)
    assert len(answered) == 4 and len(gens) == 6 and len(cache) == 6 * len(layers)

    prompts = [builder.chat_prompt(r.question, r.contexts) for r in reqs]
    extractor = HiddenStateExtractor(tiny_llm, 1, batch_size=3, cache=cache)
    for layer in layers:  # the states read during generation are the early-exit extractor's
        np.testing.assert_allclose(read_layer_states(cache, tiny_llm.spec, layer, prompts),
                                   HiddenStateExtractor(tiny_llm, layer).extract(prompts), atol=1e-5)

    computed = []
    real_forward = extractor._forward_batch
    monkeypatch.setattr(extractor, "_forward_batch", lambda p, ls=None: computed.extend(p) or real_forward(p, ls))
    assert fill_layer_cache(extractor, prompts, layers) == 0 and computed == []
    # a lost row (e.g. a cache file from an older run) is recomputed for that prompt only
    with sqlite3.connect(cache.path) as db:
        db.execute("DELETE FROM states WHERE key = ?", (prompt_key(tiny_llm.spec, 3, prompts[4]),))
    assert fill_layer_cache(extractor, prompts, layers) == 1 and computed == [prompts[4]]
    np.testing.assert_allclose(read_layer_states(cache, tiny_llm.spec, 3, prompts)[4],
                               HiddenStateExtractor(tiny_llm, 3).extract(prompts[4:5])[0], atol=1e-5)


def test_reuse_generations_serves_identical_prompts(tmp_path):
    """Another study's answer to the same question and contexts is copied under this study's variant name."""
    from dataclasses import asdict

    from ragsieve.data import append_jsonl
    from ragsieve.probe.labels import LabeledGeneration, LabelRequest, read_generations, reuse_generations

    source = tmp_path / "probe.jsonl"
    for g in (LabeledGeneration("q1", "closed", [], "Paris", 1, 1.0, 1.0),
              LabeledGeneration("q1", "gold", ["p1"], "Paris, France", 1, 0.0, 0.8),
              LabeledGeneration("q1", "retrieved", ["p9"], "Lyon", 0, 0.0, 0.0)):
        append_jsonl(source, asdict(g))
    p1, p2 = Passage("p1", "Paris is the capital of France."), Passage("p2", "Lyon is in France.")
    reqs = [LabelRequest("q1", "capital of France?", ("Paris",), "closed"),
            LabelRequest("q1", "capital of France?", ("Paris",), "top1", [p1]),
            LabelRequest("q1", "capital of France?", ("Paris",), "top3", [p1, p2]),
            LabelRequest("q2", "capital of Spain?", ("Madrid",), "closed")]
    out = tmp_path / "cbdr.jsonl"
    assert reuse_generations(reqs, out, [source]) == 2
    stored = read_generations(out)
    assert set(stored) == {"q1|closed|", "q1|top1|p1"} and stored["q1|top1|p1"].generation == "Paris, France"
    assert reuse_generations(reqs, out, [source]) == 2 and len(out.read_text().splitlines()) == 2  # idempotent
