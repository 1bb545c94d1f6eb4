"""``ragsieve fit``: a sieve for your LLM from your index and your questions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from ragsieve.cli.app import app, console, err_console
from ragsieve.models.specs import DEFAULT_LLM


@app.command("fit")
def fit_cmd(
    index: str = typer.Option(
        ..., "--index", "-i", help="Index of your corpus, a folder or postgresql:// URL (`ragsieve index --passages ...`)."
    ),
    questions: Path = typer.Option(..., "--questions", "-q", help="QA .jsonl: {question, answers: [...], id?}."),
    out: Path = typer.Option(..., "--out", "-o", help="The sieve folder to write; it is built in .OUT.partial, which "
                             "the same command resumes after a kill, and renamed to OUT when finished."),
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
        None, "--objective", help="Choose the sieve for: accuracy (default) | frugal (fewest prompt tokens "
        "among the configurations shown non-inferior to the most accurate at --margin) | tokens=<mean prompt "
        "tokens budget>."
    ),
    margin: Optional[float] = typer.Option(
        None, "--margin", help="Non-inferiority margin in accuracy (default 0.02): a cheaper configuration, or the "
        "choice over the best plain one, counts as good as it only when the 95 % interval of the difference "
        "clears -margin."),
    records: Optional[Path] = typer.Option(
        None, "--records", help="Folder of text-free records (answers by prompt digest, confidence shifts by id), "
        "kept as the fit runs and read when it starts: a fit resumes from them on another machine."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML/JSON of FitConfig fields (options win)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Fit again over a finished sieve in --out."),
) -> None:
    """Fit a sieve to one LLM: probe, gate β, aligned reranker, then k / order / grade chosen by its answers → SIEVE."""
    from ragsieve.atomic import resumable_directory
    from ragsieve.checks import output_dir
    from ragsieve.config import build_config, read_mapping
    from ragsieve.fit import PHASES, FitConfig, fit_sieve
    from ragsieve.fit.run import check_fit_questions
    from ragsieve.progress import progress_bar

    values = read_mapping(config) if config else {}
    values.update({"index": str(index), "questions": str(questions), "out": str(out), "llm": llm, "gate": gate,
                   "max_questions": max_questions, "top_k": top_k, "candidates": candidates})
    values.update({k: v for k, v in (("generator", generator), ("ray", ray), ("records", records and str(records)))
                   if v is not None})  # unset: the file's
    for key, value in (("objective", objective), ("margin", margin)):
        if value is not None:
            values["select"] = {**(values.get("select") or {}), key: value}
    cfg = build_config(FitConfig, values, source=str(config or "options"))  # checked before anything loads
    output_dir(out, overwrite=overwrite)
    check_fit_questions(cfg)  # too few questions: one line, before any phase
    with resumable_directory(out, overwrite=overwrite, exists_hint="pass --overwrite to fit it again") as work:
        with progress_bar(err_console) as bar:
            tasks = {name: bar.add_task(f"fit {name}", total=None) for name in PHASES}
            finished: set[str] = set()
            started: list[str] = []
            t0 = time.perf_counter()

            def starting(phase: str) -> None:
                """A phase begins: every earlier one has ended (some report only their end, a skipped one
                nothing), and this one's clock starts now, not when the phase before it first said "done"."""
                if not started:  # said once loading worked, so a bad input stays the only line on stderr
                    started.append(phase)
                    bar.note(f"fit: questions, index and {cfg.llm} loaded in {time.perf_counter() - t0:.0f}s; "
                             f"phases: {', '.join(PHASES)}")
                for earlier in list(PHASES)[: list(PHASES).index(phase)]:
                    if earlier not in finished:
                        finished.add(earlier)
                        bar.update(tasks[earlier], completed=1, total=1)
                bar.start_task(tasks[phase])

            def progress(phase: str, done: int, total: int) -> None:
                bar.update(tasks[phase], completed=done, total=total)
                if done >= total:
                    finished.add(phase)

            sieve = fit_sieve(cfg.model_copy(update={"out": str(work)}), progress, starting)
    _print_decision(sieve.metrics, out, sieve.beta)


def _print_decision(metrics: dict, out: Path, beta) -> None:
    """The held-out accuracies, the choice and whether the evidence decided it, in a few lines."""
    if metrics.get("estimated_on"):
        console.print(f"held-out accuracy, {metrics['estimated_on']}:")
    for name, m in metrics.get("test", {}).items():
        lo, hi = m["ci95"]
        console.print(f"{name:>14}: accuracy {m['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] (n={m['n']})")
    selection = metrics.get("selection", {})
    _print_frontier(selection)
    console.print(f"chosen by answers: {selection.get('chosen')} (best plain: {selection.get('best_plain')}); "
                  f"shipped: {selection.get('shipped')}")
    harm = metrics.get("do_no_harm", {})
    versus = harm.get("chosen_vs_best_plain")
    if versus:
        lo, hi = versus["ci95"]
        console.print(f"held out, chosen - best plain: {versus['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}] "
                      f"(n={versus['n']}, McNemar p = {versus['p_value']:.3g})")
    if harm.get("reason"):
        console.print(("" if harm.get("decided") else "not decided by the evidence: ") + harm["reason"])
    if power := harm.get("power"):
        console.print(f"these {power['n']} questions detect differences of about "
                      f"{100 * power['detectable_difference']:.1f} points (80 % power); the margin is "
                      f"{100 * harm['margin']:g} points" + ("" if power["enough"] else
                      f": about {power['questions_for_margin']} questions would show it"))
    console.print(f"retrieval rate {metrics.get('retrieval_rate', 1.0):.2f}, β = {beta}; wrote {out}/sieve.json")


def _print_frontier(selection: dict) -> None:
    """The grid's accuracy-against-prompt-tokens frontier on the held-out questions: what each token buys."""
    from rich.table import Table

    rows = sorted((r for r in selection.get("grid", []) if r.get("frontier_tokens")), key=lambda r: r["prompt_tokens"])
    if not rows:
        return
    n_held = selection.get("n_held_out") or selection.get("n_dev") or max(r["n"] for r in rows)
    table = Table(title=f"frontier on dev + test (n={n_held}, {selection.get('n_configurations', len(rows))} "
                        "configurations; all in sieve.json, plotted in frontier.png)",
                  caption="* dropped by the race: its estimate is on the first n questions only")
    for column in ("configuration", "accuracy", "95 % CI", "prompt tokens", "LLM s / question"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for r in rows:
        lo, hi = r["ci95"]
        raced = f" * (n={r['raced_out_after']})" if r.get("raced_out_after") is not None else ""
        table.add_row(r["name"] + raced, f"{r['accuracy']:.3f}", f"[{lo:.3f}, {hi:.3f}]", f"{r['prompt_tokens']:.0f}",
                      f"{r['llm_seconds']:.2f}")
    console.print(table)
