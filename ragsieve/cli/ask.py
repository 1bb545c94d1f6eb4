"""``ragsieve ask``: one question through the pipeline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ragsieve.cli.app import RetriesOption, TimeoutOption, app, console, err_console
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_LLM
from ragsieve.pipeline.config import DEFAULT_PROBE


@app.command("ask")
def ask_cmd(
    ctx: typer.Context,
    question: str = typer.Argument(..., help="The question."),
    index: Optional[str] = typer.Option(
        None, "--index", "-i", help="Index folder or postgresql:// URL; needed unless --no-retrieval."
    ),
    top_k: int = typer.Option(3, "--top-k", "-k", help="Passages fed to the LLM."),
    no_retrieval: bool = typer.Option(False, "--no-retrieval", help="Answer closed-book."),
    llm: str = typer.Option(DEFAULT_LLM, help="LLM spec: embedded:..., HF id/path, or openai:<url>#<model>."),
    max_new_tokens: int = typer.Option(32, help="Answer length cap."),
    show_contexts: bool = typer.Option(False, "--show-contexts", help="Print the passages used."),
    cbdr: Optional[float] = typer.Option(None, "--cbdr", help="CBDR β: skip retrieval when Conf(Q) > β."),
    probe: str = typer.Option(DEFAULT_PROBE, "--probe", help="Probe folder or embedded:<name>, used by --cbdr."),
    reranker: Optional[str] = typer.Option(
        None, "--reranker", help="Rerank retrieved candidates: embedded:base, a cross-encoder folder, bm25, bi-encoder."
    ),
    candidates: int = typer.Option(20, "--candidates", help="Passages retrieved for the reranker to choose from."),
    grader: Optional[str] = typer.Option(
        None, "--grader", help="A saved grader folder or embedded:<name>: drop passages it grades irrelevant."
    ),
    prune: Optional[float] = typer.Option(
        None, "--prune", help="Cut each kept passage to its sentences the reranker scores >= this (raw; always its "
        "best one). With --sieve: overrides the sieve's prune threshold."
    ),
    prune_tokens: Optional[int] = typer.Option(
        None, "--prune-tokens", min=1, help="Cut the kept passages together to their best sentences within this many "
        "tokens in all (always the best one; a passage left without a sentence is dropped). With --sieve: "
        "overrides the sieve's pruning."
    ),
    sieve: Optional[Path] = typer.Option(
        None, "--sieve", help="A fitted sieve folder (`ragsieve fit`) or default: its LLM, gate (probe, β), "
        "reranker, grader, top-k, candidates and answer length, so it cannot be combined with --llm, --top-k, "
        "--candidates, --probe, --max-new-tokens, --cbdr, --reranker or --grader."
    ),
    explain: bool = typer.Option(False, "--explain", help="Print each stage's decision before the answer."),
    as_json: bool = typer.Option(False, "--json", help="Print the answer and every stage's decision as one JSON object."),
    timeout: Optional[float] = TimeoutOption,
    retries: Optional[int] = RetriesOption,
) -> None:
    """Answer a question with the LLM, with or without retrieved (and reranked, graded) passages."""
    from ragsieve.config import build_config
    from ragsieve.pipeline import PipelineConfig, RAGPipeline

    if not question.strip():
        raise RagsieveError("empty question")
    if sieve is not None:
        _refuse_what_the_sieve_sets(ctx)
    if not no_retrieval and index is None:
        raise RagsieveError("give --index DIR or URL (build one with `ragsieve index`) or use --no-retrieval")
    # Every option is checked here, before a model loads.
    config = build_config(PipelineConfig, {
        "llm": llm, "index": None if no_retrieval else str(index), "top_k": top_k, "candidates": candidates,
        "reranker": None if no_retrieval else reranker, "grader": None if no_retrieval else grader,
        "cbdr_beta": cbdr, "probe": probe, "max_new_tokens": max_new_tokens, "timeout": timeout, "retries": retries,
        "sieve": str(sieve) if sieve else None, "prune_threshold": prune, "prune_token_cap": prune_tokens,
    }, source="options")
    answer = RAGPipeline.from_config(config).answer(question, retrieve=not no_retrieval)
    if as_json:
        print(json.dumps(answer.to_dict(), ensure_ascii=False))
        return
    if explain:
        from ragsieve.pipeline.explain import print_explain

        print_explain(answer, console)
    if answer.confidence is not None and not explain:
        verdict = "retrieve" if answer.retrieved else "answer closed-book"
        err_console.print(f"[dim]Conf(Q) = {answer.confidence:.3f}, β = {answer.beta} → {verdict}[/]")
    if answer.all_graded_out:
        err_console.print(f"[yellow]all {answer.graded_out} passage(s) graded irrelevant: answered closed-book[/]")
    elif answer.graded_out:
        err_console.print(f"[dim]{answer.graded_out} passage(s) graded irrelevant and dropped[/]")
    if show_contexts:
        for i, p in enumerate(answer.contexts, 1):
            console.print(f"[dim][{i}] {p.id} {p.full_text[:200]}[/]")
    if answer.truncated_contexts:
        err_console.print(f"[yellow]{answer.truncated_contexts} passage(s) truncated to fit the prompt[/]")
    console.print(answer.answer)


#: what a sieve sets itself (``PipelineConfig.expanded``): given with --sieve, one of them would be silently replaced
SIEVE_SETS = {"llm": "--llm", "top_k": "--top-k", "candidates": "--candidates", "probe": "--probe",
              "max_new_tokens": "--max-new-tokens", "cbdr": "--cbdr", "reranker": "--reranker", "grader": "--grader"}


def _refuse_what_the_sieve_sets(ctx: typer.Context) -> None:
    # by name: typer ships its own copy of click, whose ParameterSource is not click's
    given = [flag for name, flag in SIEVE_SETS.items()
             if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT"]
    if given:
        raise RagsieveError(f"--sieve sets its own LLM, gate, reranker, grader, top-k, candidates and answer length; "
                            f"drop {', '.join(given)} (or drop --sieve)")
