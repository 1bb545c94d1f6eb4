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


#: libraries whose log lines are noise in a command's output (their errors still show)
NOISY_LOGGERS = ("transformers", "sentence_transformers", "huggingface_hub", "torch", "onnxruntime", "openvino",
                 "datasets", "accelerate", "ray", "uvicorn.error")


def quiet_third_parties(verbose: bool = False) -> None:
    """Third-party progress bars and warnings off (unless ``--verbose``): transformers' "Loading weights" bars
    put carriage returns into logs, and an ONNX export prints ``TracerWarning`` s the user can do nothing about.
    ragsieve's own warnings and progress lines still show."""
    import warnings

    # huggingface_hub reads this at import, and transformers' bars follow it; set before either is imported
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "0" if verbose else "1")
    # ... and libraries that re-enable them would warn about the variable once per call
    warnings.filterwarnings("ignore", message="Cannot enable progress bars")
    if verbose:
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", module=r"ragsieve(\.|$)")  # checked before: ragsieve's own warnings stay
    # checked first: a library's deprecation raised where ragsieve calls it is for ragsieve's developers
    for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = sys.argv[1:] if argv is None else argv
    quiet_third_parties(verbose="--verbose" in args)
    try:
        app(args=args, standalone_mode=False)
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
