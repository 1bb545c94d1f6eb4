"""Metrics as tables: a rich table for the terminal, Markdown for READMEs.

The CLI (``ragsieve rerank eval``), the benches and the studies all print and write their tables through here.
"""

from __future__ import annotations

from typing import Any, Sequence

from rich.table import Table


def metrics_table(title: str, rows: dict[str, dict[str, float]], columns: Sequence[str],
                  first: str = "reranker") -> Table:
    """A rich table of ``rows[name][column]`` floats, three decimals."""
    table = Table(title=title)
    table.add_column(first)
    for c in columns:
        table.add_column(c, justify="right")
    for name, m in rows.items():
        table.add_row(name, *(f"{m[c]:.3f}" for c in columns))
    return table


def markdown_rows(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines from cells already formatted (``None`` → empty)."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join("" if c is None else str(c) for c in row) + " |" for row in rows]
