"""``evolve:<store>``: the evolving reranker an evolve store serves, after its last finished round.

:mod:`ragsieve.evolve.store` trains it; serving needs only what is read here, straight from the
store's SQLite file: the recipe saved at ``ragsieve evolve init`` (LLM, verdict template, budget)
and the finished rounds' LoRA deltas. The store reads both through these functions too, so the
queries have one home and the spec resolves below the training code. ``POST /admin/reload``
after ``ragsieve evolve step`` serves the new round without a restart.

Example::

    load_reranker("evolve:state/fever").rank("who wrote hamlet", ["Hamlet is by Shakespeare.", "Paris"])
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from ragsieve.artifacts import STORE_REBUILD, sqlite_error
from ragsieve.errors import RagsieveError
from ragsieve.rerank.pointwise import PointwiseLLMReranker

DB_FILE = "evolve.sqlite"


def missing_store(store_dir: str | Path) -> RagsieveError:
    return RagsieveError(f"no evolve store at {store_dir} (run `ragsieve evolve init` first)")


def store_config_json(conn: sqlite3.Connection, store_dir: str | Path) -> dict:
    """The store's saved configuration (``EvolveStoreConfig`` as JSON: every field, defaults included)."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()
    if row is None:
        raise RagsieveError(f"evolve store {store_dir} has no configuration (run `ragsieve evolve init`)")
    return json.loads(row[0])


def finished_adapters(conn: sqlite3.Connection, store_dir: str | Path) -> list[Path]:
    """The deltas of the finished rounds, in order (rounds that trained nothing have none)."""
    rows = conn.execute("SELECT adapter FROM rounds WHERE adapter IS NOT NULL ORDER BY round")
    return [Path(store_dir) / r[0] for r in rows]


def load_evolving_reranker(store_dir: str) -> PointwiseLLMReranker:
    """The store's pointwise verdict LLM with every finished round's delta applied."""
    db = Path(store_dir) / DB_FILE
    if not db.is_file():
        raise missing_store(store_dir)
    conn = sqlite3.connect(db, timeout=60)
    try:
        config, adapters = store_config_json(conn, store_dir), finished_adapters(conn, store_dir)
    except sqlite3.Error as exc:
        raise sqlite_error(db, exc, STORE_REBUILD) from None
    finally:
        conn.close()
    from ragsieve.prompts.verdicts import stored_template

    template = stored_template(config["template"], config.get("template_spec"))  # a user's template is saved whole
    return PointwiseLLMReranker(
        template, config["llm"], adapters=adapters, max_prompt_tokens=config["max_prompt_tokens"],
        batch_size=config["batch_size"],
    )
