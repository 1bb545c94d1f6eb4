"""What every study shares: the baseline rankers, atomic JSON and the CBDR plot (and the progress bar).

Library code reports progress through callbacks; only studies and the CLI draw bars, with
:func:`ragsieve.progress.progress_bar` (re-exported here for the studies that import it from here).
Result tables come from the library (:mod:`ragsieve.eval.tables`): the CLI prints them too.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragsieve.progress import progress_bar  # noqa: F401 - the studies' progress bar, one home

if TYPE_CHECKING:
    from ragsieve.rerank.base import BaseRanker


def baseline_rankers(encoder: str | None = None) -> dict[str, "BaseRanker"]:
    """The two rankers every reranking table compares against: BM25 and MiniLM cosine."""
    from ragsieve.models.specs import DEFAULT_ENCODER
    from ragsieve.rerank.lexical import BM25Ranker
    from ragsieve.rerank.neural import BiEncoderRanker

    return {"bm25": BM25Ranker(), "bi-encoder": BiEncoderRanker(encoder or DEFAULT_ENCODER)}


def write_json(path: Path, data: Any, indent: int = 1) -> None:
    """Atomic: a reader (or a rerun after a kill) never sees half a file."""
    from ragsieve.atomic import write_json_atomic

    write_json_atomic(path, data, indent)


def plot_sweep(sweep: list[dict], path: Path, closed_book_accuracy: float, oracle: dict | None = None) -> None:
    """CBDR accuracy vs retrieval rate, one line per top-k, β annotated.

    Rows with ``ci95`` (Table 3 rows) get error bars, rows with ``random`` a dashed line of the
    random gate's expected accuracy at the same rates; ``oracle`` ({"top1": {rr, accuracy}, ...})
    adds the oracle gate's point per top-k.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for k in sorted({r["top_k"] for r in sweep}):
        rows = sorted((r for r in sweep if r["top_k"] == k), key=lambda r: r["rr"])
        x, y = [r["rr"] * 100 for r in rows], [r["accuracy"] * 100 for r in rows]
        if all("ci95" in r for r in rows):
            err = [[(r["accuracy"] - r["ci95"][0]) * 100 for r in rows],
                   [(r["ci95"][1] - r["accuracy"]) * 100 for r in rows]]
            line = ax.errorbar(x, y, yerr=err, marker="o", capsize=2, label=f"top-{k}")[0]
        else:
            line = ax.plot(x, y, marker="o", label=f"top-{k}")[0]
        if all("random" in r for r in rows):
            ax.plot(x, [r["random"]["expected_accuracy"] * 100 for r in rows], linestyle="--",
                    color=line.get_color(), alpha=0.7, label=f"top-{k}, random gate")
        if oracle and f"top{k}" in oracle:
            o = oracle[f"top{k}"]
            ax.plot([o["rr"] * 100], [o["accuracy"] * 100], marker="*", markersize=11, linestyle="none",
                    color=line.get_color(), label=f"top-{k}, oracle gate")
        for r in rows:
            ax.annotate(f"{r['beta']:.2g}", (r["rr"] * 100, r["accuracy"] * 100), fontsize=7,
                        textcoords="offset points", xytext=(3, 3))
    ax.axhline(closed_book_accuracy * 100, color="grey", linestyle=":", label="closed-book")
    ax.set_xlabel("retrieval rate RR (%)")
    ax.set_ylabel("accuracy (answer containment, %)")
    ax.set_title("CBDR: accuracy vs retrieval rate (labels: β)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
