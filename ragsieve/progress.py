"""Progress from deep inside long loops, without threading a callback through every call.

A loop calls :func:`report` (``"train", step, steps``); whoever started the work — a CLI
command drawing a rich progress bar, a study — installs a reporter with :func:`reporting`.
Nothing is reported (and nothing costs anything) when no reporter is installed. The
reporter lives in a context variable, so concurrent requests or threads do not mix.

Example::

    with reporting(lambda task, done, total: print(task, done, total)):
        run_step("store/")        # prints "score 8 64", ..., "train 1 12", ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Reporter = Callable[[str, int, int], None]

_reporter: ContextVar[Reporter | None] = ContextVar("ragsieve_progress", default=None)


def report(task: str, done: int, total: int) -> None:
    """Tell the installed reporter (if any) that ``done`` of ``total`` units of ``task`` are finished."""
    fn = _reporter.get()
    if fn is not None:
        fn(task, done, total)


@contextmanager
def reporting(fn: Reporter) -> Iterator[None]:
    """Install ``fn`` as the reporter for the code run inside the ``with`` block."""
    token = _reporter.set(fn)
    try:
        yield
    finally:
        _reporter.reset(token)
