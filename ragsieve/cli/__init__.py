"""The ``ragsieve`` command line (typer + rich): one module per command group.

Every command turns a :class:`~ragsieve.errors.RagsieveError` into one red line and
exit code 2, so bad input never ends in a traceback. Command modules import their ML
code inside the commands, so ``ragsieve --help`` stays fast.
"""

from __future__ import annotations

import logging
import os
import sys

import typer

# Import order is the order of `ragsieve --help`.
from ragsieve.cli import data, ask, fit, rerank, grade, probe, run, evolve, feedback, serve  # noqa: F401, I001 - registers the commands
from ragsieve.cli.app import app, err_console
from ragsieve.errors import RagsieveError


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # transformers draws a "Loading weights" bar per model load (four per demo); ragsieve draws its own
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import warnings  # ... and libraries that re-enable them would warn about the variable once per call

    warnings.filterwarnings("ignore", message="Cannot enable progress bars")
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

        # typer >= 0.20 raises from its own copy of click (typer._click), whose classes are not click's
        usage_error = isinstance(exc, click.ClickException) or type(exc).__module__.startswith("typer._click")
        if usage_error and callable(getattr(exc, "show", None)):
            exc.show()
            return int(getattr(exc, "exit_code", 2))
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
