"""``ragsieve rerank QUERY|train|eval`` and ``ragsieve prefs build``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ragsieve.checks import non_negative_int
from ragsieve.cli.app import (
    JsonLinesOption, OutRowsOption, OverwriteOption, PassagesFileOption, SkipBadOption, app, console, err_console,
    parse_ks, read_query_passages, stream_rows,
)
from ragsieve.errors import RagsieveError


prefs_app = typer.Typer(help="Confidence-shift preference sets (Inc = Conf(Q+C) − Conf(Q)).", no_args_is_help=True)
app.add_typer(prefs_app, name="prefs")


@prefs_app.command("build")
def prefs_build_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="Folder for shifts.jsonl, prefs_train.jsonl, prefs_test.jsonl; "
                             "built in .OUT.partial, which the same command resumes after a kill."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML/JSON of PreferenceBuildConfig fields."),
    probe: Optional[Path] = typer.Option(None, "--probe", help="Probe folder or embedded:<name> (default embedded:smollm2-nq)."),
    train_questions: Optional[int] = typer.Option(None, help="Questions for the train preferences."),
    test_questions: Optional[int] = typer.Option(None, help="Held-out questions for the test preferences."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Build again over a finished --out folder."),
) -> None:
    """Score the top-20 retrieved passages per question with the probe and write FlagEmbedding jsonl."""
    from ragsieve.atomic import resumable_directory
    from ragsieve.checks import output_dir
    from ragsieve.config import build_config, read_mapping
    from ragsieve.prefs.build import PreferenceBuildConfig, build_preference_set
    from ragsieve.progress import progress_bar

    values = read_mapping(config) if config else {}
    overrides = {"probe": str(probe) if probe else None, "train_questions": train_questions,
                 "test_questions": test_questions}
    values.update({k: v for k, v in overrides.items() if v is not None})
    cfg = build_config(PreferenceBuildConfig, values, source=str(config or "options"))
    output_dir(out, overwrite=overwrite)
    with resumable_directory(out, overwrite=overwrite, exists_hint="pass --overwrite to build it again") as work:
        with progress_bar(err_console) as bar:
            task = bar.add_task("confidence shifts", total=cfg.train_questions + cfg.test_questions)
            stats = build_preference_set(cfg, work, lambda k: bar.advance(task, k))
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
    passages: Path = PassagesFileOption,
    reranker: str = RerankerOption,
    k: int = typer.Option(0, "-k", help="Show only the best k (0 = all)."),
    as_json: bool = JsonLinesOption,
    out: Optional[Path] = OutRowsOption,
    overwrite: bool = OverwriteOption,
) -> None:
    """Rank passages for a query (a progress bar; --out streams the scores and resumes)."""
    from ragsieve.registry import load_reranker
    from ragsieve.rerank.base import RankedResults, ranked_from_scores

    non_negative_int(k, "-k")
    items = read_query_passages(query, passages)
    ranker = load_reranker(reranker)

    def score_batch(batch):
        scores = ranker.score(query, [p for _, p in batch])
        return [{"index": i, "id": p.id, "score": float(s)} for (i, p), s in zip(batch, scores)]

    # A list-wise scorer (BM25's IDF comes from the list) must see every passage at once.
    size = 64 if ranker.pointwise else max(len(items), 1)
    rows = stream_rows(items, score_batch, out=out, overwrite=overwrite, desc="reranking", batch_size=size)
    ranked = ranked_from_scores(query, items, [r["score"] for r in rows]) if items else RankedResults(query, ())
    results = ranked.top_k(k) if k else list(ranked.results)
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
    distill_weight: Optional[float] = typer.Option(
        None, "--distill-weight", help="Forgetting guard: weight of KL(start model || trained model) over each "
        "group's scores \\[default: 1 from a trained cross-encoder, 0 from an encoder (a new head)]."),
    replay: Optional[Path] = typer.Option(None, "--replay", help="Gold relevance groups (FlagEmbedding jsonl) "
                                          "to replay; with --replay-ratio."),
    replay_ratio: Optional[float] = typer.Option(None, "--replay-ratio", help="Share of training rows drawn "
                                                 "from --replay, in [0, 1) \\[default: 0]."),
    lora_r: Optional[int] = typer.Option(None, "--lora-r", help="Train LoRA adapters of this rank and merge them "
                                         "into the saved weights \\[default: 0 = full fine-tune]."),
    relevance_dev: Optional[Path] = typer.Option(None, "--relevance-dev", help="Gold groups (jsonl) for early "
                                                 "stopping on nDCG@10; with --eval-steps."),
    eval_steps: Optional[int] = typer.Option(None, "--eval-steps", help="Evaluate on --relevance-dev every N steps, "
                                             "keep the best \\[default: 0 = off]."),
    cosine_mix: Optional[bool] = typer.Option(
        None, "--cosine-mix/--no-cosine-mix", help="Keep the start reranker's MiniLM cosine mix (embedded:base "
        "scores logit + w · 20 · cosine) in the saved folder \\[default: on]."),
    checkpoint_steps: Optional[int] = typer.Option(
        None, "--checkpoint-steps", help="Save the training state every N steps in OUT.checkpoints; the same "
        "command resumes from it after a kill \\[default: 0 = off]."),
    skip_bad: bool = SkipBadOption,
    overwrite: bool = OverwriteOption,
) -> None:
    """Fine-tune a cross-encoder with InfoNCE (1 positive vs a group of negatives), with forgetting guards."""
    from ragsieve.atomic import atomic_directory
    from ragsieve.checks import output_dir
    from ragsieve.config import build_config, read_mapping
    from ragsieve.prefs.preferences import read_preferences
    from ragsieve.rerank.training.trainer import CrossEncoderTrainConfig, train_cross_encoder

    values = read_mapping(config) if config else {}
    from ragsieve.registry import reranker_start

    values["init"] = reranker_start(init)  # embedded:base → its folder; a folder, HF id or encoder spec as given
    options = {"distill_weight": distill_weight, "replay_ratio": replay_ratio, "lora_r": lora_r,
               "eval_steps": eval_steps, "cosine_mix": cosine_mix, "checkpoint_steps": checkpoint_steps}
    values.update({k: v for k, v in options.items() if v is not None})
    # the command's default guards, the ones measured best (results/rerank_align_guard): the cosine mix,
    # and distillation to the start model when it is a trained cross-encoder (a new head has nothing to keep)
    values.setdefault("cosine_mix", True)
    from ragsieve.rerank.training.trainer import is_cross_encoder_folder

    if is_cross_encoder_folder(init):
        values.setdefault("distill_weight", 1.0)
    cfg = build_config(CrossEncoderTrainConfig, values, source=str(config or "options"))
    # every option is checked before any file is read or any model loads
    if cfg.replay_ratio > 0 and replay is None:
        raise RagsieveError(f"--replay-ratio {cfg.replay_ratio} needs --replay FILE (gold groups to replay)")
    if cfg.eval_steps > 0 and relevance_dev is None:
        raise RagsieveError(f"--eval-steps {cfg.eval_steps} needs --relevance-dev FILE (gold groups)")
    output_dir(out, overwrite=overwrite)
    records = read_preferences(prefs, skip_bad=skip_bad)
    gold = read_preferences(replay, skip_bad=skip_bad) if replay is not None and cfg.replay_ratio > 0 else None
    dev = read_preferences(relevance_dev, skip_bad=skip_bad) if relevance_dev is not None and cfg.eval_steps else None
    checkpoints = out.with_name(out.name + ".checkpoints") if cfg.checkpoint_steps else None
    with atomic_directory(out, overwrite=overwrite, exists_hint="pass --overwrite to replace it") as building:
        train_cross_encoder(records, cfg, building, replay=gold, relevance_dev=dev, checkpoint_dir=checkpoints)
    if checkpoints is not None:
        import shutil

        shutil.rmtree(checkpoints, ignore_errors=True)  # the model is saved: its checkpoints are not needed
    console.print(f"trained on {sum(len(r.pos) for r in records)} groups from {len(records)} queries → {out}")


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
    from ragsieve.registry import load_reranker
    from ragsieve.eval.tables import metrics_table
    from ragsieve.benchmarks.relevance import RankingQuery, evaluate_rankers

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
                               ks=parse_ks(ks), measures=("P", "R", "MRR"))
    console.print(metrics_table(f"{len(queries)} queries", metrics, list(next(iter(metrics.values())))))
    if out:
        out.write_text(json.dumps(metrics, indent=2) + "\n")



@rerank_app.command("calibrate")
def rerank_calibrate_cmd(
    pairs: Path = typer.Argument(..., help=".jsonl rows {query, passage, label (0/1 or true/false), query_id?, id?}: "
                                 "your own judged candidates, whole queries (both relevant and not)."),
    reranker: str = RerankerOption,
    out: Path = typer.Option(..., "--out", "-o", help="Calibration JSON to write, for `ragsieve serve --calibration` "
                             "and load_reranker(spec, calibration=...)."),
    folds: int = typer.Option(5, "--folds", help="Folds of whole queries for the cross-fitted ECE."),
    precision: list[float] = typer.Option([], "--precision", help="Also print the [0, 1] relevance_score cut reaching "
                                          "this precision on your labels (cross-fitted), for a client's threshold. "
                                          "Repeatable."),
    overwrite: bool = OverwriteOption,
) -> None:
    """Fit the reranker's [0, 1] scores to your own labelled pairs, and report ECE before and after.

    One calibration cannot be right on every corpus (the same score can mean 10 % relevant on one and 70 %
    on another): fitted on about 40 judged queries of yours, the scores `serve` answers become probabilities
    on your data, which a relevance threshold (Open WebUI's, Dify's, /v1/filter's) needs.
    """
    import numpy as np

    from ragsieve.checks import positive_int
    from ragsieve.data.labelled import read_labelled_pairs
    from ragsieve.progress import progress_bar
    from ragsieve.registry import cross_encoder_key, load_reranker
    from ragsieve.rerank.calibration import CalibrationFile, fit_calibration

    positive_int(folds, "--folds")
    for target in precision:
        if not 0.0 < target <= 1.0:
            raise RagsieveError(f"--precision {target}: a precision is in (0, 1]")
    if out.exists() and not overwrite:
        raise RagsieveError(f"--out {out} exists: pass --overwrite to replace it")
    rows = read_labelled_pairs(pairs)
    ranker = load_reranker(reranker)
    scores, chunk = [], 256
    with progress_bar(err_console) as bar:  # a few hundred pairs/s: thousands of pairs take a while
        task = bar.add_task(f"scoring {len(rows)} pairs", total=len(rows))
        for start in range(0, len(rows), chunk):
            part = rows[start:start + chunk]
            scores.append(ranker.score_pairs([r.query for r in part], [r.passage for r in part]))
            bar.advance(task, len(part))
    raw = np.concatenate(scores)
    labels, groups = [r.label for r in rows], [r.query_id for r in rows]
    calibration, ece, cuts = fit_calibration(raw, labels, groups, from_probability=ranker.score_is_probability,
                                             as_loaded=ranker.unit_scores(raw), folds=folds, precisions=precision)
    fitted = CalibrationFile(reranker=reranker, ranker_weights=cross_encoder_key(reranker), calibration=calibration,
                             pairs=len(rows), queries=len(set(groups)), relevant=int(sum(labels)), folds=folds,
                             ece=ece, thresholds=cuts)
    fitted.save(out)
    table = Table(title=f"ECE on {fitted.pairs} pairs of {fitted.queries} queries (95 % interval by query)")
    for column in ("scores", "ECE", "95 % interval", "pairs"):
        table.add_column(column)
    names = {"as_loaded": f"{reranker} as loaded", "calibrated_cross_fitted": "calibrated (cross-fitted by query)"}
    for key, name in names.items():
        if key in ece:
            e = ece[key]
            table.add_row(name, f"{e['mean']:.3f}", f"[{e['low']:.3f}, {e['high']:.3f}]", str(int(e["pairs"])))
    console.print(table)
    for target, cut in cuts.items():
        console.print(f"precision ≥ {target}: " + ("no cut reaches it on these labels" if cut["threshold"] is None else
                      f"keep relevance_score ≥ {cut['threshold']:.3f} (recall {cut['recall']:.2f}, "
                      f"{cut['kept']:.0%} of pairs kept; cross-fitted)"))
    err_console.print(f"wrote {out}: temperature {calibration.temperature:.3f}, bias {calibration.bias:+.3f}")
