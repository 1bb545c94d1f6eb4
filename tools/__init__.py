"""The checkout's own tooling: docs and results checks, and the throwaway PostgreSQL (``tools.postgres``)
that the tests and the benches share. Run from a checkout; not part of the installed package."""
