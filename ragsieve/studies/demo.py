"""`make demo`: the main job on embedded defaults.

Builds a hybrid index over the NQ oracle passage pool, answers held-out NQ questions
closed-book and with top-k retrieval using the embedded SmolLM2, prints a table and
writes ``results/demo/metrics.json`` plus every prediction (for auditing).
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
    out_dir: str = "results/demo"


def run_demo(cfg: DemoConfig, console: Console | None = None) -> dict:
    from ragsieve.data import held_out_questions, load_dataset, write_jsonl
    from ragsieve.eval import qa_metrics
    from ragsieve.pipeline import PipelineConfig, RAGPipeline
    from ragsieve.retrieve.cached import build_or_load_index

    console = console or Console()
    t0 = time.perf_counter()
    dataset = load_dataset(cfg.dataset, data_dir=cfg.data_dir)
    questions = held_out_questions(dataset.questions, cfg.test_fraction, cfg.split_seed)[: cfg.n_questions]
    console.print(
        f"[bold]{cfg.dataset}[/]: {len(dataset.questions)} questions, {len(dataset.passages)} pool passages; "
        f"{len(questions)} held-out questions"
    )

    t_index = time.perf_counter()
    retriever, index_reused = build_or_load_index(cfg.dataset, dataset.passages, cfg.index_kind, cfg.encoder)
    index_seconds = time.perf_counter() - t_index
    console.print(f"{cfg.index_kind} index {'loaded from cache' if index_reused else 'built'} in {index_seconds:.1f}s")

    pipeline = PipelineConfig(
        llm=cfg.llm, top_k=cfg.top_k, max_new_tokens=cfg.max_new_tokens,
        max_prompt_tokens=cfg.max_prompt_tokens, batch_size=cfg.batch_size,
    )
    pipe = RAGPipeline.from_config(pipeline, retriever=retriever)
    texts = [q.text for q in questions]
    golds = [q.answers for q in questions]
    modes = {"closed_book": False, f"rag_top{cfg.top_k}": True}
    metrics: dict[str, dict] = {}
    predictions: list[dict] = []
    for mode, use_retrieval in modes.items():
        start = time.perf_counter()
        answers = pipe.answer_many(texts, retrieve=use_retrieval)
        seconds = time.perf_counter() - start
        m = qa_metrics([a.answer for a in answers], golds)
        m["seconds_per_question"] = seconds / max(len(questions), 1)
        if use_retrieval:
            hit = [bool(set(q.gold_passage_ids) & {p.id for p in a.contexts}) for q, a in zip(questions, answers)]
            m[f"gold_in_top{cfg.top_k}"] = sum(hit) / max(len(hit), 1)
            m["truncated_contexts"] = sum(a.truncated_contexts for a in answers)
        metrics[mode] = m
        for q, a in zip(questions, answers):
            predictions.append(
                {"mode": mode, "id": q.id, "question": q.text, "answers": list(q.answers), "prediction": a.answer,
                 "contexts": [p.id for p in a.contexts]}
            )

    result = {
        "config": cfg.model_dump(),
        "n_questions": len(questions),
        "n_pool_passages": len(dataset.passages),
        "index_seconds": index_seconds,
        "index_reused": index_reused,
        "metrics": metrics,
        "total_seconds": time.perf_counter() - t0,
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
    write_jsonl(out / "predictions.jsonl", predictions)

    table = Table(title=f"{cfg.dataset}: {len(questions)} held-out questions, {cfg.llm}")
    for col in ("mode", "accuracy (contains)", "EM", "F1", "s / question"):
        table.add_column(col, justify="right" if col != "mode" else "left")
    for mode, m in metrics.items():
        table.add_row(mode, f"{m['accuracy']:.3f}", f"{m['em']:.3f}", f"{m['f1']:.3f}", f"{m['seconds_per_question']:.2f}")
    console.print(table)
    console.print(f"wrote {out / 'metrics.json'} ({result['total_seconds']:.0f}s total)")
    return result
