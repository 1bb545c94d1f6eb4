"""`make demo`: the main job on embedded defaults.

Builds a hybrid index over the NQ oracle passage pool and answers held-out NQ questions
with the embedded SmolLM2 three ways: closed-book, plain top-k retrieval, and through the
shipped default sieve (``embedded:default``: CBDR gate → rerank 20 candidates → grade →
prune → generate), and the same sieve with its passages whole (or pruned, ``prune_threshold``, when the
sieve keeps them whole). Prints accuracy with 95 % intervals and prompt tokens, the paired McNemar test of
the sieve against plain top-k and of pruned against whole passages, and one question's stage-by-stage trace (what ``ask --explain`` shows), then
writes ``metrics.json`` plus every prediction (for auditing: question and context ids, the answer and
whether it is right) to ``$RAGSIEVE_CACHE/demo``, so a
demo run leaves the checkout untouched (``--config`` with ``out_dir: results/demo`` refreshes
the committed copy).
"""

from __future__ import annotations

import json
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ragsieve.config import StrictConfig
from ragsieve.models.specs import DEFAULT_ENCODER, DEFAULT_LLM
from ragsieve.progress import results_console


class DemoConfig(StrictConfig):
    dataset: str = "nq-oracle"
    split_seed: int = 0
    test_fraction: float = 0.2
    n_questions: int = 50
    index_kind: str = "hybrid"
    top_k: int = 3
    llm: str = DEFAULT_LLM
    encoder: str = DEFAULT_ENCODER
    max_new_tokens: int = 16
    max_prompt_tokens: int = 1024
    batch_size: int = 8
    data_dir: str | None = None
    sieve: str | None = "embedded:default"  # None: only closed-book and plain top-k
    # the sieve's prune threshold (raw) for a "sieve_pruned" row when the sieve itself keeps passages whole;
    # a sieve that prunes gets a "sieve_whole" row (the same sieve, pruning off) instead
    prune_threshold: float | None = None
    out_dir: str = ""  # "" = $RAGSIEVE_CACHE/demo (outside the checkout)


def run_demo(cfg: DemoConfig, console: Console | None = None) -> dict:
    """Answer the held-out questions every way (closed-book, plain top-k, the sieve and its variants), then
    write ``metrics.json`` and ``predictions.jsonl`` and print the comparison."""
    from ragsieve.data import write_jsonl
    from ragsieve.paths import cache_dir

    console = console or results_console()
    t0 = time.perf_counter()
    dataset, questions = _held_out(cfg, console)
    retriever, index_reused, index_seconds = _index(cfg, dataset, console)
    modes, selection, best_k = _modes(cfg, retriever, console)
    metrics, predictions, outcomes, tokens, traced = _answer_modes(cfg, modes, questions)
    paired = _paired_tests(cfg, outcomes, tokens, best_k)

    result = {
        "config": cfg.model_dump(),
        "n_questions": len(questions),
        "n_pool_passages": len(dataset.passages),
        "index_seconds": index_seconds,
        "index_reused": index_reused,
        "metrics": metrics,
        "paired": paired,
        # what fit chose by the LLM's answers (None: a sieve fitted before it did)
        "sieve_chosen": {k: selection.get(k) for k in ("chosen", "best_plain", "shipped", "note")} if selection
        else None,
        "total_seconds": time.perf_counter() - t0,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    out = Path(cfg.out_dir) if cfg.out_dir else cache_dir() / "demo"
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
    write_jsonl(out / "predictions.jsonl", predictions)

    _print_metrics_table(cfg, len(questions), metrics, console)
    _print_selection(cfg, selection, metrics, console)
    _print_paired(paired, console)
    if traced is not None:
        from ragsieve.pipeline.explain import print_explain

        console.rule(f"one question through the sieve: {traced.question}")
        print_explain(traced, console)
        console.print(traced.answer)
    console.print(f"wrote {out / 'metrics.json'} ({result['total_seconds']:.0f}s total)")
    return result


def _held_out(cfg: DemoConfig, console: Console) -> tuple:
    """The dataset and the first ``n_questions`` of its held-out questions, said on the console."""
    from ragsieve.data import held_out_questions, load_dataset

    dataset = load_dataset(cfg.dataset, data_dir=cfg.data_dir)
    questions = held_out_questions(dataset.questions, cfg.test_fraction, cfg.split_seed)[: cfg.n_questions]
    console.print(
        f"[bold]{cfg.dataset}[/]: {len(dataset.questions)} questions, {len(dataset.passages)} pool passages; "
        f"{len(questions)} held-out questions"
    )
    return dataset, questions


def _index(cfg: DemoConfig, dataset, console: Console) -> tuple:
    """The pool's index (built, or loaded from the cache), whether it was reused, and the seconds it took."""
    from ragsieve.retrieve.cached import build_or_load_index

    t_index = time.perf_counter()
    retriever, index_reused = build_or_load_index(cfg.dataset, dataset.passages, cfg.index_kind, cfg.encoder)
    index_seconds = time.perf_counter() - t_index
    console.print(f"{cfg.index_kind} index {'loaded from cache' if index_reused else 'built'} in {index_seconds:.1f}s")
    return retriever, index_reused, index_seconds


def _modes(cfg: DemoConfig, retriever, console: Console) -> tuple[dict, dict, int | None]:
    """Each mode's pipeline and whether it retrieves, in the order they run and are reported; what fit chose
    for the sieve (empty without one) and fit's best plain top-k on dev (None: it chose none)."""
    from ragsieve.pipeline import PipelineConfig, RAGPipeline

    pipeline = PipelineConfig(
        llm=cfg.llm, top_k=cfg.top_k, max_new_tokens=cfg.max_new_tokens,
        max_prompt_tokens=cfg.max_prompt_tokens, batch_size=cfg.batch_size,
    )
    pipe = RAGPipeline.from_config(pipeline, retriever=retriever)
    modes: dict[str, tuple[RAGPipeline, bool]] = {"closed_book": (pipe, False), f"rag_top{cfg.top_k}": (pipe, True)}
    selection: dict = {}
    best_k = None  # fit's best plain top-k on dev, for a sieve it chose by answers
    if cfg.sieve and _sieve_fits(cfg, console):  # gate → rerank → grade, sharing the loaded LLM and index
        sieve_config = PipelineConfig(sieve=cfg.sieve, max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size)
        sieved = RAGPipeline.from_config(sieve_config, llm=pipe.llm, retriever=retriever)
        modes["sieve"] = (sieved, True)
        # with and without sentence pruning: the same sieve, only the prune step differs
        if sieved.pruner is not None:
            modes["sieve_whole"] = (_with_pruner(sieved, None), True)
        elif cfg.prune_threshold is not None and sieved.reranker is not None:
            from ragsieve.prune import SentencePruner

            modes["sieve_pruned"] = (_with_pruner(sieved, SentencePruner(sieved.reranker, cfg.prune_threshold)), True)
        selection = _fit_selection(cfg)
        best_k = selection.get("in_sample", selection.get("dev", {})).get("best_plain", {}).get("k")
        if best_k and best_k != cfg.top_k:  # fit's best plain configuration: the retriever's top k it chose on dev
            plain = pipeline.model_copy(update={"top_k": best_k})
            modes[f"rag_top{best_k}"] = (RAGPipeline.from_config(plain, llm=pipe.llm, retriever=retriever), True)
    return modes, selection, best_k


def _answer_modes(cfg: DemoConfig, modes: dict, questions: list) -> tuple:
    """Every mode's answers to the questions: per mode its metrics, each question's outcome (1 = right) and
    prompt tokens; every prediction (ids, not the dataset's text); the sieve's answer to trace (None: no sieve)."""
    from ragsieve.eval.qa import contains_answer

    texts = [q.text for q in questions]
    golds = [q.answers for q in questions]
    metrics: dict[str, dict] = {}
    predictions: list[dict] = []
    outcomes: dict[str, list[int]] = {}
    tokens: dict[str, list[int]] = {}  # each question's prompt tokens, for the paired token change
    traced = None
    for mode, (runner, use_retrieval) in modes.items():
        start = time.perf_counter()
        answers = _answer(mode, runner, texts, use_retrieval)
        seconds = time.perf_counter() - start
        outcomes[mode] = [int(contains_answer(a.answer, g)) for a, g in zip(answers, golds)]
        tokens[mode] = [a.prompt_tokens for a in answers]
        metrics[mode] = _mode_metrics(cfg, mode, answers, questions, outcomes[mode], seconds, use_retrieval)
        if mode == "sieve":
            traced = next((a for a in answers if a.retrieved and a.candidates), answers[0])
        for q, a, right in zip(questions, answers, outcomes[mode]):
            # ids, not the dataset's question and answer text (the committed copy stays free of it)
            predictions.append({"mode": mode, "id": q.id, "prediction": a.answer, "correct": right,
                                "contexts": [p.id for p in a.contexts]})
    return metrics, predictions, outcomes, tokens, traced


def _answer(mode: str, runner, texts: list[str], use_retrieval: bool) -> list:
    """One mode's answers, its generation batches shown on a progress bar (stderr) as they finish."""
    from ragsieve.progress import progress_bar, reporting

    with progress_bar() as bar:
        task = bar.add_task(f"demo {mode}: answering", total=len(texts))

        def show(name: str, done: int, total: int) -> None:
            if name == "generate":  # the LLM's batches (a gate or reranker may report its own work too)
                bar.update(task, completed=done, total=total)

        with reporting(show):
            return runner.answer_many(texts, retrieve=use_retrieval)


def _mode_metrics(cfg: DemoConfig, mode: str, answers: list, questions: list, outcome: list[int], seconds: float,
                  use_retrieval: bool) -> dict:
    """One mode's row of ``metrics.json``: accuracy with its interval, EM, F1, time and prompt tokens per
    question; the gold passage's recall and truncations when it retrieves; the sieve's retrieval rate and
    passages graded out."""
    from ragsieve.eval import qa_metrics
    from ragsieve.eval.classification import accuracy_interval

    m = qa_metrics([a.answer for a in answers], [q.answers for q in questions])
    m["ci95"] = list(accuracy_interval(sum(outcome), len(answers)))
    m["seconds_per_question"] = seconds / max(len(questions), 1)
    m["prompt_tokens"] = sum(a.prompt_tokens for a in answers) / max(len(answers), 1)
    if use_retrieval:
        hit = [bool(set(q.gold_passage_ids) & {p.id for p in a.contexts}) for q, a in zip(questions, answers)]
        m[f"gold_in_top{cfg.top_k}"] = sum(hit) / max(len(hit), 1)
        m["truncated_contexts"] = sum(a.truncated_contexts for a in answers)
    if mode.startswith("sieve"):
        m["retrieval_rate"] = sum(a.retrieved for a in answers) / len(answers)
        m["graded_out_per_question"] = sum(a.graded_out for a in answers) / len(answers)
    return m


def _paired_tests(cfg: DemoConfig, outcomes: dict, tokens: dict, best_k: int | None) -> dict:
    """McNemar on the same questions, with the relative prompt-token change: the sieve against plain top-k
    (and fit's best plain top-k), and pruned against whole passages. Empty without a sieve."""
    from ragsieve.eval.stats import mcnemar_exact, relative_mean_change

    paired = {}
    if "sieve" in outcomes:
        versus = {"sieve_vs_rag": f"rag_top{cfg.top_k}"}
        if best_k:
            versus["sieve_vs_best_plain"] = f"rag_top{best_k}"
        pairs = [("sieve", name, plain) for name, plain in versus.items()]
        if "sieve_whole" in outcomes:
            pairs.append(("sieve", "pruned_vs_whole", "sieve_whole"))
        if "sieve_pruned" in outcomes:
            pairs.append(("sieve_pruned", "pruned_vs_whole", "sieve"))
        for mode, name, plain in pairs:
            paired[name] = {**mcnemar_exact(outcomes[mode], outcomes[plain]).to_dict(), "mode": mode, "plain": plain,
                            "prompt_tokens": relative_mean_change(tokens[mode], tokens[plain])}
    return paired


def _print_metrics_table(cfg: DemoConfig, n_questions: int, metrics: dict, console: Console) -> None:
    """One row per mode: accuracy with its interval, EM, F1, retrieval rate, prompt tokens, seconds."""
    table = Table(title=f"{cfg.dataset}: {n_questions} held-out questions, {cfg.llm}")
    for col in ("mode", "accuracy (contains)", "95 % CI", "EM", "F1", "retrieved", "prompt tokens", "s / question"):
        table.add_column(col, justify="right" if col != "mode" else "left", no_wrap=col == "mode")
    for mode, m in metrics.items():
        rate = m.get("retrieval_rate", 1.0 if mode != "closed_book" else 0.0)
        table.add_row(mode, f"{m['accuracy']:.3f}", f"[{m['ci95'][0]:.3f}, {m['ci95'][1]:.3f}]", f"{m['em']:.3f}",
                      f"{m['f1']:.3f}", f"{rate:.0%}", f"{m['prompt_tokens']:.0f}", f"{m['seconds_per_question']:.2f}")
    console.print(table)


def _print_selection(cfg: DemoConfig, selection: dict, metrics: dict, console: Console) -> None:
    """What fit chose for the sieve on dev, or that it was fitted before fit chose by answers."""
    if selection:
        console.print(f"the sieve fit chose on dev: {selection.get('shipped')} (best plain on dev: "
                      f"{selection.get('best_plain')})" + (f"; {selection['note']}" if selection.get("note") else ""))
    elif "sieve" in metrics:
        console.print(f"[dim]{cfg.sieve} was fitted before fit chose sieves by answers: no best plain configuration "
                      "to compare with[/]")


def _print_paired(paired: dict, console: Console) -> None:
    """Each paired test in a sentence: who was right alone, p and its verdict, the prompt-token change."""
    from ragsieve.eval.stats import verdict_in_words

    for t in paired.values():
        size = t["prompt_tokens"]
        low, high = size["ci95"]
        console.print(f"{t.get('mode', 'sieve')} vs {t['plain']}, paired McNemar on the same {t['n']} questions: "
                      f"right only with the first {t['a_only']}, only with the second {t['b_only']}, "
                      f"p = {t['p_value']:.3f} → "
                      f"{verdict_in_words(t['verdict'])}; prompt tokens {size['a']:.0f} vs {size['b']:.0f}, "
                      f"{size['change']:+.0%} [{low:+.0%}, {high:+.0%}] (bootstrap over questions)")


def _with_pruner(pipe, pruner):
    """The same pipeline (components shared) with another pruner (None: passages stay whole)."""
    from copy import copy

    other = copy(pipe)
    other.pruner = pruner
    return other


def _fit_selection(cfg: DemoConfig) -> dict:
    """What ``fit`` chose for the sieve by the LLM's answers (empty for a sieve fitted before it did)."""
    from ragsieve.pipeline.sieve_config import read_sieve_config

    return read_sieve_config(cfg.sieve).metrics.get("selection") or {}


def _sieve_fits(cfg: DemoConfig, console: Console) -> bool:
    """The sieve was fitted for the demo's LLM (its probe reads that LLM's states); else it is skipped, said why."""
    from ragsieve.errors import RagsieveError
    from ragsieve.models.specs import ModelSpec
    from ragsieve.pipeline.sieve_config import read_sieve_config

    try:
        fitted_for = read_sieve_config(cfg.sieve).llm
    except RagsieveError as exc:
        console.print(f"[yellow]sieve skipped: {exc}[/]")
        return False
    if str(ModelSpec.parse(fitted_for)) != str(ModelSpec.parse(cfg.llm)):
        console.print(f"[dim]sieve skipped: {cfg.sieve} was fitted for {fitted_for}, not {cfg.llm}[/]")
        return False
    return True
