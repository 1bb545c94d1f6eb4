"""The `ragsieve` command line (typer + rich).

Every command turns a :class:`~ragsieve.errors.RagsieveError` into one red line and
exit code 2, so bad input never ends in a traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER, DEFAULT_LLM

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


def _parse_ks(text: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise RagsieveError(f"bad list of cut-offs '{text}'; expected e.g. 1,5,10") from None
    if not ks or ks[0] < 1:
        raise RagsieveError(f"cut-offs must be positive integers, got '{text}'")
    return ks


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


@app.command("index")
def index_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Index directory to create."),
    dataset: str = typer.Option("nq-oracle", help="Dataset whose passage pool is indexed."),
    kind: str = typer.Option("hybrid", help="bm25 | dense | hybrid"),
    encoder: str = typer.Option(DEFAULT_ENCODER, help="Bi-encoder spec for dense/hybrid."),
    data_dir: Optional[Path] = DataDirOption,
    skip_bad: bool = SkipBadOption,
) -> None:
    """Build a retrieval index over a dataset's passage pool."""
    from ragsieve.data import load_dataset
    from ragsieve.retrieve import build_index

    ds = load_dataset(dataset, data_dir=data_dir, skip_bad=skip_bad)
    if not ds.passages:
        raise RagsieveError(f"dataset '{dataset}' has no passage pool to index")
    if ds.skipped_lines:
        err_console.print(f"[yellow]skipped {ds.skipped_lines} malformed line(s)[/]")
    build_index(ds.passages, out, kind=kind, encoder_spec=encoder)
    console.print(f"indexed {len(ds.passages)} passages of {dataset} ({kind}) → {out}")


@app.command("retrieve")
def retrieve_cmd(
    query: str = typer.Argument(..., help="The query text."),
    index: Path = typer.Option(..., "--index", "-i", help="Index directory (ragsieve index)."),
    k: int = typer.Option(5, "-k", help="How many passages."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines instead of a table."),
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
    from ragsieve.eval.retrieval import evaluate_retrievers

    results = evaluate_retrievers(
        dataset, kinds=[k.strip() for k in kinds.split(",") if k.strip()], ks=_parse_ks(ks),
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


@app.command("ask")
def ask_cmd(
    question: str = typer.Argument(..., help="The question."),
    index: Optional[Path] = typer.Option(None, "--index", "-i", help="Index directory; needed unless --no-retrieval."),
    top_k: int = typer.Option(3, "--top-k", "-k", help="Passages fed to the LLM."),
    no_retrieval: bool = typer.Option(False, "--no-retrieval", help="Answer closed-book."),
    llm: str = typer.Option(DEFAULT_LLM, help="LLM spec: embedded:..., HF id/path, or openai:<url>#<model>."),
    max_new_tokens: int = typer.Option(32, help="Answer length cap."),
    show_contexts: bool = typer.Option(False, "--show-contexts", help="Print the passages used."),
    cbdr: Optional[float] = typer.Option(None, "--cbdr", help="CBDR β: skip retrieval when Conf(Q) > β."),
    probe: Path = typer.Option(Path("results/probe_nq/probe"), "--probe", help="Probe folder used by --cbdr."),
    reranker: Optional[str] = typer.Option(
        None, "--reranker", help="Rerank retrieved candidates: a cross-encoder folder, embedded:base, bm25, bi-encoder."
    ),
    candidates: int = typer.Option(20, "--candidates", help="Passages retrieved for the reranker to choose from."),
    grader: Optional[Path] = typer.Option(
        None, "--grader", help="A saved grader folder: drop passages it grades irrelevant (after reranking)."
    ),
) -> None:
    """Answer a question with the LLM, with or without retrieved (and reranked) passages."""
    from ragsieve.models import load_llm
    from ragsieve.pipeline import RAGPipeline
    from ragsieve.retrieve import load_index

    if not question.strip():
        raise RagsieveError("empty question")
    if not no_retrieval and index is None:
        raise RagsieveError("give --index DIR (build one with `ragsieve index`) or use --no-retrieval")
    retriever = None if no_retrieval else load_index(index)
    model = load_llm(llm)
    gate = None
    if cbdr is not None:
        from ragsieve.gate import CBDRGate
        from ragsieve.probe.model import ConfidenceProbe

        if not hasattr(model, "tokenizer"):
            raise RagsieveError("--cbdr reads hidden states: it needs a local LLM, not an endpoint")
        gate = CBDRGate(ConfidenceProbe.load(probe, model), cbdr)
    ranker = None
    if reranker and not no_retrieval:
        from ragsieve.rerank import load_reranker

        ranker = load_reranker(reranker)
    relevance = None
    if grader is not None and not no_retrieval:
        from ragsieve.grade import load_grader

        relevance = load_grader(grader)
    pipe = RAGPipeline(
        model, retriever, top_k=top_k, max_new_tokens=max_new_tokens, gate=gate, reranker=ranker,
        candidates=candidates, grader=relevance,
    )
    answer = pipe.answer(question, retrieve=not no_retrieval)
    if answer.confidence is not None:
        verdict = "retrieve" if answer.retrieved else "answer closed-book"
        err_console.print(f"[dim]Conf(Q) = {answer.confidence:.3f}, β = {cbdr} → {verdict}[/]")
    if answer.all_graded_out:
        err_console.print(f"[yellow]all {answer.graded_out} passage(s) graded irrelevant: answered closed-book[/]")
    elif answer.graded_out:
        err_console.print(f"[dim]{answer.graded_out} passage(s) graded irrelevant and dropped[/]")
    if show_contexts:
        for i, p in enumerate(answer.contexts, 1):
            console.print(f"[dim][{i}] {p.id} {p.full_text[:200]}[/]")
    if answer.truncated_contexts:
        err_console.print(f"[yellow]{answer.truncated_contexts} passage(s) truncated to fit the prompt[/]")
    console.print(answer.answer)


@app.command("demo")
def demo_cmd(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML/JSON overriding the embedded defaults."),
) -> None:
    """Run the main job on embedded defaults (what `make demo` runs)."""
    from ragsieve.config import load_config
    from ragsieve.demo import DemoConfig, run_demo

    cfg = load_config(DemoConfig, config) if config else DemoConfig()
    run_demo(cfg, console)


@app.command("run")
def run_cmd(config: Path = typer.Argument(..., help="Experiment YAML (see experiments/).")) -> None:
    """Run an experiment config end to end and write its results."""
    from ragsieve.experiments import run_experiment_file

    run_experiment_file(config, console)


probe_app = typer.Typer(help="Knowledge-boundary confidence probe.", no_args_is_help=True)
app.add_typer(probe_app, name="probe")


def _read_probe_rows(path: Path) -> list[dict]:
    from ragsieve.data import read_jsonl

    rows = []
    for lineno, row in read_jsonl(path).numbered():
        if not str(row.get("question", "")).strip():
            raise RagsieveError(f"{path}:{lineno}: missing or empty 'question'")
        rows.append(row)
    if not rows:
        raise RagsieveError(f"{path}: no rows")
    return rows


def _context_of(row: dict):
    from ragsieve.data.records import Passage

    text = row.get("context")
    return Passage("ctx", str(text), str(row.get("title", ""))) if text else None


@probe_app.command("extract")
def probe_extract_cmd(
    input: Path = typer.Option(..., "--input", help="jsonl rows {question, context?, title?}."),
    out: Path = typer.Option(..., "--out", help="Where to write the states (.npy)."),
    llm: str = typer.Option(DEFAULT_LLM, help="Local LLM spec."),
    layer: float = typer.Option(0.5, help="Layer index (int) or depth fraction (0.5 = L/2)."),
    max_prompt_tokens: int = typer.Option(1024, help="Prompt budget; contexts are truncated to fit."),
) -> None:
    """Extract pre-token hidden states for the QA prompts of each row."""
    import numpy as np

    from ragsieve.models import load_local_llm
    from ragsieve.probe.hidden import HiddenStateExtractor
    from ragsieve.prompts.builder import PromptBuilder

    rows = _read_probe_rows(input)
    model = load_local_llm(llm)
    builder = PromptBuilder(model, max_prompt_tokens=max_prompt_tokens)
    built = [builder.with_context(r["question"], [c] if (c := _context_of(r)) else []) for r in rows]
    prompts = [builder.to_chat(b.text) for b in built]
    extractor = HiddenStateExtractor(model, int(layer) if float(layer).is_integer() else layer)
    np.save(out, extractor.extract(prompts))
    truncated = sum(b.truncated_contexts for b in built)
    console.print(f"{len(rows)} states of layer {extractor.layer} → {out} ({truncated} context(s) truncated)")


@probe_app.command("train")
def probe_train_cmd(
    config: Path = typer.Argument(Path("experiments/probe_nq.yaml"), help="Probe experiment YAML."),
) -> None:
    """Label answers, extract states, train and evaluate a probe (the probe experiment)."""
    from ragsieve.experiments import run_experiment_file

    run_experiment_file(config, console)


@probe_app.command("eval")
def probe_eval_cmd(
    input: Path = typer.Option(..., "--input", help="jsonl rows {question, context?, correct?}."),
    probe: Path = typer.Option(Path("results/probe_nq/probe"), "--probe", help="Saved probe folder."),
    llm: str = typer.Option(DEFAULT_LLM, help="Local LLM spec (must match the probe)."),
) -> None:
    """Score rows with a saved probe; with `correct` labels, report AUROC and accuracy."""
    import numpy as np

    from ragsieve.eval.classification import classification_metrics
    from ragsieve.models import load_local_llm
    from ragsieve.probe.model import ConfidenceProbe

    rows = _read_probe_rows(input)
    scorer = ConfidenceProbe.load(probe, load_local_llm(llm))
    conf = scorer.score_batch([r["question"] for r in rows], [_context_of(r) for r in rows])
    labelled = [i for i, r in enumerate(rows) if "correct" in r]
    if labelled:
        y = np.array([int(rows[i]["correct"]) for i in labelled])
        m = classification_metrics(y, (conf[labelled] > 0.5).astype(int), conf[labelled])
        print(json.dumps({k: m[k] for k in ("n", "auroc", "accuracy", "precision", "recall", "f1")}))
    else:
        for r, c in zip(rows, conf):
            print(json.dumps({"question": r["question"], "confidence": float(c)}, ensure_ascii=False))


cbdr_app = typer.Typer(help="Confidence-based dynamic retrieval.", no_args_is_help=True)
app.add_typer(cbdr_app, name="cbdr")


@cbdr_app.command("sweep")
def cbdr_sweep_cmd(
    config: Path = typer.Argument(Path("experiments/cbdr_nq.yaml"), help="CBDR experiment YAML."),
    betas: Optional[str] = typer.Option(None, help="Override β values, e.g. 0,0.9,0.95."),
) -> None:
    """Sweep β × top-k on held-out questions: accuracy and retrieval rate."""
    from ragsieve.experiments import run_experiment_file

    overrides = {}
    if betas:
        try:
            overrides["betas"] = [float(b) for b in betas.split(",") if b.strip()]
        except ValueError:
            raise RagsieveError(f"bad --betas '{betas}'; expected e.g. 0,0.9,0.95") from None
    run_experiment_file(config, console, overrides)


from ragsieve.grade.cli import grade_cmd, grader_app  # noqa: E402 - light: no torch at import

app.add_typer(grader_app, name="grader")
app.command("grade")(grade_cmd)

prefs_app = typer.Typer(help="Confidence-shift preference sets (Inc = Conf(Q+C) − Conf(Q)).", no_args_is_help=True)
app.add_typer(prefs_app, name="prefs")


@prefs_app.command("build")
def prefs_build_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Folder for shifts.jsonl, prefs_train.jsonl, prefs_test.jsonl."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML/JSON of PreferenceBuildConfig fields."),
    probe: Optional[Path] = typer.Option(None, "--probe", help="Probe folder (default results/probe_nq/probe)."),
    train_questions: Optional[int] = typer.Option(None, help="Questions for the train preferences."),
    test_questions: Optional[int] = typer.Option(None, help="Held-out questions for the test preferences."),
) -> None:
    """Score the top-20 retrieved passages per question with the probe and write FlagEmbedding jsonl."""
    from ragsieve.config import build_config, read_mapping
    from ragsieve.prefs.build import PreferenceBuildConfig, build_preference_set
    from ragsieve.probe.experiment import progress_bar

    values = read_mapping(config) if config else {}
    overrides = {"probe": str(probe) if probe else None, "train_questions": train_questions,
                 "test_questions": test_questions}
    values.update({k: v for k, v in overrides.items() if v is not None})
    cfg = build_config(PreferenceBuildConfig, values, source=str(config or "options"))
    with progress_bar(err_console) as bar:
        task = bar.add_task("confidence shifts", total=cfg.train_questions + cfg.test_questions)
        stats = build_preference_set(cfg, out, lambda k: bar.advance(task, k))
    print(json.dumps(stats, indent=2))


class _QueryOrCommand(typer.core.TyperGroup):
    """`ragsieve rerank QUERY ...` ranks; `ragsieve rerank train|eval ...` run those commands."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["query", *args]
        return super().resolve_command(ctx, args)


rerank_app = typer.Typer(
    cls=_QueryOrCommand, no_args_is_help=True,
    help="Rerank passages (`ragsieve rerank QUERY --passages FILE`), or train / eval a cross-encoder.",
)
app.add_typer(rerank_app, name="rerank")
RerankerOption = typer.Option(
    "embedded:base", "--reranker", "-r",
    help="Cross-encoder folder, embedded:base, cross-encoder:<HF id or folder>, bm25 or bi-encoder.",
)


@rerank_app.command("query", hidden=True)
def rerank_query_cmd(
    query: str = typer.Argument(..., help="The query."),
    passages: Path = typer.Option(..., "--passages", "-p", help="jsonl {text, title?, id?} or one passage per line."),
    reranker: str = RerankerOption,
    k: int = typer.Option(0, "-k", help="Show only the best k (0 = all)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines instead of a table."),
) -> None:
    """Rank passages for a query."""
    from ragsieve.rerank import load_reranker

    from ragsieve.data.passage_files import read_passages_file

    items = read_passages_file(passages)
    ranked = load_reranker(reranker).rank(query, items) if items else None
    results = [] if ranked is None else (ranked.top_k(k) if k else list(ranked.results))
    if as_json:
        for r in results:
            print(json.dumps({"rank": r.rank, "index": r.index, "id": r.passage.id, "score": r.score,
                              "text": r.passage.full_text}, ensure_ascii=False))
        return
    table = Table(title=f"{len(results)} of {len(items)} passages")
    for col in ("rank", "index", "score", "passage"):
        table.add_column(col)
    for r in results:
        table.add_row(str(r.rank + 1), str(r.index), f"{r.score:.4f}", r.passage.full_text[:120])
    console.print(table)


@rerank_app.command("train")
def rerank_train_cmd(
    prefs: Path = typer.Option(..., "--prefs", help="FlagEmbedding jsonl: query, pos, neg (+ scores)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder for the trained CrossEncoder."),
    init: str = typer.Option("embedded:base", "--init", help="Start from: a cross-encoder folder, embedded:base, "
                             "or an encoder spec (new head)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML/JSON of CrossEncoderTrainConfig fields."),
    skip_bad: bool = SkipBadOption,
) -> None:
    """Fine-tune a cross-encoder with InfoNCE (1 positive vs a group of negatives)."""
    from ragsieve.config import build_config, read_mapping
    from ragsieve.prefs.preferences import read_preferences
    from ragsieve.rerank.train import CrossEncoderTrainConfig, train_cross_encoder

    values = read_mapping(config) if config else {}
    if init == "embedded:base":
        from ragsieve.rerank.embedded import ensure_base_reranker

        init = str(ensure_base_reranker())
    values["init"] = init
    cfg = build_config(CrossEncoderTrainConfig, values, source=str(config or "options"))
    records = read_preferences(prefs, skip_bad=skip_bad)
    path = train_cross_encoder(records, cfg, out)
    console.print(f"trained on {sum(len(r.pos) for r in records)} groups from {len(records)} queries → {path}")


@rerank_app.command("eval")
def rerank_eval_cmd(
    prefs: Path = typer.Option(..., "--prefs", help="Test preferences (jsonl): rank pos ∪ neg, relevant = pos."),
    rerankers: list[str] = typer.Option(["bm25", "bi-encoder", "embedded:base"], "--reranker", "-r",
                                        help="Repeat to compare several."),
    ks: str = typer.Option("1,3,5", "--ks", help="Cut-offs."),
    out: Optional[Path] = typer.Option(None, help="Write the metrics as JSON here."),
) -> None:
    """P@k, R@k, MRR@k of each reranker on a preference test file."""
    import hashlib

    from ragsieve.data.records import Passage
    from ragsieve.prefs.preferences import read_preferences
    from ragsieve.rerank import load_reranker
    from ragsieve.rerank.experiment import metrics_table
    from ragsieve.rerank.relevance import RankingQuery, evaluate_rankers

    queries = []
    for i, r in enumerate(read_preferences(prefs)):
        qid = r.query_id or str(i)
        pos_ids = r.pos_ids or [f"pos{j}" for j in range(len(r.pos))]
        neg_ids = r.neg_ids or [f"neg{j}" for j in range(len(r.neg))]
        # hash order, not pos-first: tied scores must not favour the positives
        cands = sorted((Passage(p, t) for p, t in zip(pos_ids + neg_ids, r.pos + r.neg)),
                       key=lambda p: hashlib.sha1(p.text.encode()).hexdigest())
        queries.append(RankingQuery(qid, r.query, tuple(cands), frozenset(pos_ids)))
    if not queries:
        raise RagsieveError(f"{prefs}: no preference records to evaluate")
    metrics = evaluate_rankers({spec: load_reranker(spec) for spec in rerankers}, queries,
                               ks=_parse_ks(ks), measures=("P", "R", "MRR"))
    console.print(metrics_table(f"{len(queries)} queries", metrics, list(next(iter(metrics.values())))))
    if out:
        out.write_text(json.dumps(metrics, indent=2) + "\n")


from ragsieve.evolve.cli import evolve_app  # noqa: E402 - light: no torch at import

app.add_typer(evolve_app, name="evolve")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app(args=argv, standalone_mode=False)
    except RagsieveError as exc:
        err_console.print(f"[red]error:[/] {exc}", soft_wrap=True)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        err_console.print("aborted")
        return 130
    except Exception as exc:  # click usage errors carry their own exit codes
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            return exc.exit_code
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
