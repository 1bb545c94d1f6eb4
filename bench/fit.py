"""Speed of `ragsieve fit` on the embedded defaults: seconds per phase and the share spent in LLM forwards.

Builds (or reuses) the hybrid index of ``--dataset``, writes a QA file of its questions, runs the full
fit into ``--out`` and times it. LLM forward time is measured with forward hooks on the LLM itself
(generation, probe states and Conf(Q+C) passes alike). Target (issue #13): 300 questions in ≤ 60 min
on 2 cores. Writes ``bench/results/fit.json``.

* ``nq`` (default): the NQ-oracle passage pool; the first ``--questions`` (300) NQ questions of the
  train side that the start reranker never trained on (the demo's held-out questions are never used;
  ``embedded:base`` mined 1,000 of the other 2,086, so 1,086 remain).
* ``hotpotqa`` (issue #39): the paragraphs of all 1,517 HotpotQA distractor questions, built exactly as
  ``ragsieve index --passages`` builds a corpus (written to ``<out>/passages.jsonl``, read and chunked by
  :func:`ragsieve.retrieve.read_corpus`: 14,798 paragraphs, 16,497 passages); the questions are those the start reranker
  (``align.init``, ``embedded:base``) never trained or early-stopped on: it mined 1,000 of the 1,517, so 517
  remain (HotpotQA has no demo held-out set; that rule is NQ's). Default split 0.2 / 0.18 / 0.62:
  102 / 111 / 304 by the id hash, ≥ 300 test questions. ``--ship`` and ``--regrade`` are NQ's only.

    python bench/fit.py [--questions 300] [--out /tmp/ragsieve-fit-bench] [--config FIT.yaml] [--ship]
    python bench/fit.py --regrade       # only the shipped sieve's grader threshold, after embedded:base changes
    python bench/fit.py --dataset hotpotqa --out ~/.cache/ragsieve/fits/hotpotqa --records results/fit/hotpotqa/records
    python bench/fit.py --dataset hotpotqa --out /tmp/hp --prepare-only   # QA file + index, then exit

``--config`` gives the FitConfig fields (``experiments/sieve_default.yaml`` by default);
``--ship`` then copies the fitted sieve (without ``work/``) to ``ragsieve/assets/sieves/default``
and its metrics to ``results/fit/metrics.json``: how the shipped default sieve is built.
``--ship-finished`` ships a fit that already ran to the end with the same ``--out`` and ``--result``,
without running it again. Neither replaces a shipped sieve whose sentence pruner the fit never tried:
the default prunes with the keep head (``pruner: prune-head``); a fit whose grid tries it
(``select.prune_scorers``, by default) ships what the answers choose, prunes with it or not; one whose grid leaves
it out is refused in one line before the fit starts (``--ship``) or before copying (``--ship-finished``: a sieve
whose recorded grid never pruned with it), unless ``--keep-pruner`` carries the shipped pruning (pruner,
threshold, best N) into the new sieve.
``--prepare-only`` writes the QA file, builds (or loads) the cached index, prints the split sizes and
exits before the LLM loads.

A rerun resumes the fit (the phases already done take no time) and reuses the cached index
(``~/.cache/ragsieve/indexes/``, keyed by the passages): pass a fresh ``--out`` to time a whole fit.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Collection
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from ragsieve.machine import machine_info

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DATASETS = ("nq", "hotpotqa")
#: train,dev,test shares when --split is not given for HotpotQA: its 517 questions → 102 / 111 / 304
HOTPOTQA_SPLIT = "0.2,0.18,0.62"


def write_qa_file(path: Path, questions) -> None:
    """The fit's QA file: id, question and answers per line (no gold passages: the fit does not read them)."""
    path.write_text("".join(json.dumps({"id": q.id, "question": q.text, "answers": list(q.answers)}) + "\n"
                            for q in questions))


def nq_inputs(limit: int, exclude: Collection[str] = ()) -> tuple[str, list, list]:
    """(index name, NQ-oracle's passage pool, its first ``limit`` train-side questions not in ``exclude``;
    0 = all)."""
    from ragsieve.data import held_out_questions, load_dataset

    ds = load_dataset("nq-oracle")
    skip = {q.id for q in held_out_questions(ds.questions, 0.2, 0)} | set(exclude)
    return "nq-oracle", ds.passages, [q for q in ds.questions if q.id not in skip][: limit or None]


def hotpotqa_inputs(out: Path, limit: int, exclude: Collection[str], encoder: str,
                    data_dir: str | Path | None = None) -> tuple[str, list, list]:
    """(index name, the 1,517 questions' paragraphs as ``ragsieve index --passages`` reads them, the questions
    not in ``exclude``, the first ``limit`` of them; 0 = all).

    The paragraphs go to ``<out>/passages.jsonl`` (id = title, as in the distractor file) and come back
    through :func:`~ragsieve.retrieve.read_corpus` with the CLI's chunking, so the index is the one
    ``ragsieve index --passages <out>/passages.jsonl --out DIR`` builds.

    Example::

        name, passages, questions = hotpotqa_inputs(Path("/tmp/hp"), 0, set(), DEFAULT_ENCODER)
    """
    from ragsieve.benchmarks.mining import hotpot_1517
    from ragsieve.retrieve import ChunkConfig, read_corpus

    ds = hotpot_1517(data_dir)
    corpus = out / "passages.jsonl"
    corpus.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in ds.passages))
    passages = read_corpus([corpus], ChunkConfig(tokenizer=encoder))  # ChunkConfig's defaults are the CLI's
    skip = set(exclude)
    questions = [q for q in ds.questions if q.id not in skip]
    return ds.name, passages, questions[: limit or None]


def start_reranker_trained(dataset: str, align_init: str) -> set[str]:
    """Ids of ``dataset``'s questions the start reranker trained or early-stopped on (none for a start reranker
    without a mining recipe).

    They never enter the fit: on them the start reranker (and the grader built on it) has seen the gold
    passages, so every configuration that reranks or grades would be scored partly on its training data.
    ``embedded:base`` mined 1,000 NQ-oracle questions (725 of the first 1,500 of the train side) and 1,000
    of HotpotQA's 1,517.
    """
    from ragsieve.benchmarks.mining import trained_question_ids
    from ragsieve.registry import reranker_folder

    name = {"nq": "nq-oracle", "hotpotqa": "hotpotqa-distractor"}[dataset]
    return trained_question_ids(name, reranker_folder(align_init, "align.init"))


def prepare(dataset: str, out: Path, limit: int, exclude: Collection[str] = (), kind: str = "hybrid",
            encoder: str | None = None, data_dir: str | Path | None = None) -> dict[str, Any]:
    """Write ``<out>/qa.jsonl`` and build or load the cached index.

    Returns ``{qa, index, questions, passages, index_seconds, reused}`` (paths, counts, the build's seconds,
    whether the cached index was reused).

    Example::

        prepare("hotpotqa", Path("/tmp/hp"), 0, start_reranker_trained("hotpotqa", "embedded:base"))
    """
    from ragsieve.models.specs import DEFAULT_ENCODER
    from ragsieve.retrieve.cached import build_or_load_index, cached_index_dir

    encoder = encoder or DEFAULT_ENCODER
    out.mkdir(parents=True, exist_ok=True)
    if dataset == "nq":
        name, passages, questions = nq_inputs(limit, exclude)
    else:
        name, passages, questions = hotpotqa_inputs(out, limit, exclude, encoder, data_dir)
    qa = out / "qa.jsonl"
    write_qa_file(qa, questions)
    t0 = time.perf_counter()
    _, reused = build_or_load_index(name, passages, kind, encoder)
    return {"qa": qa, "index": cached_index_dir(name, passages, kind, encoder), "questions": len(questions),
            "passages": len(passages), "index_seconds": time.perf_counter() - t0, "reused": reused}


def main() -> None:
    from ragsieve.fit import PHASES, Fit, FitConfig
    from ragsieve.fit.config import AlignConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=DATASETS, default="nq",
                        help="nq: NQ-oracle's train side; hotpotqa: the 1,517 distractor questions' paragraphs, and "
                             "the questions the start reranker never trained on (see the docstring)")
    parser.add_argument("--questions", type=int,
                        help="how many questions (default: 300 for nq, all 517 for hotpotqa; 0 = all)")
    parser.add_argument("--out", default="/tmp/ragsieve-fit-bench")
    parser.add_argument("--gate", default="parity")
    parser.add_argument("--result", default="bench/results/fit.json")
    parser.add_argument("--config", default="experiments/sieve_default.yaml", help="FitConfig fields (YAML/JSON)")
    parser.add_argument("--ship", action="store_true", help="copy the sieve into the package as embedded:default")
    parser.add_argument("--split", help="train,dev,test shares (e.g. 0.2,0.3,0.5) instead of the config's: a large "
                        f"refit needs fewer train and more test questions than a 300-question one (hotpotqa: "
                        f"{HOTPOTQA_SPLIT} unless given)")
    parser.add_argument("--records", help="folder of the fit's text-free records (answers, shifts), read at start "
                        "and kept as it runs: a refit resumes from them on another machine")
    parser.add_argument("--ship-finished", action="store_true",
                        help="ship a fit that already finished (<out>/sieve/sieve.json and the --result JSON it "
                             "wrote) without running it again: a rerun with --ship re-ranks every dev and test question")
    parser.add_argument("--keep-pruner", action="store_true",
                        help="with --ship: the new sieve prunes as the shipped one does (its pruner, threshold and "
                             "best N; the keep head today), which the fit itself cannot choose")
    parser.add_argument("--regrade", action="store_true",
                        help="only recalibrate the shipped sieve's grader threshold on the same dev split "
                             "(after embedded:base changes, its scores move and the old threshold means nothing)")
    parser.add_argument("--prepare-only", action="store_true",
                        help="write the QA file and build (or load) the index, print the split sizes, then exit")
    args = parser.parse_args()
    if args.dataset != "nq" and (args.ship or args.ship_finished or args.regrade):
        parser.error(f"--ship and --regrade concern the shipped NQ default sieve, not --dataset {args.dataset}")
    if args.ship and not args.keep_pruner:  # before an hour of fitting, not after
        refuse_losing_the_pruner(None, grid_scorers(args.config))
    if args.ship_finished:
        ship_finished(Path(args.out) / "sieve", Path(args.result), keep_pruner=args.keep_pruner)
        if args.records:
            write_report(Path(args.out) / "sieve", Path(args.records).parent)
        return
    from ragsieve.config import build_config, read_mapping
    from ragsieve.fit.run import fit_splits

    out = Path(args.out)
    values = read_mapping(args.config) if args.config else {"gate": args.gate}
    split = args.split or (HOTPOTQA_SPLIT if args.dataset == "hotpotqa" else None)
    if split:
        try:
            values["split"] = dict(zip(("train", "dev", "test"), map(float, split.split(",")), strict=True))
        except ValueError:
            parser.error(f"--split {split!r}: give three shares, train,dev,test (e.g. 0.2,0.3,0.5)")
    limit = args.questions if args.questions is not None else (300 if args.dataset == "nq" else 0)
    exclude = start_reranker_trained(args.dataset, AlignConfig.model_validate(values.get("align") or {}).init)
    prepared = prepare(args.dataset, out, limit, exclude)
    index_seconds = prepared["index_seconds"]

    values.update({"index": str(prepared["index"]), "questions": str(prepared["qa"]), "out": str(out / "sieve")})
    if args.records:
        values["records"] = args.records
    config = build_config(FitConfig, values, source=args.config or "options")
    from ragsieve.data.qa_files import read_qa_file

    splits = fit_splits(config, read_qa_file(config.questions)[: config.max_questions or None])  # too small: error
    if args.prepare_only:
        print(json.dumps({"dataset": args.dataset, "qa": str(prepared["qa"]), "index": str(prepared["index"]),
                          "passages": prepared["passages"], "index_reused": prepared["reused"],
                          "index_seconds": round(index_seconds, 1), "questions": prepared["questions"],
                          "excluded_start_reranker_trained": len(exclude),
                          "split": {name: len(qs) for name, qs in splits.items()}}))
        return
    from ragsieve.progress import progress_bar

    # a refit runs for hours under nohup: plain stderr lines per phase, every 10 % or 30 s
    with progress_bar() as bar:
        tasks: dict[str, int] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(f"fit {phase}", total=None)  # the first report: what a resumed phase found
            bar.update(tasks[phase], completed=done, total=total)

        fit = Fit(config, progress)
        # work or records from an earlier run: its phase times are not a whole fit's
        resumed = any(folder is not None and Path(folder).is_dir() and any(Path(folder).iterdir())
                      for folder in (config.work, config.records))
        fit.load()
        if args.regrade:
            regrade(fit)
            return
        forward = {"seconds": 0.0, "calls": 0}
        # Time the LLM's entry points, not model.forward hooks: the probe's early-exit forward stops
        # by raising inside the model, so a post-forward hook never fires for it (the first bench
        # version counted generation only).
        from ragsieve.models.llm import LocalLLM
        from ragsieve.probe.hidden import HiddenStateExtractor

        def timed(cls, name):
            original = getattr(cls, name)

            def wrapper(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return original(*args, **kwargs)
                finally:
                    forward["seconds"] += time.perf_counter() - start
                    forward["calls"] += 1

            setattr(cls, name, wrapper)

        # _generate: the one path every local generation takes (generate, and with states: fit's labels)
        for cls, name in ((LocalLLM, "_generate"), (HiddenStateExtractor, "_forward_batch")):
            timed(cls, name)
        total = time.perf_counter()
        for phase in PHASES:
            fit.run_phase(phase)
        seconds = time.perf_counter() - total
    result = {
        "dataset": args.dataset,
        "questions": prepared["questions"],
        "seconds_total": round(seconds, 1),
        "minutes_total": round(seconds / 60, 1),
        "target_minutes": 60,
        "resumed": resumed,
        "target_met": None if resumed else seconds <= 3600,  # only a run from scratch is timed
        "seconds_by_phase": fit.timings,
        "llm_forward_seconds": round(forward["seconds"], 1),
        "llm_forward_share": round(forward["seconds"] / seconds, 3) if seconds else None,
        "llm_forward_calls": forward["calls"],
        "index_seconds": round(index_seconds, 1),
        "config": args.config,
        "sieve_metrics": fit.sieve.metrics,
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or None,
        "machine": machine_info(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    Path(args.result).parent.mkdir(parents=True, exist_ok=True)
    Path(args.result).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("questions", "minutes_total", "llm_forward_share", "seconds_by_phase")}))
    if args.ship:
        ship(out / "sieve", fit.sieve, result, keep_pruner=args.keep_pruner)
    if args.records:
        write_report(out / "sieve", Path(args.records).parent)


def write_report(sieve_dir: Path, folder: Path) -> None:
    """The grid as a markdown table (``grid.md``) and ``frontier.png`` of a finished fit, next to its records."""
    import shutil

    sieve = json.loads((sieve_dir / "sieve.json").read_text())
    metrics = sieve["metrics"]
    sel = metrics["selection"]
    race = sel.get("race") or {}

    def ci(row: dict) -> str:
        lo, hi = row["ci95"]
        return f"[{lo:.3f}, {hi:.3f}]"

    from ragsieve.eval.stats import verdict_in_words
    from ragsieve.eval.tables import markdown_rows

    lines = [f"# `ragsieve fit`'s grid and test comparison: {folder.name} (`bench/fit.py` writes it from `sieve.json`)",
             "",
             f"{sel['n_configurations']} configurations on {sel.get('n_held_out', sel['n_dev'])} "
             + ("held-out (dev + test) questions" if "n_held_out" in sel else "dev questions")
             + (f", raced ({race['survivors']} answered every question; a row with a smaller n was dropped once "
                "a no more expensive configuration answered measurably better, one-sided exact McNemar "
                f"p < {race['alpha']})" if race.get("race") else "")
             + f". Objective: {sel['objective']}. Chosen: **{sel['chosen']}**; best plain: "
             f"**{sel['best_plain']}**; shipped: **{sel['shipped']}**"
             + (f" ({'decided' if sel['decided'] else 'not decided by the evidence'}: {sel['reason']})"
                if "decided" in sel else "")
             + ". Accuracy: the LLM's answer contains a gold "
             "answer; Wilson 95 % intervals; frontier: no other row is at least as accurate for fewer prompt tokens "
             "(or LLM seconds).", ""]
    grid = []
    for row in sorted(sel["grid"], key=lambda r: (-r["accuracy"], r["prompt_tokens"])):
        front = "/".join(name for name, key in (("tokens", "frontier_tokens"), ("seconds", "frontier_seconds"))
                         if row.get(key))
        dropped = f"{row['dominated_by']} (after {row['raced_out_after']})" if row.get("raced_out_after") else ""
        grid.append([row["name"], row["n"], f"{row['accuracy']:.3f}", ci(row), f"{row['prompt_tokens']:.1f}",
                     f"{row['llm_seconds']:.2f}", front, dropped])
    lines += markdown_rows(["configuration", "n", "accuracy", "95 % CI", "prompt tokens", "LLM s / question",
                            "frontier", "dropped by"], grid)
    lines += ["", f"## Held out: {metrics['estimated_on']}" if "estimated_on" in metrics
              else f"## Test ({metrics['n_questions']['test']} questions)", ""]
    lines += markdown_rows(["", "accuracy", "95 % CI", "prompt tokens"],
                           [[name, f"{row['accuracy']:.3f}", ci(row),
                             f"{row['prompt_tokens']:.1f}" if "prompt_tokens" in row else ""]
                            for name, row in metrics["test"].items()])
    lines += [""]
    for name, t in metrics["do_no_harm"].items():
        if isinstance(t, dict) and "p_value" in t:  # the McNemar comparisons
            lo, hi = t["ci95"]
            lines.append(f"- {name.replace('_', ' ')}: {t['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}], right only with the "
                         f"sieve {t['a_only']}, only without {t['b_only']}, exact McNemar p = {t['p_value']:.3g}: "
                         f"{verdict_in_words(t['verdict'])}")
    if tokens := metrics["do_no_harm"].get("prompt_tokens_vs_best_plain"):
        lo, hi = tokens["ci95"]
        lines.append(f"- prompt tokens, chosen vs best plain: {tokens['a']:.1f} vs {tokens['b']:.1f}, "
                     f"{tokens['change']:+.1%} [{lo:+.1%}, {hi:+.1%}] (bootstrap over the {tokens['n']} questions)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "grid.md").write_text("\n".join(lines) + "\n")
    if (sieve_dir / sel["plot"]).is_file():
        shutil.copy(sieve_dir / sel["plot"], folder / sel["plot"])
    print(f"wrote {folder / 'grid.md'} and {folder / sel['plot']}")


def regrade(fit) -> None:
    """Recalibrate the shipped default sieve's grader on the fit's dev split, nothing else.

    The grader is the sieve's reranker plus a threshold on its score; when the reranker's
    weights change (a new ``embedded:base``), the threshold must be fitted again on the
    same dev candidates. Records the new threshold next to the old one in results/fit/metrics.json.
    """
    import shutil

    from ragsieve.paths import ASSETS_DIR
    from ragsieve.pipeline.sieve_config import SieveConfig

    target = ASSETS_DIR / "sieves" / "default"
    sieve = SieveConfig.model_validate_json((target / "sieve.json").read_text())
    if sieve.reranker != fit.config.align.init or not sieve.grader:
        raise SystemExit(f"regrade: the shipped sieve's reranker is {sieve.reranker!r} and its grader {sieve.grader!r}: "
                         "only a grader on the start reranker is regraded; refit instead")
    old = json.loads((target / "grader" / "grader_config.json").read_text())
    fit.run_phase("split")
    fit.run_phase("retrieve")
    fit.reranker_spec = sieve.reranker
    fit.run_phase("grade")
    from ragsieve.fit.select import Choice

    fit._save_grader(Choice(sieve.top_k, sieve.reranker, fit.f1_thresholds[sieve.reranker], "f1"), "f1")
    new = json.loads((fit.out / "grader" / "grader_config.json").read_text())
    shutil.rmtree(target / "grader")
    shutil.copytree(fit.out / "grader", target / "grader")
    metrics = Path("results/fit/metrics.json")
    data = json.loads(metrics.read_text())
    data.setdefault("regraded", []).append({
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "reranker": sieve.reranker,
        "old_threshold": old["threshold"], "new_threshold": new["threshold"], "trained": new.get("trained"),
        "why": "embedded:base was retrained; the sieve's test metrics above predate it (make demo measures the sieve as shipped)"})
    metrics.write_text(json.dumps(data, indent=2) + "\n")
    print(f"regraded {target / 'grader'}: threshold {old['threshold']:.4f} -> {new['threshold']:.4f}")


PRUNING = ("pruner", "prune_threshold", "prune_max_sentences")


def shipped_sieve():
    """The shipped default sieve's config (None before one ships)."""
    from ragsieve.paths import ASSETS_DIR
    from ragsieve.pipeline.sieve_config import SieveConfig

    file = ASSETS_DIR / "sieves" / "default" / "sieve.json"
    return SieveConfig.model_validate_json(file.read_text()) if file.is_file() else None


def grid_scorers(config_file: str | None) -> list[str]:
    """The sentence scorers a fit with ``config_file`` tries besides zero-shot (``select.prune_scorers``)."""
    from ragsieve.config import build_config, read_mapping
    from ragsieve.fit.config import SelectConfig

    values = read_mapping(config_file).get("select") or {} if config_file else {}
    return list(build_config(SelectConfig, values, source=config_file or "defaults").prune_scorers)


def refuse_losing_the_pruner(sieve, scorers: list[str] | None = None) -> None:
    """Exit in one line when shipping ``sieve`` (None: whatever a fit trying ``scorers`` chooses) would replace a
    default that prunes with another sentence scorer (the keep head) that the fit's grid never tried: a refit whose
    answers were asked of the shipped pruner and chose otherwise is a measured choice, not a silent loss."""
    current = shipped_sieve()
    if current is None or current.pruner is None:
        return
    if sieve is not None and sieve.pruner == current.pruner:
        return
    tried = scorers if sieve is None else sorted({row.get("prune_scorer") for row in
                                                   sieve.metrics.get("selection", {}).get("grid", [])} - {None})
    if current.pruner in tried:
        return
    would = "whatever `fit` chooses without trying it (its grid: zero-shot" + "".join(
        f", {s}" for s in scorers or []) + ")" if sieve is None else (
        f"pruner {sieve.pruner!r}" if sieve.pruner else "no pruner of its own")
    raise SystemExit(f"not shipped: the default sieve prunes with {current.pruner!r} (best "
                     f"{current.prune_max_sentences} sentence(s), experiments/prune_with_head.yaml) and this sieve with "
                     f"{would}: add --keep-pruner to keep it, then check it with that study")


def ship_finished(sieve_dir: Path, result_file: Path, keep_pruner: bool = False) -> None:
    """:func:`ship` for a fit that already finished: its sieve.json and the bench result it wrote."""
    from ragsieve.pipeline.sieve_config import SieveConfig

    missing = [str(p) for p in (sieve_dir / "sieve.json", result_file) if not p.is_file()]
    if missing:
        raise SystemExit(f"--ship-finished: {', '.join(missing)} missing: run the fit to the end first")
    sieve = SieveConfig.model_validate_json((sieve_dir / "sieve.json").read_text())
    ship(sieve_dir, sieve, json.loads(result_file.read_text()), keep_pruner=keep_pruner)


def ship(sieve_dir: Path, sieve, result: dict, keep_pruner: bool = False) -> None:
    """The fitted sieve → ragsieve/assets/sieves/default (weights ≤ 50 MB each) + results/fit/metrics.json;
    with ``keep_pruner`` it prunes as the shipped default did, else a default whose pruner it drops stays."""
    import shutil

    from ragsieve.paths import ASSETS_DIR

    current = shipped_sieve()
    if keep_pruner and current is not None:
        sieve = sieve.model_copy(update={k: getattr(current, k) for k in PRUNING})
    refuse_losing_the_pruner(sieve)
    target = ASSETS_DIR / "sieves" / "default"
    # the top-level files and only the folders sieve.json uses: an aligned reranker the selection did not
    # choose stays out of git; the size check reads exactly what the copy below takes
    keep = {p.name for p in sieve_dir.iterdir() if p.is_file() and p.name != "README.md"}
    keep |= {v for v in (sieve.probe, sieve.reranker, sieve.grader) if v and (sieve_dir / v).is_dir()}

    skipped_inside = {"work", "checkpoints"}

    def left_out(folder: str, names: list[str]) -> set[str]:
        if Path(folder) == sieve_dir:
            return {n for n in names if n not in keep}
        return {n for n in names if n in skipped_inside}

    shipped = [p for name in sorted(keep) for p in ([sieve_dir / name] if (sieve_dir / name).is_file()
                                                    else (sieve_dir / name).rglob("*"))
               if p.is_file() and not skipped_inside & set(p.relative_to(sieve_dir).parts[1:-1])]
    big = [p for p in shipped if p.stat().st_size > 50 * 2**20]
    if big:
        raise SystemExit(f"not shipped: {', '.join(map(str, big))} over 50 MB")
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(sieve_dir, target, ignore=left_out)
    (target / "sieve.json").write_text(sieve.model_dump_json(indent=2) + "\n")  # with the kept pruning, if any
    results = Path("results/fit")
    results.mkdir(parents=True, exist_ok=True)
    (results / "metrics.json").write_text(json.dumps({"shipped_sieve": json.loads(sieve.model_dump_json()),
                                                      "bench": {k: v for k, v in result.items() if k != "sieve_metrics"}},
                                                     indent=2) + "\n")
    print(f"shipped {target} ({sum(p.stat().st_size for p in target.rglob('*') if p.is_file()) / 2**20:.1f} MB)")


if __name__ == "__main__":
    main()
