from __future__ import annotations

import pytest

from ragsieve.config import StrictConfig, build_config, load_config
from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.pipeline import PromptBuilder, RAGPipeline, first_line
from ragsieve.prompts import load_qa_prompts


class _Cfg(StrictConfig):
    top_k: int = 3
    name: str = "x"


def test_config_rejects_unknown_and_bad_keys(tmp_path):
    with pytest.raises(RagsieveError, match="unknown key 'topk'") as info:
        build_config(_Cfg, {"topk": 3}, source="c.yaml")
    assert "\n" not in str(info.value)
    with pytest.raises(RagsieveError, match="'top_k': Input should be a valid integer"):
        build_config(_Cfg, {"top_k": "many"})
    path = tmp_path / "c.yaml"
    path.write_text("top_k: 5\n")
    assert load_config(_Cfg, path).top_k == 5
    path.write_text("- a list\n")
    with pytest.raises(RagsieveError, match="expected a mapping"):
        load_config(_Cfg, path)
    path.write_text("top_k: [unclosed\n")
    with pytest.raises(RagsieveError, match="not valid YAML"):
        load_config(_Cfg, path)
    with pytest.raises(RagsieveError, match="config file not found"):
        load_config(_Cfg, tmp_path / "missing.yaml")


def test_prompt_file_unknown_key(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("system: s\nclosed_book: c\nwith_context: w\ncontext_item: i\nextra: oops\n")
    with pytest.raises(RagsieveError, match=r"unknown template key\(s\) \['extra'\]"):
        load_qa_prompts(str(path))


def test_prompt_budget_truncates_contexts_not_question(tiny_llm):
    builder = PromptBuilder(tiny_llm, max_prompt_tokens=200)
    long = Passage("p1", "the quick brown fox jumps over the lazy dog " * 200, "Fox")
    short = Passage("p2", "Paris is the capital of France.", "Paris")
    question = "Who wrote Hamlet?"
    built = builder.with_context(question, [long, short])
    assert built.truncated_contexts == 1
    assert question in built.text and "Paris is the capital of France." in built.text
    assert tiny_llm.count_tokens(tiny_llm.format_prompt(built.text, builder.prompts.system)) <= 200
    with pytest.raises(RagsieveError, match="question too long"):
        builder.with_context("fox " * 400, [short])


def test_pipeline_closed_book_and_errors(tiny_llm):
    pipe = RAGPipeline(tiny_llm, None, top_k=2, max_new_tokens=3)
    answers = pipe.answer_many(["Who wrote Hamlet?", "capital of France"], retrieve=False)
    assert [a.retrieved for a in answers] == [False, False] and all(a.contexts == [] for a in answers)
    with pytest.raises(RagsieveError, match="empty question at position 1"):
        pipe.answer_many(["ok", "   "], retrieve=False)
    with pytest.raises(RagsieveError, match="no retriever configured"):
        pipe.answer("Who wrote Hamlet?")
    with pytest.raises(RagsieveError, match="top_k must be >= 0"):  # 0: a sieve that answers closed-book
        RAGPipeline(tiny_llm, None, top_k=-1)


def test_pipeline_with_retriever_feeds_top_k(tiny_llm):
    from ragsieve.retrieve import BM25Retriever

    pool = [Passage(f"p{i}", text) for i, text in enumerate(
        ["Hamlet was written by William Shakespeare.", "Paris is the capital of France.", "Foxes are quick."])]
    pipe = RAGPipeline(tiny_llm, BM25Retriever.build(pool), top_k=1, max_new_tokens=3)
    answer = pipe.answer("Who wrote Hamlet?")
    assert answer.retrieved and [p.id for p in answer.contexts] == ["p0"]


def test_first_line():
    assert first_line("\n  Paris \nThe capital...") == "Paris"
    assert first_line("") == ""


def test_pipeline_reranks_candidates_before_top_k(tiny_llm):
    from ragsieve.rerank.base import BaseRanker
    from ragsieve.retrieve import BM25Retriever

    class _PreferFoxes(BaseRanker):
        def score(self, query, passages):
            import numpy as np

            return np.array([float("Fox" in p.text) for p in passages])

    pool = [Passage(f"p{i}", text) for i, text in enumerate(
        ["Hamlet was written by William Shakespeare.", "Hamlet is a play. Foxes are quick.", "Paris is in France."])]
    pipe = RAGPipeline(tiny_llm, BM25Retriever.build(pool), top_k=1, max_new_tokens=3,
                       reranker=_PreferFoxes(), candidates=3)
    assert [p.id for p in pipe.answer("Who wrote Hamlet?").contexts] == ["p1"]
    with pytest.raises(RagsieveError, match=r"candidates \(1\) must be >= top_k \(2\)"):
        RAGPipeline(tiny_llm, None, top_k=2, reranker=_PreferFoxes(), candidates=1)


def test_pipeline_grader_drops_irrelevant_and_falls_back_closed_book(tiny_llm):
    from ragsieve.grade.base import GradeResult
    from ragsieve.retrieve import BM25Retriever

    class _KeepParis:
        def grade(self, query, passages):
            return [GradeResult("Paris" in p.text and "capital" in query, 1.0) for p in passages]

    pool = [Passage(f"p{i}", text) for i, text in enumerate(
        ["Paris is the capital of France.", "Hamlet was written by Shakespeare.", "Paris Hilton is a person."])]
    pipe = RAGPipeline(tiny_llm, BM25Retriever.build(pool), top_k=3, max_new_tokens=3, grader=_KeepParis())
    kept, none = pipe.answer_many(["The capital: Paris or Hamlet?", "Who wrote Hamlet?"])
    assert {p.id for p in kept.contexts} == {"p0", "p2"} and kept.graded_out == 1 and not kept.all_graded_out
    assert none.contexts == [] and none.graded_out >= 1 and none.all_graded_out and none.retrieved
