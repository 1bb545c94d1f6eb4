"""What ``ragsieve ask --explain`` (and the demo) print: each stage's decision for one answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from ragsieve.pipeline.rag import RAGAnswer


def print_explain(answer: "RAGAnswer", console: "Console") -> None:
    """Each stage's decision, in pipeline order, then ``answer`` (the answer text follows on the same line)."""
    from rich.table import Table

    if answer.confidence is not None:
        side = "≤" if answer.retrieved else ">"
        verdict = "retrieve" if answer.retrieved else "answer closed-book"
        console.print(f"[bold]gate[/]  Conf(Q) = {answer.confidence:.3f} {side} β = {answer.beta:.3f} → {verdict}")
    else:
        console.print(f"[bold]gate[/]  none → {'retrieve' if answer.retrieved else 'closed-book'}")
    if answer.candidates:
        table = Table(title="candidates", show_edge=False)
        for col in ("id", "retriever rank", "rerank rank", "rerank score", "in top-k", "grader", "grade score"):
            table.add_column(col)
        rows = sorted(answer.candidates, key=lambda c: (c.rerank_rank if c.rerank_rank is not None else c.retriever_rank))
        for c in rows:
            table.add_row(
                c.id, str(c.retriever_rank + 1), "-" if c.rerank_rank is None else str(c.rerank_rank + 1),
                "-" if c.rerank_score is None else f"{c.rerank_score:.3f}", "yes" if c.selected else "",
                "-" if c.relevant is None else ("relevant" if c.relevant else "dropped"),
                "-" if c.grade_score is None else f"{c.grade_score:.3f}",
            )
        console.print(table)
        _print_sentences(answer, console)
    console.print(f"[bold]prompt[/]  {answer.prompt_tokens} tokens, {len(answer.contexts)} passage(s)")
    console.print("[bold]answer[/]", end="  ")


def _print_sentences(answer: "RAGAnswer", console: "Console") -> None:
    """Each pruned passage's sentences: kept (+) or dropped (-), with the score that decided."""
    from rich.markup import escape

    for c in answer.candidates:
        if not c.sentences:
            continue
        kept = sum(k for _, _, k in c.sentences)
        console.print(f"[bold]prune[/]  {c.id}: {kept} of {len(c.sentences)} sentence(s) kept")
        for text, score, k in c.sentences:
            mark = "[green]+[/]" if k else "[red]-[/]"
            console.print(f"  {mark} {score:7.3f}  {escape(text)}")
