"""``ragsieve grade QUERY`` and ``ragsieve grader data|train|eval``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ragsieve.cli.app import (
    JsonLinesOption, OutRowsOption, OverwriteOption, PassagesFileOption, RetriesOption, TimeoutOption, app, console,
    err_console, read_query_passages, stream_rows,
)
from ragsieve.errors import DataError, RagsieveError


# The shipped default grader (issue #12); a folder path works everywhere a spec does.
DEFAULT_GRADER = "embedded:default"

grader_app = typer.Typer(help="Lightweight relevance grader: build data, train, evaluate.", no_args_is_help=True)
app.add_typer(grader_app, name="grader")


@app.command("grade")
def grade_cmd(
    query: str = typer.Argument(..., help="The query the passages were retrieved for."),
    passages: Path = PassagesFileOption,
    grader: str = typer.Option(DEFAULT_GRADER, "--grader", "-g", help="A saved grader folder or embedded:<name>."),
    base: Optional[str] = typer.Option(None, "--base", help="Refuse the grader unless it was trained on this model."),
    as_json: bool = JsonLinesOption,
    out: Optional[Path] = OutRowsOption,
    overwrite: bool = OverwriteOption,
) -> None:
    """Grade each passage relevant or not for QUERY (a progress bar; --out streams and resumes)."""
    from ragsieve.registry import load_grader

    items = read_query_passages(query, passages)
    model = load_grader(grader, base=base)

    def grade_batch(batch):
        verdicts = model.grade(query, [p for _, p in batch])
        return [{"index": i, "id": p.id, "relevant": v.relevant, "score": v.score} for (i, p), v in zip(batch, verdicts)]

    rows = stream_rows(items, grade_batch, out=out, overwrite=overwrite, desc="grading", batch_size=16)
    if as_json:
        for row in rows:
            print(json.dumps({k: row[k] for k in ("id", "relevant", "score")}, ensure_ascii=False))
    else:
        table = Table(title=f"{query}  ({model.config.kind} grader, threshold {model.threshold:.3g})")
        for col in ("id", "relevant", "score", "passage"):
            table.add_column(col)
        for p, row in zip(items, rows):
            table.add_row(p.id, "yes" if row["relevant"] else "no", f"{row['score']:.3f}", p.full_text[:120])
        console.print(table)
    _report_inputs(model.stats)


def _report_inputs(stats) -> None:
    if stats.empty_passages:
        err_console.print(f"[yellow]{stats.empty_passages} empty passage(s) graded not relevant[/]")
    if stats.truncated_passages:
        err_console.print(f"[yellow]{stats.truncated_passages} passage(s) truncated to the grader's budget[/]")


@grader_app.command("data")
def data_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the labelled pairs (.jsonl)."),
    sources: str = typer.Option("nq-oracle,bioasq,fever,hotpotqa-distractor", help="Comma-separated datasets."),
    queries_per_source: int = typer.Option(75, help="Queries per dataset (0 = all)."),
    top_k: int = typer.Option(5, "-k", help="Retrieved passages per query."),
    retriever: str = typer.Option("dense", help="bm25 | dense | hybrid"),
    judge: Optional[str] = typer.Option(None, help="Label with this LLM judge (local spec or openai:<url>#<model>)."),
    judge_store: Optional[Path] = typer.Option(None, help="Judge answers store (default: OUT with .judge.jsonl)."),
    timeout: Optional[float] = TimeoutOption,
    retries: Optional[int] = RetriesOption,
    test_fraction: float = typer.Option(0.2, help="Share of queries held out."),
    seed: int = typer.Option(0, help="Query selection and split seed."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Benchmark data folder."),
) -> None:
    """Build the grading dataset: top-k retrieved passages per query, labelled, split by query."""
    from ragsieve.grade.dataset import (
        GradingDataConfig, apply_judge_labels, assign_splits, build_grading_pairs, label_skew, write_grading_pairs,
    )

    config = GradingDataConfig(
        sources=[s.strip() for s in sources.split(",") if s.strip()], queries_per_source=queries_per_source,
        top_k=top_k, retriever=retriever, test_fraction=test_fraction, seed=seed,
        data_dir=str(data_dir) if data_dir else None,
    )
    pairs = build_grading_pairs(config, progress=lambda msg: err_console.print(f"[dim]{msg}[/]"))
    if judge:
        from ragsieve.grade.judge import LLMJudge
        from ragsieve.models import load_llm

        store = judge_store or out.with_suffix(".judge.jsonl")
        report = LLMJudge(load_llm(judge, timeout=timeout, retries=retries), store).label(pairs)
        pairs, dropped = apply_judge_labels(pairs, report.labels)
        err_console.print(f"judge: {report.summary()}; {dropped} unparseable pair(s) dropped")
    pairs = assign_splits(pairs, test_fraction, seed)
    write_grading_pairs(out, pairs)
    skew = label_skew(pairs)
    console.print(
        f"{skew['pairs']} pairs ({skew['positive_rate']:.1%} relevant) from {skew['queries']} queries → {out}"
    )


@grader_app.command("train")
def train_cmd(
    pairs: Path = typer.Option(..., "--pairs", help="Labelled pairs .jsonl: {query, passage, label, split?}."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to save the trained grader in."),
    kind: str = typer.Option(
        "classifier", help="prompted | generative | head | classifier | lora | cosine | cross-encoder"
    ),
    base: Optional[str] = typer.Option(
        None, help="Base model (LLM spec; encoder for cosine; folder for cross-encoder)."
    ),
    split: str = typer.Option("train", help="Rows of this split (all rows if the file has no splits)."),
    lr: float = typer.Option(2e-5, help="Peak learning rate (cosine decay to 10%)."),
    epochs: float = typer.Option(1.0, help="Epochs over the (resampled) pairs."),
    max_steps: int = typer.Option(0, help="Stop after this many steps (0 = epochs decide)."),
    batch_size: int = typer.Option(8, help="Pairs per step."),
    loss: str = typer.Option("cross_entropy", help="cross_entropy | contrastive"),
    sampling: str = typer.Option("none", help="none | oversample | undersample"),
    lora_r: Optional[int] = typer.Option(None, help="LoRA rank (kind lora)."),
    lora_alpha: Optional[int] = typer.Option(None, help="LoRA alpha (kind lora)."),
    max_length: int = typer.Option(512, help="Prompt token budget."),
    max_passage_tokens: int = typer.Option(192, help="Passage token budget (longer ones are truncated, counted)."),
    overwrite: bool = OverwriteOption,
) -> None:
    """Train a grader on labelled pairs and save it."""
    from ragsieve.atomic import atomic_directory
    from ragsieve.checks import output_dir
    from ragsieve.config import build_config
    from ragsieve.registry import grader_class, new_grader
    from ragsieve.grade.lm import LMGrader
    from ragsieve.grade.train import GraderTrainConfig

    train_config = build_config(
        GraderTrainConfig,
        {"lr": lr, "epochs": epochs, "max_steps": max_steps, "batch_size": batch_size, "loss": loss,
         "sampling": sampling},
        "train options",
    )
    lm_kind = issubclass(grader_class(kind), LMGrader)  # an unknown kind is refused here
    output_dir(out, overwrite=overwrite)  # options first, then the output; before any pair is read or model loads
    rows = _read_split(pairs, split)
    options: dict = {"lora_r": lora_r, "lora_alpha": lora_alpha}
    if lm_kind:  # token budgets mean nothing to the cosine / cross-encoder
        options.update(max_length=max_length, max_passage_tokens=max_passage_tokens)
    grader = new_grader(kind, base, **options)
    if kind != "prompted":  # the baseline is saved as is: nothing to train
        from ragsieve.progress import progress_bar

        with progress_bar(err_console) as bar:  # LM graders report their optimiser steps; the others fit at once
            task = bar.add_task(f"training the {kind} grader", total=None)

            def show(step: int, steps: int, loss: float) -> None:
                bar.update(task, completed=step, total=steps)

            grader.fit([p.query for p in rows], [p.passage for p in rows], [p.label for p in rows], train_config,
                       progress=show)
    with atomic_directory(out, overwrite=overwrite, exists_hint="pass --overwrite to replace it") as building:
        grader.save(building)
    trained = grader.config.trained
    summary = {k: trained.get(k) for k in ("steps", "first_loss", "final_loss", "seconds") if k in trained}
    console.print(f"{kind} grader on {len(rows)} pairs → {out} {summary if summary else ''}")
    _report_inputs(grader.stats)


@grader_app.command("eval")
def eval_cmd(
    grader: str = typer.Option(DEFAULT_GRADER, "--grader", "-g", help="A saved grader folder or embedded:<name>."),
    pairs: Path = typer.Option(..., "--pairs", help="Labelled pairs .jsonl."),
    split: str = typer.Option("test", help="Rows of this split (all rows if the file has no splits)."),
    out: Optional[Path] = typer.Option(None, help="Also write the metrics JSON here."),
    confusion: Optional[Path] = typer.Option(None, help="Also draw the confusion matrix PNG here."),
) -> None:
    """Accuracy, precision, recall, F1 (and AUROC) of a saved grader on labelled pairs."""
    from ragsieve.eval.classification import classification_metrics, plot_confusion_matrix
    from ragsieve.registry import load_grader

    rows = _read_split(pairs, split)
    model = load_grader(grader)
    predicted, scores = model.predict([p.query for p in rows], [p.passage for p in rows])
    metrics = classification_metrics([p.label for p in rows], predicted, scores)
    metrics["threshold"] = model.threshold
    # Per source: a grader on mixed benchmarks can score well overall by learning each
    # source's base rate; within-source AUROC shows whether it ranks pairs at all.
    sources = sorted({p.source for p in rows if p.source})
    if len(sources) > 1:
        import numpy as np

        labels, predicted, scores = np.array([p.label for p in rows]), np.asarray(predicted), np.asarray(scores)
        metrics["by_source"] = {}
        for src in sources:
            mask = np.array([p.source == src for p in rows])
            metrics["by_source"][src] = classification_metrics(labels[mask], predicted[mask], scores[mask])
    if confusion:
        plot_confusion_matrix(metrics["confusion_matrix"], confusion, f"{model.config.kind} grader (n={len(rows)})")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps({k: metrics[k] for k in ("n", "accuracy", "precision", "recall", "f1", "auroc", "threshold")}))
    for src, m in metrics.get("by_source", {}).items():
        print(json.dumps({"source": src, **{k: m[k] for k in ("n", "base_rate", "positive_rate", "f1", "auroc")}}))
    _report_inputs(model.stats)


def _read_split(path: Path, split: str) -> list:
    from ragsieve.grade.dataset import read_grading_pairs

    rows = read_grading_pairs(path)
    if any(p.split for p in rows):
        rows = [p for p in rows if p.split == split]
        if not rows:
            raise DataError(f"{path}: no rows in split '{split}'")
    return rows
