"""``ragsieve evolve ...``: drive a deployed, evolving reranker store (see :mod:`ragsieve.evolve.store`).

Example::

    ragsieve evolve init --store state/mine --examples labels.jsonl --test-size 100   # rows {query, passage, label}
    ragsieve evolve init --store state/fever --dataset fever --judge reranker:bi-encoder   # a benchmark simulation
    ragsieve evolve step --store state/fever          # round 0 (M0), then one round per call
    ragsieve evolve feedback gold.jsonl --store state/fever    # {id, label}: gold labels of queued examples
    ragsieve evolve status --store state/fever
    ragsieve evolve init --store state/shared --db postgresql://rs@db/feedback --examples labels.jsonl
    ragsieve evolve step --store state/shared        # the folder remembers its database (evolve.database)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ragsieve.cli.app import OverwriteOption, app, console, err_console
from ragsieve.models.specs import DEFAULT_LLM

evolve_app = typer.Typer(help="Evolving LLM reranker: a deployment store advanced round by round.", no_args_is_help=True)
app.add_typer(evolve_app, name="evolve")

StoreOption = typer.Option(
    ..., "--store", help="Store directory (adapters/, and evolve.sqlite unless --db); for feedback, ingest and "
                         "status also the postgresql:// URL of a PostgreSQL store's rows.")
DbOption = typer.Option(
    None, "--db", envvar="RAGSIEVE_FEEDBACK_DB", show_envvar=True,
    help="PostgreSQL URL (postgresql://user@host:port/db) holding the store's rows instead of evolve.sqlite; "
         "`init` records it in the folder, so later commands need only --store.")


def _location(store: str | Path, db: Optional[str]):
    from ragsieve.evolve_db import locate_store

    return locate_store(store, db)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


@evolve_app.command("init")
def init_cmd(
    store: str = StoreOption,
    examples: Optional[Path] = typer.Option(
        None, "--examples",
        help="Your labelled rows, jsonl {query, passage, label} (+ id, query_id, extra template fields): "
             "they train M0."),
    template: Optional[str] = typer.Option(
        None, "--template",
        help="Verdict template for --examples: 'relevance' (default), another packaged name, or your YAML file."),
    test_size: int = typer.Option(
        0, "--test-size", help="Examples of whole queries held out as the store's test split (scored every round)."),
    dataset: Optional[str] = typer.Option(
        None, help="Instead of --examples: a benchmark simulated as the incoming stream (its template too)."),
    llm: str = typer.Option(DEFAULT_LLM, help="Local causal LM spec of the reranker."),
    initial_size: int = typer.Option(128, help="--dataset: labelled SFT examples (round 0)."),
    round_size: int = typer.Option(64, help="--dataset: examples per later round."),
    rounds: int = typer.Option(4, help="--dataset: queued rounds."),
    judge: Optional[list[str]] = typer.Option(None, "--judge", help="Judge spec kind:model (repeatable)."),
    tau: float = typer.Option(0.9, help="CautiousDPO confidence gate."),
    balance: bool = typer.Option(
        True, "--balance/--no-balance",
        help="CautiousDPO: keep accepted labels in the gold label prior (collapse guard; on by default, "
             "see results/evolve: without it BioASQ collapsed to one verdict at every tau)."),
    judge_check: bool = typer.Option(
        True, "--judge-check/--no-judge-check",
        help="Before a CautiousDPO round, drop every labeller whose accuracy on the labelled feedback "
             "does not clear chance (Wilson 95 %); with none left the round is skipped."),
    alpha: float = typer.Option(0.7, help="Share of new pairs in a round's training set (replay)."),
    max_prompt_tokens: int = typer.Option(320, help="Prompt budget; the passage field is cut to fit."),
    config: Optional[Path] = typer.Option(None, help="YAML/JSON EvolveStoreConfig (overrides the options)."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Benchmark data folder."),
    overwrite: bool = OverwriteOption,
    db: Optional[str] = DbOption,
) -> None:
    """Create a store from your labelled rows (--examples) or a benchmark (--dataset, a simulation)."""
    from ragsieve.atomic import atomic_directory
    from ragsieve.checks import non_negative_int, output_dir, positive_int, unit_interval
    from ragsieve.config import build_config, read_mapping
    from ragsieve.errors import RagsieveError

    from ragsieve.evolve_db import is_database_url

    # every value is checked before the store folder exists
    if is_database_url(store):
        raise RagsieveError("--store is the store's folder (its adapters go there); give the database with --db")
    store = Path(store)
    if (examples is None) == (dataset is None):
        raise RagsieveError("give either --examples (your labelled rows) or --dataset (a benchmark simulation)")
    if template is not None and dataset is not None:
        raise RagsieveError("--template goes with --examples; a --dataset brings its own template")
    positive_int(initial_size, "--initial-size")
    positive_int(round_size, "--round-size")
    non_negative_int(rounds, "--rounds")
    non_negative_int(test_size, "--test-size")
    unit_interval(tau, "--tau")
    unit_interval(alpha, "--alpha")
    output_dir(store, overwrite=overwrite)
    if db is not None:
        _location(store, db)  # a malformed URL fails before anything is built
    from ragsieve.evolve.methods import MethodConfig
    from ragsieve.evolve.store import EvolveStoreConfig, init_store_from_dataset, init_store_from_examples
    from ragsieve.prompts.verdicts import GENERIC_TEMPLATE, resolve_template, template_mapping

    data = {
        "llm": llm, "template": dataset, "max_prompt_tokens": max_prompt_tokens, "judge_check": judge_check,
        "method": MethodConfig(kind="cautious-dpo", alpha=alpha, tau=tau, balance=balance).model_dump(),
        "feedback_method": MethodConfig(kind="replay-dpo", alpha=alpha).model_dump(),
        "judges": list(judge or []),
    }
    if examples is not None:
        chosen = resolve_template(template or GENERIC_TEMPLATE)
        data["template"] = chosen.name
        if template is not None and Path(template).is_file():  # a user's file is saved whole in the store
            data["template_spec"] = template_mapping(chosen)
    if config is not None:
        data.update(read_mapping(config))
    cfg = build_config(EvolveStoreConfig, data, source=str(config or "evolve init"))
    if cfg.template_spec:
        _check_label_words(cfg)
    with atomic_directory(store, overwrite=overwrite, exists_hint="pass --overwrite to replace it") as building:
        target = _location(building, db)
        if examples is not None:
            _, n_sft, n_test = init_store_from_examples(target, examples, cfg, test_size=test_size)
            console.print(f"initialised {store}: {examples} ({cfg.template} template), SFT set {n_sft}, "
                          f"test split {n_test}; serve it with --log-traffic and post feedback to grow it")
            return
        init_store_from_dataset(
            target, dataset, cfg, initial_size=initial_size, round_size=round_size, rounds=rounds,
            data_dir=str(data_dir) if data_dir else None, test_size=test_size,
        )
    console.print(f"initialised {store}: {dataset}, SFT set {initial_size}, {rounds} rounds of {round_size}")


def _check_label_words(cfg) -> None:
    """A user's template: each label word must be one token at the answer position of the store's LLM
    (its tokenizer only: no weights load)."""
    from functools import partial

    from transformers import AutoTokenizer

    from ragsieve.models.llm import chat_prompt, resolve_llm_path
    from ragsieve.prompts.verdicts import check_single_token_words

    tokenizer = AutoTokenizer.from_pretrained(resolve_llm_path(cfg.llm))
    check_single_token_words(tokenizer, cfg.verdict_template(), partial(chat_prompt, tokenizer))


@evolve_app.command("step")
def step_cmd(
    store: str = StoreOption,
    all_rounds: bool = typer.Option(False, "--all", help="Keep stepping until no round is queued."),
    db: Optional[str] = DbOption,
) -> None:
    """Run the next round: waiting feedback first, then queued rounds, then served traffic (one line each)."""
    from ragsieve.evolve.live import promote_feedback, promote_traffic
    from ragsieve.evolve.store import run_step
    from ragsieve.progress import showing_reports

    store = _location(store, db)
    # feedback since the last round goes ahead of any unlabelled round; traffic since then queues last
    promoted = promote_feedback(store)
    if promoted is not None:
        console.print(f"live feedback queued as round {promoted}")
    traffic = promote_traffic(store)
    if traffic is not None:
        console.print(f"served traffic queued as round {traffic}")
    while True:
        with showing_reports(err_console):  # scoring batches and training steps, as they finish
            report = run_step(store)
        if report.round is None:
            console.print("no queued round: post feedback, serve with --log-traffic or `evolve ingest` a batch")
            return
        console.print(report.summary(), soft_wrap=True, markup=False)
        if report.check_line():
            console.print(report.check_line(), soft_wrap=True, markup=False)
        if not all_rounds:
            return


@evolve_app.command("feedback")
def feedback_cmd(
    file: Path = typer.Argument(..., help="jsonl rows {id, label} (0/1 or a label word) for queued examples."),
    store: str = StoreOption,
    db: Optional[str] = DbOption,
) -> None:
    """Add gold labels; a round whose examples all have one runs as a full-feedback round."""
    from ragsieve.evolve.store import add_feedback

    counts = add_feedback(_location(store, db), file)
    console.print("feedback stored: " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))


@evolve_app.command("ingest")
def ingest_cmd(
    file: Path = typer.Argument(..., help="jsonl rows {id, fields: {...}, label?} forming one new round."),
    store: str = StoreOption,
    db: Optional[str] = DbOption,
) -> None:
    """Queue a new batch of candidates as the next round."""
    from ragsieve.evolve.store import ingest

    console.print(f"queued as round {ingest(_location(store, db), file)}")


@evolve_app.command("status")
def status_cmd(
    store: str = StoreOption, as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    db: Optional[str] = DbOption,
) -> None:
    """Finished rounds with their metrics, queued rounds and the replay buffer."""
    from ragsieve.evolve.store import store_status

    status = store_status(_location(store, db))
    if as_json:
        print(json.dumps(status, indent=1))
        return
    rows_in = f", rows in {status['database']}" if status["database"] else ""
    table = Table(title=f"{status['store']} ({status['template']}, {status['llm']}{rows_in})")
    for col in ("round", "mode", "accuracy", "f1", "n", "new pairs", "pseudo-label acc", "labellers used",
                "test acc", "seconds"):
        table.add_column(col)
    for r in status["rounds"]:
        labels = r.get("labels") or {}
        check = r.get("labeller_check")
        table.add_row(
            str(r["round"]), r["mode"], _fmt(r.get("accuracy")), _fmt(r.get("f1")), _fmt(r.get("n")),
            _fmt(r.get("n_new_pairs")), _fmt(labels.get("accuracy")),
            "-" if check is None else (", ".join(check["used"]) or "none"),
            _fmt((r.get("test") or {}).get("accuracy")), _fmt((r.get("seconds") or {}).get("total")),
        )
    console.print(table)
    for r in status["rounds"]:
        if r.get("skipped"):
            console.print(f"round {r['round']} skipped: {r['skipped']}")
    for q in status["queued"]:
        console.print(f"queued round {q['round']}: {q['examples']} examples, {q['feedback']} with feedback")
