"""Sentence pruning (issue #61): the splitter's spans, the pruner's cut, the one sieve's prune step, and the
same pruned text from Python, HTTP and the three framework adapters."""

from __future__ import annotations

import asyncio

import importlib.util
import os
import pickle

import httpx
import numpy as np
import pytest

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.prune import SentencePruner, split_sentences

QUERY = "who wrote hamlet shakespeare"
DOCS = [
    "Paris is the capital of France. It lies on the Seine.",
    "Hamlet is a tragedy. It was written by William Shakespeare around 1600. The play is set in Denmark.",
    "The quick brown fox jumps over the lazy dog.",
    "Denmark is a Nordic country. Shakespeare's Hamlet is set at Elsinore castle. Its capital is Copenhagen.",
]


@pytest.fixture(scope="module")
def bm25():
    from ragsieve.registry import load_reranker

    return load_reranker("bm25")


def test_sentence_spans_index_the_text_stripped_and_in_order():
    text = "  Café Müller is a ballet.  Pina Bausch made it in 1978.\nDr. Smith saw it. "
    spans = split_sentences(text)
    assert [text[a:b] for a, b in spans] == ["Café Müller is a ballet.", "Pina Bausch made it in 1978.",
                                            "Dr. Smith saw it."]
    assert split_sentences("   ") == () and split_sentences("no stop") == ((0, 7),)


def test_pruner_keeps_sentences_at_the_threshold_and_always_the_best(bm25):
    passage = Passage("h", DOCS[1], "Hamlet")
    pruner = SentencePruner(bm25)
    everything = pruner.prune(QUERY, [passage], threshold=-np.inf)[0]
    assert everything.text == DOCS[1] and everything.as_passage() is passage  # nothing cut: the same passage
    best_only = pruner.prune(QUERY, [passage], threshold=np.inf)[0]
    assert best_only.n_kept == 1 and best_only.text == "It was written by William Shakespeare around 1600."
    assert best_only.kept_spans == [(21, 71)] and DOCS[1][21:71] == best_only.text
    cut = best_only.as_passage()
    assert (cut.id, cut.title, cut.text, cut.meta["kept_spans"]) == ("h", "Hamlet", best_only.text, [[21, 71]])
    assert best_only.tokens_after < best_only.tokens_before == len(DOCS[1].split())  # bm25: whitespace words


def test_kept_sentences_join_with_their_own_separator_or_a_space(bm25):
    text = "Hamlet is a play.\nShakespeare wrote it. Paris is far. Shakespeare died in 1616."
    pruned = SentencePruner(bm25).prune("shakespeare hamlet", [Passage("x", text)], threshold=0.01)[0]
    assert pruned.keep == (True, True, False, True)
    assert pruned.text == "Hamlet is a play.\nShakespeare wrote it. Shakespeare died in 1616."


def test_pruner_refuses_what_it_cannot_use(bm25):
    with pytest.raises(RagsieveError, match="no prune threshold"):
        SentencePruner(bm25).prune(QUERY, [Passage("a", "x. y.")])
    with pytest.raises(RagsieveError, match="NaN"):
        SentencePruner(bm25, threshold=float("nan"))
    with pytest.raises(RagsieveError, match="min_keep"):
        SentencePruner(bm25, min_keep=0)


def test_the_sieve_prunes_what_it_keeps_and_the_trace_says_which_sentences(bm25):
    from ragsieve.pipeline.stages import SieveStages

    stages = SieveStages(bm25, top_k=2, pruner=SentencePruner(bm25, threshold=np.inf))
    result = stages.apply(QUERY, DOCS)
    whole = SieveStages(bm25, top_k=2).apply(QUERY, DOCS)
    assert [p.id for p in result.kept_whole] == [p.id for p in whole.kept]  # pruning never changes what is kept
    assert [p.text for p in result.kept_whole] == [p.text for p in whole.kept]
    assert all(len(split_sentences(p.text)) == 1 for p in result.kept)  # threshold +inf: the best sentence each
    assert result.tokens_after < result.tokens_before
    traced = [t for t in result.trace() if t.sentences]
    assert len(traced) == 2 and all(sum(k for _, _, k in t.sentences) == 1 for t in traced)
    assert SieveStages(bm25, top_k=2).override(top_k=1).pruner is None
    with pytest.raises(RagsieveError, match="no pruner"):
        SieveStages(bm25).override(prune_threshold=0.5)


def test_a_pipeline_config_refuses_pruning_without_a_scorer():
    from pydantic import ValidationError

    from ragsieve.pipeline import PipelineConfig

    with pytest.raises(ValidationError, match="sentence scorer"):
        PipelineConfig(index="x", prune_threshold=0.5)
    assert PipelineConfig(index="x", reranker="bm25", prune_threshold=0.5).prune_threshold == 0.5


def pruning_folder(parent):
    """A sieve folder that prunes each kept passage at a raw threshold (bm25: the LLM never loads)."""
    from ragsieve.pipeline import Sieve, SieveConfig

    folder = parent / "pruning-sieve"
    Sieve(SieveConfig(reranker="bm25", top_k=2, prune_threshold=1.0)).save(folder)
    return folder


@pytest.fixture(scope="module")
def pruning_sieve(tmp_path_factory):
    return pruning_folder(tmp_path_factory.mktemp("sieve"))


def _front_doors(sieve_folder, check_http=None) -> dict[str, list[tuple[int, str]]]:
    """(input index, text that reaches the LLM) of each kept document, through /v1/filter (a real loopback server)
    and LangChain / LlamaIndex / Haystack with the sieve in ``sieve_folder``; ``check_http(server)`` asserts more
    on the running server."""
    from ragsieve.serve import ServeConfig, create_app
    from ragsieve.serve.runner import BackgroundServer

    got = {}
    with BackgroundServer(create_app(ServeConfig(sieve=str(sieve_folder)))) as server:
        r = httpx.post(f"{server.url}/v1/filter", json={"query": QUERY, "documents": DOCS, "raw_scores": True})
        assert r.status_code == 200, r.text
        body = r.json()
        got["http"] = [(d["index"], d["pruned"]["text"] if "pruned" in d else DOCS[d["index"]])
                       for d in body["results"]]
        for d in body["results"]:
            if "pruned" in d:
                assert d["pruned"]["text"].startswith(DOCS[d["index"]][slice(*d["pruned"]["kept_spans"][0])])
        if check_http is not None:
            check_http(server, body)
    if importlib.util.find_spec("langchain_core"):
        from langchain_core.documents import Document

        from ragsieve.integrations.langchain import RagsieveCompressor

        out = RagsieveCompressor(sieve=str(sieve_folder)).compress_documents(
            [Document(page_content=t, metadata={"n": i}) for i, t in enumerate(DOCS)], QUERY)
        got["langchain"] = [(d.metadata["n"], d.page_content) for d in out]
    if importlib.util.find_spec("llama_index"):
        from llama_index.core.schema import NodeWithScore, TextNode

        from ragsieve.integrations.llama_index import RagsieveRerank

        nodes = [NodeWithScore(node=TextNode(text=t, id_=str(i)), score=0.0) for i, t in enumerate(DOCS)]
        out = RagsieveRerank(sieve=str(sieve_folder)).postprocess_nodes(nodes, query_str=QUERY)
        got["llama_index"] = [(int(n.node.node_id), n.node.get_content()) for n in out]
    if importlib.util.find_spec("haystack"):
        from haystack import Document

        from ragsieve.integrations.haystack import RagsieveRanker

        out = RagsieveRanker(sieve=str(sieve_folder)).run(QUERY, [Document(content=t, id=str(i))
                                                                  for i, t in enumerate(DOCS)])
        got["haystack"] = [(int(d.id), d.content) for d in out["documents"]]
    assert set(got) >= {"http"}
    return got


def test_python_http_and_every_adapter_return_the_same_pruned_text(pruning_sieve):
    """Sieve.filter, /v1/filter (a real loopback server) and LangChain / LlamaIndex / Haystack with the same
    sieve keep the same documents, cut to the same sentences."""
    from ragsieve.pipeline import Sieve

    result = Sieve.load(pruning_sieve).filter(QUERY, DOCS)
    expected = [(r.index, p.text) for r, _, p in result.kept_items]
    assert len(expected) == 2 and any(text != DOCS[i] for i, text in expected)  # something was cut

    def check_http(server, body):
        assert body["prune_threshold"] == 1.0
        whole = httpx.post(f"{server.url}/v1/filter", json={"query": QUERY, "documents": DOCS, "prune": False})
        assert all("pruned" not in d for d in whole.json()["results"])
        assert "prune_threshold" not in whole.json()
        bad = httpx.post(f"{server.url}/v1/filter", json={"query": QUERY, "documents": DOCS, "prune": 3})
        assert bad.status_code == 422 and "prune" in bad.text

    for name, kept in _front_doors(pruning_sieve, check_http).items():
        assert kept == expected, name


def test_across_passages_the_best_sentences_of_all_kept_passages_reach_every_front_door(bm25, tmp_path):
    """Issue #69: a sieve that prunes across its kept passages keeps their best sentences together (a cap in
    all, or a token cap); a passage left without a sentence leaves the prompt, in Python, over HTTP and in
    every adapter alike, and the trace shows its sentences dropped."""
    from ragsieve.pipeline import Sieve, SieveConfig
    from ragsieve.pipeline.stages import SieveStages

    per_passage = SieveStages(bm25, top_k=3, pruner=SentencePruner(bm25, max_sentences=1)).apply(QUERY, DOCS)
    across = SieveStages(bm25, top_k=3, pruner=SentencePruner(bm25, max_sentences=2, scope="across"))
    result = across.apply(QUERY, DOCS)
    assert len(per_passage.kept) == 3 and len(result.kept_whole) == 3  # the same three passages selected ...
    assert sum(len(split_sentences(p.text)) for p in result.kept) == 2 and len(result.kept) <= 2  # ... 2 sentences
    scores = sorted((s for p in result.pruned for s in p.scores), reverse=True)
    kept_scores = sorted((s for p in result.pruned for s, k in zip(p.scores, p.keep) if k), reverse=True)
    assert kept_scores == scores[:2]  # the two best of all, wherever they sit
    assert dict(result.prune_rule) == {"scope": "across", "max_sentences": 2, "token_cap": None}
    traced = [t for t in result.trace() if t.sentences]
    assert len(traced) == 3 and sum(k for t in traced for _, _, k in t.sentences) == 2
    # a token cap: the best sentences that fit, and never nothing
    capped = SieveStages(bm25, top_k=3, pruner=SentencePruner(bm25, token_cap=12, scope="across")).apply(QUERY, DOCS)
    assert 0 < capped.tokens_after <= max(12, min(p.tokens_after for p in capped.pruned if p.n_kept))
    with pytest.raises(RagsieveError, match="scope='across'"):
        SentencePruner(bm25, token_cap=12)
    folder = tmp_path / "across"
    Sieve(SieveConfig(reranker="bm25", top_k=3, prune_max_sentences=2, prune_scope="across")).save(folder)
    expected = [(r.index, p.text) for r, _, p in Sieve.load(folder).filter(QUERY, DOCS).kept_items]
    assert expected == [(r.index, p.text) for r, _, p in result.kept_items]

    def per_request_cap(server, body):  # /v1/filter: a token cap per request, beside "prune"
        assert body["prune_rule"] == {"scope": "across", "max_sentences": 2, "token_cap": None}
        r = httpx.post(f"{server.url}/v1/filter", json={"query": QUERY, "documents": DOCS, "prune_token_cap": 12})
        assert r.status_code == 200, r.text
        assert [(d["index"], d["pruned"]["text"]) for d in r.json()["results"]] == \
            [(r.index, p.text) for r, _, p in capped.kept_items]
        assert r.json()["prune_rule"] == {"scope": "across", "max_sentences": None, "token_cap": 12}
        refused = httpx.post(f"{server.url}/v1/filter", json={"query": QUERY, "documents": DOCS, "prune": False,
                                                               "prune_token_cap": 12})
        assert refused.status_code == 400 and "prune_token_cap" in refused.json()["error"]

    for name, kept in _front_doors(folder, per_request_cap).items():
        assert kept == expected, name
    # `ask --prune-tokens` / a pipeline config: a token cap over a sieve's own pruning cuts across its passages
    from ragsieve.pipeline import PipelineConfig, RAGPipeline

    stages = RAGPipeline.load_stages(PipelineConfig(index="x", sieve=str(pruning_folder(tmp_path)), prune_token_cap=12))
    assert (stages.pruner.scope, stages.pruner.token_cap) == ("across", 12)


def test_the_served_default_sieve_prunes_with_its_keep_head_as_python_does():
    """The shipped default sieve names a sentence scorer of its own (`pruner: prune-head`): /v1/filter serving it
    cuts with that head, at its level, exactly as Sieve.filter does (not with the reranker's sentence scores)."""
    from ragsieve.pipeline import Sieve
    from ragsieve.prune.head import SentenceKeepHead
    from ragsieve.serve import ServeConfig, create_app
    from ragsieve.serve.runner import BackgroundServer

    query = "what does hp mean in video games"
    docs = ["Hit points, or HP, measure how much damage a character can take before it is defeated. When the HP of "
            "an enemy drops to zero, the enemy dies and the player usually earns a reward. Many games show HP as a "
            "bar above the character.", "Paris is the capital of France. It lies on the Seine."]
    sieve = Sieve.load("embedded:default")
    assert isinstance(sieve.stages.pruner.scorer, SentenceKeepHead)
    result = sieve.filter(query, docs)
    expected = [(r.index, p.text) for (r, _), p in zip(result.kept_results, result.pruned)]
    zero_shot = SentencePruner(sieve.stages.reranker, max_sentences=1).prune(query, [Passage("0", docs[0])])[0]
    assert expected == [(0, docs[0][: docs[0].index(". ") + 1])] and zero_shot.text != expected[0][1]  # they differ
    # the sieve's stages as plain specs (what create_app serves), without its LLM: /v1/filter needs none
    config = ServeConfig(sieve="embedded:default").expanded().model_copy(update={"llm": None})
    assert config.pruner == "prune-head"
    with BackgroundServer(create_app(config)) as server:
        async def concurrently():  # the head's sentences of several requests batched, as the reranker's pairs are
            async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
                return await asyncio.gather(*[client.post("/v1/filter", json={"query": query, "documents": docs})
                                              for _ in range(4)])

        bodies = [r.json() for r in asyncio.run(concurrently())]
        head_batcher = server.server.config.app.state.serve.models.prune_batcher
    for body in bodies:
        assert [(d["index"], d["pruned"]["text"]) for d in body["results"]] == expected
    assert head_batcher.stats.pairs >= 4 * 3  # every request's sentences went through the head's batcher


def test_the_fit_grid_prunes_with_stored_sentence_scores(bm25, tmp_path):
    """Selection: prune configurations at dev quantiles, their prompts hold the pruned passages, and the sentence
    scores are recorded so a rerun scores nothing."""
    from ragsieve.data.records import Question
    from ragsieve.data.score_records import PairScores
    from ragsieve.fit.config import SelectConfig
    from ragsieve.fit.select import RETRIEVER, Choice, Selection

    questions = [Question(str(i), QUERY, ("Shakespeare",)) for i in range(3)]
    candidates = {q.id: [Passage(str(j), t, f"t{j}") for j, t in enumerate(DOCS)] for q in questions}
    store = PairScores(tmp_path / "sentences", "sentences", {"scoring_key": "bm25"})
    config = SelectConfig(ks=[0, 1, 2], plain_ks=[1, 2], grade_quantiles=[], gate_quantiles=[],
                          prune_quantiles=[0.9], prune_max_sentences=[1], prune_across_sentences=[2],
                          prune_token_caps=[12], race=False)
    selection = Selection(None, None, candidates, config, pruner=SentencePruner(bm25), sentence_store=store)
    selection.add_ranking(RETRIEVER, questions)
    selection.add_ranking("bm25", questions, bm25)
    grid = selection.grid([RETRIEVER, "bm25"], questions)
    pruned = [c for c in grid if c.prune != "off"]
    assert {(c.k, c.order) for c in pruned} == {(1, RETRIEVER), (2, RETRIEVER), (1, "bm25"), (2, "bm25")}
    assert {c.prune for c in pruned} == {"q0.90", "best1", "across best2", "across 12 tokens"}
    budget = next(c for c in pruned if c.prune_token_cap == 12 and c.order == "bm25")  # RECOMP / EXIT-style budget
    assert budget.k == 2 and sum(len(p.text.split()) for p in selection.passages(budget, questions[0])) <= 12
    assert all(c.gate == "off" and not c.plain for c in pruned)
    # across passages (issue #69): only for k >= 2, the best 2 sentences of both kept passages together
    across = next(c for c in pruned if c.prune_scope == "across" and c.order == "bm25")
    assert across.k == 2 and across.name == "top2, bm25, prune across best2"
    across_kept = selection.passages(across, questions[0])
    assert sum(len(split_sentences(p.text)) for p in across_kept) == 2
    assert [p.id for p in across_kept] == [p.id for p in selection.passages(Choice(2, "bm25"), questions[0])
                                           if p.id in {q.id for q in across_kept}]
    choice = next(c for c in pruned if c.k == 2 and c.order == "bm25" and c.prune == "q0.90")
    kept = selection.passages(choice, questions[0])
    whole = selection.passages(Choice(2, "bm25"), questions[0])
    assert [p.id for p in kept] == [p.id for p in whole]
    assert sum(len(p.text) for p in kept) < sum(len(p.text) for p in whole)
    again = Selection(None, None, candidates, config, pruner=SentencePruner(bm25), sentence_store=store)
    again.add_ranking("bm25", questions, bm25)
    again.score_sentences([(questions[0], i) for i, _ in again.rankings["bm25"]["0"][:2]])
    assert again._sentence_scores.keys() <= selection._sentence_scores.keys()
    assert store.lookup("0", [f"{p.id}#{a}-{b}" for p in whole[:1] for a, b in split_sentences(p.text)]) is not None


def test_a_sentence_cap_keeps_the_best_ones_in_their_order(bm25):
    text = "Hamlet is a play.\nShakespeare wrote it. Paris is far. Shakespeare died in 1616."
    capped = SentencePruner(bm25, max_sentences=2).prune("shakespeare hamlet", [Passage("x", text)])[0]
    assert capped.n_kept == 2 and capped.keep[2] is False
    assert [capped.sentences[i] for i, k in enumerate(capped.keep) if k] == \
        [s for s, k in zip(capped.sentences, capped.keep) if k]  # document order, not score order
    with pytest.raises(RagsieveError, match="max_sentences"):
        SentencePruner(bm25, max_sentences=0)


def test_the_keep_head_scores_every_sentence_in_one_forward_per_batch_of_passages(tiny_cross_encoder_dir, tmp_path):
    import torch

    from ragsieve.errors import ModelNotAvailable
    from ragsieve.prune.head import HEAD_FILE, SentenceKeepHead, read_head
    from ragsieve.registry import load_reranker

    with pytest.raises(ModelNotAvailable, match="no prune head"):
        SentenceKeepHead(tiny_cross_encoder_dir)
    head = SentenceKeepHead.untrained(tiny_cross_encoder_dir, branch_layers=1)
    torch.manual_seed(0)
    torch.nn.init.normal_(head.branch.classifier.weight)  # an untrained classifier is zero: every logit ties
    head.save(tmp_path / HEAD_FILE)
    read = read_head(tmp_path / HEAD_FILE, tiny_cross_encoder_dir)
    assert all(torch.allclose(a, b.float(), atol=1e-3) for a, b in
               zip(read.state_dict().values(), head.branch.state_dict().values()))  # float16 on disk

    forwards = []
    head.encoder.register_forward_hook(lambda *_: forwards.append(1))
    passages = [Passage(f"d{i}", text, f"t{i}") for i, text in enumerate(DOCS[:2])]
    pruner = SentencePruner(head, threshold=0.0)
    layout = pruner.layout(QUERY, passages)
    scores = pruner.score(layout)
    assert len(scores) == len(layout.pairs) == 5 and len(forwards) == 1  # not one forward per sentence
    # the head reads a sentence in its passage: the same sentence alone scores otherwise
    alone = head.score(QUERY, [Passage("x", "It lies on the Seine.", "t0")])
    assert not np.isclose(alone[0], scores[1])
    cut = pruner.decide(layout, scores)
    assert all(c.n_kept >= 1 for c in cut) and [c.passage.id for c in cut] == ["d0", "d1"]
    # a spec, as a sieve's pruner names it, reads the head shipped beside the cross-encoder
    (tiny_cross_encoder_dir / HEAD_FILE).write_bytes((tmp_path / HEAD_FILE).read_bytes())
    try:
        spec_head = load_reranker(f"prune-head:{tiny_cross_encoder_dir}")
        assert np.allclose(SentencePruner(spec_head).score(layout), scores, atol=1e-2)
    finally:
        (tiny_cross_encoder_dir / HEAD_FILE).unlink()


def test_an_untrained_keep_branch_carries_on_exactly_where_the_cross_encoder_would(tiny_cross_encoder_dir):
    """The trunk stops at the branch point and the branch's layers are copies of the top ones: together they
    give the cross-encoder's own last hidden states, so training starts from what the reranker reads."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from ragsieve.prune.head import SentenceKeepHead

    full = AutoModel.from_pretrained(tiny_cross_encoder_dir, dtype=torch.float32).eval()
    enc = AutoTokenizer.from_pretrained(tiny_cross_encoder_dir)([QUERY] * 2, DOCS[:2], padding=True,
                                                               return_tensors="pt")
    head = SentenceKeepHead.untrained(tiny_cross_encoder_dir, branch_layers=1)
    mask = enc["attention_mask"].bool()
    with torch.no_grad():
        states = head.encoder(**enc).last_hidden_state
        for layer in head.branch.layers:
            states = layer(states, src_key_padding_mask=~mask)
        expected = full(**enc).last_hidden_state
    assert torch.allclose(states[mask], expected[mask], atol=1e-4)


def test_a_keep_head_scores_the_sentences_of_many_requests_in_one_call_as_each_alone(tiny_cross_encoder_dir):
    """serve batches the keep head across requests: the sentences of two requests (other queries, other passages)
    scored in one call get the logits each request's layout gets alone."""
    from ragsieve.prune.head import HeadSentences, SentenceKeepHead, sentences_in_passages

    head = SentenceKeepHead.untrained(tiny_cross_encoder_dir, branch_layers=1)
    pruner = SentencePruner(head)
    layouts = [pruner.layout(QUERY, [Passage(str(i), t, f"t{i}") for i, t in enumerate(DOCS)]),
               pruner.layout("paris france", [Passage("p", DOCS[1], "Paris")])]
    pairs = [pair for layout in layouts for pair in sentences_in_passages(layout)]
    together = HeadSentences(head).score_pairs([q for q, _ in pairs], [s for _, s in pairs])
    alone = np.concatenate([head.score_layout(layout) for layout in layouts])
    assert len(together) == sum(len(layout.pairs) for layout in layouts)
    np.testing.assert_allclose(together, alone, atol=1e-4)


def test_a_keep_head_carries_on_from_the_rank_forward_and_reads_only_what_the_rank_could_not(tiny_cross_encoder_dir):
    """Issue #69, pruning at the rank's cost: a keep head on its reranker's weights takes the branch-point states the
    rank forward left (no second read of a ranked passage), reads an unranked pair through the rank forward, and
    a passage longer than the rank's window itself; every sentence scores what the head alone gives it."""
    from ragsieve.prune.head import SentenceKeepHead
    from ragsieve.registry import load_reranker

    alone = SentenceKeepHead.untrained(tiny_cross_encoder_dir, branch_layers=1)
    torch_seed_branch(alone)
    head = SentenceKeepHead(tiny_cross_encoder_dir, head=alone.branch)
    ranker = load_reranker(f"cross-encoder:{tiny_cross_encoder_dir}", max_length=64)  # best chunk over a window
    assert not head.read_rank_states(load_reranker("bm25"))
    assert head.read_rank_states(ranker) and head.read_rank_states(ranker)  # again: the same store
    own_reads = []
    head.encoder.register_forward_hook(lambda *_: own_reads.append(1))
    pruner, by_itself = SentencePruner(head, max_sentences=1), SentencePruner(alone, max_sentences=1)
    passages = [Passage(str(i), t, f"t{i}") for i, t in enumerate(DOCS)]

    ranker.rank(QUERY, passages)
    layout = pruner.layout(QUERY, passages)
    np.testing.assert_allclose(head.score_layout(layout), alone.score_layout(layout), atol=1e-4)
    assert own_reads == []
    unranked = pruner.layout("paris france", passages[:2])  # the rank forward reads it now, and keeps its states
    np.testing.assert_allclose(head.score_layout(unranked), alone.score_layout(unranked), atol=1e-4)
    assert own_reads == [] and len(ranker.ranker.states) == len(DOCS) + 2
    copied = pickle.loads(pickle.dumps((ranker.ranker.states, ranker.ranker._layer_output)))  # a Ray copy: empty
    assert len(copied[0]) == 0 and copied[0].layer == ranker.ranker.states.layer and copied[1].take() is None
    long = Passage("long", " ".join(DOCS * 3), "long")  # past the rank's 64 tokens: the head reads it whole itself
    ranker.rank(QUERY, [long])
    assert [p.keep for p in pruner.prune(QUERY, [long])] == [p.keep for p in by_itself.prune(QUERY, [long])]
    assert own_reads == [1]


def test_a_keep_head_checks_a_foreign_cross_encoder_once(tiny_cross_encoder_dir, monkeypatch):
    """The stages are built per /v1/filter request: a cross-encoder of other weights is refused once, not by
    reading both weights files on every request."""
    import ragsieve.artifacts
    from ragsieve.prune.head import SentenceKeepHead
    from ragsieve.registry import load_reranker

    head = SentenceKeepHead.untrained(tiny_cross_encoder_dir, branch_layers=1)
    foreign = load_reranker("embedded:base", backend="torch")
    reads = []
    real = ragsieve.artifacts.weights_key
    monkeypatch.setattr(ragsieve.artifacts, "weights_key", lambda *a, **k: reads.append(a) or real(*a, **k))
    assert not head.read_rank_states(foreign) and not head.read_rank_states(foreign)
    assert len(reads) == 2 and head.rank is None  # this head's weights and the foreign ones, the first time only


def torch_seed_branch(head) -> None:
    """Random keep-classifier weights: the untrained zero classifier scores every sentence 0."""
    import torch

    torch.manual_seed(1)
    torch.nn.init.normal_(head.branch.classifier.weight, std=1.0)


def keep_examples(n_questions: int) -> list:
    """``n_questions`` copies of QUERY over DOCS, a sentence labelled to keep when it names Shakespeare."""
    from ragsieve.prune import split_sentences
    from ragsieve.prune.training import KeepExample

    examples = []
    for n in range(n_questions):
        for i, text in enumerate(DOCS):
            spans = tuple(split_sentences(text))
            labels = tuple(int("Shakespeare" in text[a:b]) for a, b in spans)
            examples.append(KeepExample(f"q{n}", QUERY, Passage(f"d{i}", text, f"t{i}"), spans, labels))
    return examples


def test_a_keep_head_trains_and_a_rerun_goes_on_from_its_last_checkpointed_epoch(tiny_cross_encoder_dir, tmp_path):
    from ragsieve.prune.head import SentenceKeepHead
    from ragsieve.prune.training import KeepHeadTrainer, KeepHeadTrainingConfig

    examples = keep_examples(12)
    config = KeepHeadTrainingConfig(epochs=1, batch_size=8, dev_share=0.25)
    head = SentenceKeepHead.untrained(tiny_cross_encoder_dir, branch_layers=1)
    first = KeepHeadTrainer(head, config, tmp_path).train(examples)
    assert len(first["epochs"]) == 1 and np.isfinite(first["epochs"][0]["train_loss"])
    assert first["n_dev_passages"] == 3 * len(DOCS) and first["n_questions"] == 12
    # a second run with more epochs reads the cached trunk states and goes on after epoch 1
    again = SentenceKeepHead.untrained(tiny_cross_encoder_dir, branch_layers=1)
    second = KeepHeadTrainer(again, config.model_copy(update={"epochs": 2}), tmp_path).train(examples)
    assert [e["epoch"] for e in second["epochs"]] == [1, 2]
    assert second["epochs"][0] == first["epochs"][0]
    # other labels on the same passages (a fit's labels from another signal) train afresh: a checkpoint of the old
    # labels, finished or not, is not theirs
    from dataclasses import replace

    relabelled = [replace(e, labels=tuple(1.0 - y for y in e.labels)) for e in examples]
    third = KeepHeadTrainer(SentenceKeepHead.untrained(tiny_cross_encoder_dir, branch_layers=1),
                            config.model_copy(update={"epochs": 2}), tmp_path).train(relabelled)
    assert [e["epoch"] for e in third["epochs"]] == [1, 2] and third["epochs"][0] != first["epochs"][0]


def test_a_keep_head_trained_across_passages_batches_whole_questions_and_learns_one_scale(tiny_cross_encoder_dir):
    """across_weight: every batch holds whole questions, the loss gains the softmax over a question's passages, and
    the epoch is chosen by the dev MAP over each question's passages together."""
    import torch

    from ragsieve.prune.head import SentenceKeepHead
    from ragsieve.prune.training import KeepHeadTrainer, KeepHeadTrainingConfig

    examples = keep_examples(10)
    config = KeepHeadTrainingConfig(epochs=2, batch_size=len(DOCS) + 1, dev_share=0.2, across_weight=1.0)
    torch.manual_seed(0)
    head = SentenceKeepHead.untrained(tiny_cross_encoder_dir, branch_layers=1)
    trainer = KeepHeadTrainer(head, config)
    read = trainer._read_all(examples)
    batches = trainer._batches(list(range(len(examples))), read, 0, examples)
    assert sorted(i for b in batches for i in b) == list(range(len(examples)))
    assert all(len({examples[i].group for i in b}) == len(b) // len(DOCS) for b in batches)  # whole questions
    result = trainer.train(examples)
    assert len(result["epochs"]) == 2 and all(0 < e["dev_map"] <= 1 for e in result["epochs"])
    # the dev unit is the question: one average precision over its passages' sentences together
    from sklearn.metrics import average_precision_score

    dev = [e for e in examples if e.group == "q0"]
    scores = np.concatenate(head.sentence_logits(trainer._read_all(dev)))
    labels = [y for e in dev for y in e.labels]
    assert trainer._dev_map(dev, trainer._read_all(dev)) == pytest.approx(average_precision_score(labels, scores))


def test_the_across_study_counts_evidence_over_the_whole_question(bm25):
    """studies/prune_across: a gold sentence kept anywhere in the top k counts; one in a passage outside it is
    missed; a smaller k is a prefix of the larger k's layout and scores."""
    from studies.prune_across import _recall, prefix

    passages = [Passage("a", DOCS[1], "a"), Passage("b", DOCS[3], "b"), Passage("c", DOCS[0], "c")]
    layout = SentencePruner(bm25).layout(QUERY, passages)
    scores = {"x": np.arange(len(layout.pairs), dtype=float)}
    gold = {"a": [layout.spans[0][1]], "b": [layout.spans[1][1]], "elsewhere": [(0, 10)]}
    keeps = [[False, True, False], [False, True, False], [False, False]]
    assert _recall(layout, keeps, gold, 3) == pytest.approx(2 / 3)
    small, cut = prefix(layout, scores, 2)
    assert small.passages == layout.passages[:2] and len(cut["x"]) == len(small.pairs) == 6
