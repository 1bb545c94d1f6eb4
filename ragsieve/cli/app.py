"""The root typer app, the two consoles and the options several command groups share."""

from __future__ import annotations

import typer
from rich.console import Console

from ragsieve.errors import RagsieveError

app = typer.Typer(
    name="ragsieve",
    help="LLM-aware post-retrieval filtering for RAG.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

DataDirOption = typer.Option(None, "--data-dir", help="Benchmark data folder (default: $RAGSIEVE_DATA or ../shared/data).")
SkipBadOption = typer.Option(False, "--skip-bad", help="Skip malformed lines (counted) instead of failing.")


def parse_ks(text: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise RagsieveError(f"bad list of cut-offs '{text}'; expected e.g. 1,5,10") from None
    if not ks or ks[0] < 1:
        raise RagsieveError(f"cut-offs must be positive integers, got '{text}'")
    return ks

