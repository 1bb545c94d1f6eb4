"""``evolve:<store>``: the evolving reranker an evolve store serves, after its last finished round.

:mod:`ragsieve.evolve.store` trains it; serving needs only what is read here, straight from the
store's rows (SQLite or PostgreSQL, :mod:`ragsieve.evolve_db`, whose queries the store shares):
the recipe saved at ``ragsieve evolve init`` (LLM, verdict template, budget) and the finished
rounds' LoRA deltas. ``POST /admin/reload``
after ``ragsieve evolve step`` serves the new round without a restart.

Example::

    load_reranker("evolve:state/fever").rank("who wrote hamlet", ["Hamlet is by Shakespeare.", "Paris"])
"""

from __future__ import annotations

from ragsieve.evolve_db import database_error, finished_adapters, locate_store, open_database, store_config_json
from ragsieve.rerank.pointwise import PointwiseLLMReranker


def load_evolving_reranker(store_dir: str) -> PointwiseLLMReranker:
    """The store's pointwise verdict LLM with every finished round's delta applied (rows in the store
    folder's SQLite file, or in the PostgreSQL database its ``evolve.database`` names)."""
    from sqlalchemy.exc import SQLAlchemyError

    location = locate_store(store_dir)
    folder = location.need_dir("evolve:<store> (its adapters)")
    engine = open_database(location)
    try:
        with engine.connect() as conn:
            config, adapters = store_config_json(conn, location.label), finished_adapters(conn, folder)
    except SQLAlchemyError as exc:
        raise database_error(location, exc) from None
    from ragsieve.prompts.verdicts import stored_template

    template = stored_template(config["template"], config.get("template_spec"))  # a user's template is saved whole
    return PointwiseLLMReranker(
        template, config["llm"], adapters=adapters, max_prompt_tokens=config["max_prompt_tokens"],
        batch_size=config["batch_size"],
    )
