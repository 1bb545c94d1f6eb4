"""The studies behind ``results/``: one module per ``experiments/*.yaml``.

They live in the source checkout, not in the installed package: ``pip install ragsieve`` ships the library
alone, and ``ragsieve run experiments/<study>.yaml`` finds this package beside the config (or the working
folder). Studies sit above the library: they may import any of it, and no library module imports them
(pyproject.toml's import contracts). ``common`` holds what only they share (baseline rankers, atomic JSON,
the CBDR plot).
"""
