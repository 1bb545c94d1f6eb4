"""``ragsieve fit``: a sieve for your LLM from your index and your questions."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ragsieve.cli.app import app, console, err_console
from ragsieve.models.specs import DEFAULT_LLM


@app.command("fit")
def fit_cmd(
    index: Path = typer.Option(..., "--index", "-i", help="Index of your corpus (`ragsieve index --passages ...`)."),
    questions: Path = typer.Option(..., "--questions", "-q", help="QA .jsonl: {question, answers: [...], id?}."),
    out: Path = typer.Option(..., "--out", "-o", help="The sieve folder to write (a rerun resumes it)."),
    llm: str = typer.Option(DEFAULT_LLM, help="A local HF causal LM (the probe reads its hidden states), or an "
                            "endpoint openai:<url>#<model> (no probe, no gate: chosen by its answers only)."),
    generator: Optional[str] = typer.Option(
        None, help="openai:<url>#<model> serving the same LLM: answers the labelling prompts (the probe stays local)."
    ),
    gate: str = typer.Option("parity", help="CBDR policy: parity | budget=<share> | none."),
    max_questions: int = typer.Option(0, help="Use only the first N questions (0 = all)."),
    top_k: int = typer.Option(3, help="Passages in the labelling prompts (the sieve's own k is chosen by answers)."),
    candidates: int = typer.Option(20, help="Passages retrieved per question for the reranker."),
    ray: Optional[str] = typer.Option(
        None, "--ray", help="Run Conf(Q+C) and the generations on Ray Data: 'local' or a cluster address."
    ),
    objective: Optional[str] = typer.Option(
        None, "--objective", help="Choose the sieve for: accuracy (default) | tokens=<mean prompt tokens budget>."
    ),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML/JSON of FitConfig fields (options win)."),
) -> None:
    """Fit a sieve to one LLM: probe, gate β, aligned reranker, then k / order / grade chosen by its answers → SIEVE."""
    from ragsieve.config import build_config, read_mapping
    from ragsieve.fit import PHASES, FitConfig, fit_sieve
    from ragsieve.studies.common import progress_bar

    values = read_mapping(config) if config else {}
    values.update({"index": str(index), "questions": str(questions), "out": str(out), "llm": llm, "gate": gate,
                   "max_questions": max_questions, "top_k": top_k, "candidates": candidates})
    values.update({k: v for k, v in (("generator", generator), ("ray", ray)) if v is not None})  # unset: the file's
    if objective is not None:
        values["select"] = {**(values.get("select") or {}), "objective": objective}
    cfg = build_config(FitConfig, values, source=str(config or "options"))  # checked before anything loads
    with progress_bar(err_console) as bar:
        tasks = {name: bar.add_task(name, total=None) for name in PHASES}

        def progress(phase: str, done: int, total: int) -> None:
            bar.update(tasks[phase], completed=done, total=total)

        sieve = fit_sieve(cfg, progress)
    test = sieve.metrics.get("test", {})
    for name, m in test.items():
        lo, hi = m["ci95"]
        console.print(f"{name:>14}: accuracy {m['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] (n={m['n']})")
    selection = sieve.metrics.get("selection", {})
    console.print(f"chosen by answers on dev: {selection.get('shipped')} (best plain: {selection.get('best_plain')})")
    if selection.get("note"):
        console.print(f"note: {selection['note']}")
    console.print(f"retrieval rate {sieve.metrics.get('retrieval_rate', 1.0):.2f}, β = {sieve.beta}; wrote {out}/sieve.json")
