"""``ragsieve feedback add FILE --store DIR``: append live feedback to an evolve store.

Example::

    ragsieve feedback add feedback.jsonl --store state/fever   # {query, document, label} or {query, chosen, rejected}
    ragsieve evolve step --store state/fever                 # trains it as a full-feedback round
    ragsieve feedback add feedback.jsonl --store postgresql://rs@db/feedback   # a PostgreSQL store's rows
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ragsieve.cli.app import app, console

feedback_app = typer.Typer(
    help="Live feedback for the evolving reranker (what /v1/feedback receives).", no_args_is_help=True
)
app.add_typer(feedback_app, name="feedback")


@feedback_app.command("add")
def add_cmd(
    file: Path = typer.Argument(
        ..., help="jsonl rows {query, document, label, source?} or {query, chosen, rejected, source?}."
    ),
    store: str = typer.Option(
        ..., "--store", help="Evolve store directory, or the postgresql:// URL of a PostgreSQL store's rows."),
    db: Optional[str] = typer.Option(
        None, "--db", envvar="RAGSIEVE_FEEDBACK_DB", show_envvar=True,
        help="PostgreSQL URL holding the --store folder's rows (as `evolve init --db`; usually recorded in it)."),
) -> None:
    """Append the rows in one transaction; `ragsieve evolve step` turns them into the next round."""
    from ragsieve.evolve.live import append_feedback, pending_feedback, read_feedback_file
    from ragsieve.evolve_db import locate_store

    store = locate_store(store, db)
    written = append_feedback(store, read_feedback_file(file))
    console.print(f"stored {written} feedback row(s); {pending_feedback(store)} waiting for the next `evolve step`")
