"""Data commands: ``datasets``, ``index``, ``retrieve``, ``eval-retrieval``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ragsieve.cli.app import (
    DataDirOption, JsonLinesOption, OverwriteOption, SkipBadOption, app, console, err_console, parse_ks,
)
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER

from rich.table import Table


@app.command("datasets")
def datasets_cmd(data_dir: Optional[Path] = DataDirOption) -> None:
    """List the benchmark datasets with their sizes and licences."""
    from ragsieve.data import available_datasets, load_dataset
    from ragsieve.data.loaders import DATASET_LICENCES

    table = Table(title="datasets")
    for col in ("name", "questions", "pool passages", "judgments", "pairs", "licence"):
        table.add_column(col)
    for name in available_datasets():
        ds = load_dataset(name, data_dir=data_dir)
        table.add_row(name, str(len(ds.questions)), str(len(ds.passages)), str(len(ds.judgments)),
                      str(len(ds.pairs)), DATASET_LICENCES.get(name, "?"))
    console.print(table)


_ENCODER_BACKEND_HELP = ("Where passages encode: torch | torch-bf16 | onnx | openvino-bf16 (default: openvino-bf16 on "
                         "a CPU with bf16 units, else torch). Recorded in the index; queries encode on it too.")
_RAY_HELP = ("Encode on Ray Data actors (one model copy each): 'local' or a cluster address. A killed build keeps "
             "its finished shards and encodes only the rest when run again.")


@app.command("index")
def index_cmd(
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Index directory to create (or to extend with --add)."),
    store: Optional[str] = typer.Option(
        None, "--store", help="Instead of --out: a dense index in PostgreSQL with pgvector, "
        "postgresql://USER@HOST:PORT/DB[?table=NAME] (table default ragsieve_passages)."
    ),
    passages: Optional[list[Path]] = typer.Option(
        None, "--passages", "-p", help="Your corpus: .jsonl {id?, text, title?, metadata?}, .txt/.md, or a folder "
        "of them (repeat for several)."
    ),
    add: bool = typer.Option(False, "--add", help="Append --passages to the existing index (only they are encoded)."),
    chunk_tokens: int = typer.Option(200, help="Tokens per chunk of your documents (0 = keep documents whole)."),
    overlap_tokens: int = typer.Option(40, help="Tokens shared by neighbouring chunks."),
    dataset: str = typer.Option("nq-oracle", help="Without --passages: the benchmark whose passage pool is indexed."),
    kind: Optional[str] = typer.Option(None, help="bm25 | dense | hybrid (default hybrid; dense with --store)."),
    encoder: str = typer.Option(DEFAULT_ENCODER, help="Bi-encoder spec for dense/hybrid."),
    encoder_backend: Optional[str] = typer.Option(None, "--encoder-backend", help=_ENCODER_BACKEND_HELP),
    ray: Optional[str] = typer.Option(None, "--ray", help=_RAY_HELP),
    shard_size: int = typer.Option(1000, "--shard-size", min=1, help="With --ray: passages per shard."),
    data_dir: Optional[Path] = DataDirOption,
    skip_bad: bool = SkipBadOption,
    overwrite: bool = OverwriteOption,
) -> None:
    """Build a retrieval index over your files (--passages) or a benchmark's passage pool."""
    from ragsieve.checks import existing_dir, output_dir
    from ragsieve.config import build_config
    from ragsieve.data import load_dataset
    from ragsieve.models.encoder import index_encoder_backend
    from ragsieve.retrieve import ChunkConfig, add_to_index, build_index, read_corpus
    from ragsieve.retrieve.pgvector import StoreURL, check_store_target, is_store_url

    if (out is None) == (store is None):
        raise RagsieveError("give --out DIR (an index folder) or --store postgresql://... (an index in PostgreSQL)")
    if store is not None and not is_store_url(store):
        raise RagsieveError(f"--store {store}: expected a postgresql://USER@HOST:PORT/DB URL")
    kind = kind or ("dense" if store else "hybrid")
    if kind not in ("bm25", "dense", "hybrid"):
        raise RagsieveError(f"unknown index kind '{kind}'; known: bm25, dense, hybrid")
    if store and kind != "dense":
        raise RagsieveError(f"--store holds a dense index only (got --kind {kind}); BM25 and hybrid indexes are folders")
    # what the messages name: the folder, or the server and table without the URL's password
    target = StoreURL.parse(store).where if store else str(out)
    chunking = build_config(ChunkConfig, {"chunk_tokens": chunk_tokens, "overlap_tokens": overlap_tokens,
                                          "tokenizer": encoder}, source="options")
    if encoder_backend is not None and add:
        raise RagsieveError("--add encodes on the backend that built the index: drop --encoder-backend")
    ray_options = {"ray": ray, "ray_shard_size": shard_size} if ray else {}
    backend = None if add or kind == "bm25" else index_encoder_backend(encoder_backend, encoder)  # refused early
    encoding = f" (encoder on {backend}{', on Ray ' + ray if ray else ''})" if backend else ""
    def phase(text: str) -> None:
        # one plain line per phase on stderr, once the inputs are read (an error stays the only line);
        # encoding adds its own progress lines
        err_console.print(f"index: {text}", markup=False, highlight=False)

    if add:
        if not passages:
            raise RagsieveError("--add appends --passages to an index: give the files to add")
        if out is not None:
            existing_dir(out, "index")
        items = read_corpus(passages, chunking)
        if store:
            check_store_target(store, adding=items)
        phase(f"adding {len(items)} passages to {target}{' (on Ray ' + ray + ')' if ray else ''}")
        add_to_index(store or out, items, show_progress=True, **ray_options)
        console.print(f"added {len(items)} passages → {target}")
        return
    if out is not None:
        output_dir(out, overwrite=overwrite)  # refused before anything is read or encoded
    else:
        check_store_target(store, overwrite=overwrite)  # the server, pgvector and the table, likewise
    if passages:
        items = read_corpus(passages, chunking)
        phase(f"building a {kind} index over {len(items)} passages{encoding}")
        build_index(items, store or out, kind=kind, encoder_spec=encoder, overwrite=overwrite,
                    **_encoding_options(kind, backend, ray_options))
        console.print(f"indexed {len(items)} passages from {len(passages)} path(s) ({kind}) → {target}")
        return
    ds = load_dataset(dataset, data_dir=data_dir, skip_bad=skip_bad)
    if not ds.passages:
        raise RagsieveError(f"dataset '{dataset}' has no passage pool to index")
    if ds.skipped_lines:
        err_console.print(f"[yellow]skipped {ds.skipped_lines} malformed line(s)[/]")
    phase(f"building a {kind} index over {len(ds.passages)} passages of {dataset}{encoding}")
    build_index(ds.passages, store or out, kind=kind, encoder_spec=encoder, overwrite=overwrite,
                **_encoding_options(kind, backend, ray_options))
    console.print(f"indexed {len(ds.passages)} passages of {dataset} ({kind}) → {target}")


def _encoding_options(kind: str, backend: str | None, ray_options: dict) -> dict:
    """The build options saying where passages encode (none for BM25, which encodes nothing)."""
    return {} if kind == "bm25" else {"encoder_backend": backend, **ray_options}


@app.command("retrieve")
def retrieve_cmd(
    query: str = typer.Argument(..., help="The query text."),
    index: str = typer.Option(..., "--index", "-i", help="Index folder or postgresql:// URL (ragsieve index)."),
    k: int = typer.Option(5, "-k", help="How many passages."),
    as_json: bool = JsonLinesOption,
) -> None:
    """Retrieve the top-k passages for a query."""
    from ragsieve.retrieve import load_index

    hits = load_index(index).search(query, k=k)
    if as_json:
        for h in hits:
            print(json.dumps({"rank": h.rank, "score": h.score, "id": h.passage.id, "title": h.passage.title,
                              "text": h.passage.text}, ensure_ascii=False))
        return
    table = Table(title=query)
    for col in ("rank", "score", "id", "passage"):
        table.add_column(col)
    for h in hits:
        table.add_row(str(h.rank + 1), f"{h.score:.4f}", h.passage.id, h.passage.full_text[:160])
    console.print(table)


@app.command("eval-retrieval")
def eval_retrieval_cmd(
    dataset: str = typer.Option("nq-oracle", help="A dataset with gold passages (nq-oracle, bioasq, fever, ...)."),
    kinds: str = typer.Option("bm25,dense,hybrid", help="Comma-separated retriever kinds."),
    ks: str = typer.Option("1,5,10,20", "--ks", help="Recall cut-offs."),
    n_questions: int = typer.Option(500, help="Held-out questions to evaluate (0 = all)."),
    encoder: str = typer.Option(DEFAULT_ENCODER, help="Bi-encoder spec for dense/hybrid."),
    out: Optional[Path] = typer.Option(None, help="Write the metrics as JSON here."),
    data_dir: Optional[Path] = DataDirOption,
    seed: int = typer.Option(0, help="Split seed (held-out = the 'test' split by id)."),
) -> None:
    """Compare BM25, dense and hybrid retrieval on held-out questions: recall@k and MRR@10."""
    from ragsieve.retrieve.evaluation import evaluate_retrievers

    results = evaluate_retrievers(
        dataset, kinds=[k.strip() for k in kinds.split(",") if k.strip()], ks=parse_ks(ks),
        n_questions=n_questions, encoder_spec=encoder, data_dir=data_dir, seed=seed,
    )
    table = Table(title=f"{dataset}: {results['n_questions']} held-out questions, {results['n_passages']} passages")
    metric_names = list(next(iter(results["metrics"].values())).keys())
    table.add_column("retriever")
    for name in metric_names:
        table.add_column(name, justify="right")
    for kind, m in results["metrics"].items():
        table.add_row(kind, *(f"{m[n]:.3f}" for n in metric_names))
    console.print(table)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        console.print(f"wrote {out}")

