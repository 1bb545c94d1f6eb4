"""The root typer app, the two consoles and the options several command groups share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional, TypeVar

import typer
from rich.console import Console

from ragsieve.errors import RagsieveError
from ragsieve.progress import results_console

T = TypeVar("T")

app = typer.Typer(
    name="ragsieve",
    help="LLM-aware post-retrieval filtering for RAG.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = results_console()  # a results table printed into a file keeps whole rows
err_console = Console(stderr=True)


@app.callback()
def _root(
    verbose: bool = typer.Option(
        False, "--verbose", help="Show third-party progress bars and warnings (model loading, ONNX export)."
    ),
) -> None:
    """LLM-aware post-retrieval filtering for RAG."""
    # applied by ragsieve.cli.main before any command runs (it reads --verbose from the arguments)

DataDirOption = typer.Option(None, "--data-dir", help="Benchmark data folder (default: $RAGSIEVE_DATA or ../shared/data).")
SkipBadOption = typer.Option(False, "--skip-bad", help="Skip malformed lines (counted) instead of failing.")
OutRowsOption = typer.Option(
    None, "--out", help="Stream results to this .jsonl as they finish; a rerun resumes (use --overwrite to restart)."
)
TimeoutOption = typer.Option(
    None, "--timeout", help="Endpoint LLMs: seconds per try (default $RAGSIEVE_LLM_TIMEOUT or 8)."
)
RetriesOption = typer.Option(None, "--retries", help="Endpoint LLMs: extra tries (default $RAGSIEVE_LLM_RETRIES or 2).")
OverwriteOption = typer.Option(False, "--overwrite", help="Replace what --out (or the output folder) already holds.")
JsonLinesOption = typer.Option(False, "--json", help="Print JSON lines instead of a table.")
# `grade` and `rerank` score the passages of one file against one query
PassagesFileOption = typer.Option(
    ..., "--passages", "-p", help=".jsonl rows {text, title?, id?} or one passage per .txt line."
)


def read_query_passages(query: str, passages: Path) -> list:
    """The passages of ``passages`` for a non-empty ``query`` (one-line errors for both)."""
    from ragsieve.data.passage_files import read_passages_file

    if not query.strip():
        raise RagsieveError("empty query")
    return read_passages_file(passages)


def parse_ks(text: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise RagsieveError(f"bad list of cut-offs '{text}'; expected e.g. 1,5,10") from None
    if not ks or ks[0] < 1:
        raise RagsieveError(f"cut-offs must be positive integers, got '{text}'")
    return ks



def stream_rows(
    items: Sequence[T],
    compute: Callable[[list[tuple[int, T]]], list[dict[str, Any]]],
    *,
    out: Optional[Path] = None,
    overwrite: bool = False,
    desc: str = "",
    batch_size: int = 32,
) -> list[dict[str, Any]]:
    """Run ``compute`` over ``(index, item)`` batches with a progress bar on stderr.

    With ``out``, every finished row is appended (fsynced) to that ``.jsonl`` at once, keyed
    by its ``index``: a killed run keeps what it did and a rerun computes only the rest.
    Returns one row per item, in input order.
    """
    from ragsieve.data.resumable import ResumableJsonl
    from ragsieve.progress import progress_bar

    store = ResumableJsonl(out, key="index", overwrite=overwrite) if out else None
    indexed = list(enumerate(items))
    todo = store.pending(indexed, key=lambda pair: pair[0]) if store else indexed
    done: dict[int, dict[str, Any]] = {}
    with progress_bar(err_console) as bar:
        task = bar.add_task(desc, total=len(indexed), completed=len(indexed) - len(todo))
        for lo in range(0, len(todo), batch_size):
            for row in compute(todo[lo : lo + batch_size]):
                if store is not None:
                    store.write(row)
                done[int(row["index"])] = row
            bar.advance(task, len(todo[lo : lo + batch_size]))
    if store is not None:
        done = {int(r["index"]): r for r in store.rows()} | done
    return [done[i] for i, _ in indexed]
