"""The tests' throwaway PostgreSQL: its home is ``tools/postgres.py`` (shared with the benches, which
must not import from ``tests/``); this name stays so ``from tests.postgres import ...`` keeps working."""

from tools.postgres import SUPERUSER, PostgresServer, pgvector_bin_dir, skip_reason

__all__ = ["SUPERUSER", "PostgresServer", "pgvector_bin_dir", "skip_reason"]
