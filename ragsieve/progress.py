"""Progress: the one place ragsieve shows how far a long job has got, on stderr.

Two halves:

- **Showing it.** :func:`progress_bar` is what every command and study draws with. On a
  terminal it is a rich progress bar; when stderr is not a terminal (a CI job, ``nohup``,
  a scheduler, ``2>log``) rich would draw nothing until the end, so it prints plain lines
  instead: one when a task starts, then every :data:`LOG_EVERY_FRACTION` of it or every
  :data:`LOG_EVERY_SECONDS` (``$RAGSIEVE_PROGRESS_SECONDS``), with done / total, rate and
  time left, and one when it ends. Either way nothing goes to stdout, which holds results.
- **Reporting it** from deep inside long loops, without threading a callback through every
  call: a loop calls :func:`report` (``"train", step, steps``); whoever started the work
  installs a reporter with :func:`reporting`. Nothing is reported (and nothing costs
  anything) when no reporter is installed. The reporter lives in a context variable, so
  concurrent requests or threads do not mix.

Example::

    with progress_bar() as bar:
        task = bar.add_task("encoding", total=len(texts))
        for batch in batches:
            encode(batch)
            bar.advance(task, len(batch))     # a log gets "encoding: 120/1,200 (10%), 41.2/s, 26s left"

    with reporting(lambda task, done, total: print(task, done, total)):
        run_step("store/")        # prints "score 8 64", ..., "train 1 12", ...
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

#: a log line every time a task gets this much further (a share of its total) ...
LOG_EVERY_FRACTION = 0.10
#: ... or this many seconds after its last line, whichever comes first
LOG_EVERY_SECONDS = 30.0

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


@contextmanager
def showing_reports(console: "Console | None" = None) -> Iterator[None]:
    """Show what the code inside the ``with`` block reports (:func:`report`): one :func:`progress_bar` task
    per reported name (a name reported again after it finished, e.g. each round's ``train``, starts again).

    For a command or study that runs library code with progress deep inside (training steps, LLM
    scoring batches) and no bar of its own for it::

        with showing_reports():
            run_step("store/")      # a log gets "train: started, 126 to do", "train: 13/126 (10%), ..."
    """
    with progress_bar(console) as bar:
        tasks: dict[str, Any] = {}

        def show(task: str, done: int, total: int) -> None:
            if task not in tasks:
                tasks[task] = bar.add_task(task, total=total)
            bar.update(tasks[task], completed=done, total=total)

        with reporting(show):
            yield


# -- showing it ------------------------------------------------------------------------------------


@dataclass
class _Task:
    description: str
    total: int | None
    completed: float
    started: float = field(default_factory=time.monotonic)
    start_done: float = 0.0  # what was already done when it started (a resumed job): not in the rate
    last_line: float = 0.0
    last_bucket: int = -1
    finished: bool = False
    announced: bool = False
    total_when_added: bool = False


def _count(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _rate(per_second: float) -> str:
    if per_second >= 10:
        return f"{per_second:,.0f}/s"
    return f"{per_second:.1f}/s" if per_second >= 1 else f"{per_second:.2f}/s"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class LogProgress:
    """The part of ``rich.progress.Progress`` ragsieve uses, printing plain lines to stderr.

    Lines look like ``encoding: 600/1,200 (50%), 41.2/s, 15s left`` — greppable, one per
    event, nothing redrawn. A task's first line comes with its first report, not when it is
    added, so an input error raised before any work is still the only line on stderr.
    """

    def __init__(self, every_fraction: float = LOG_EVERY_FRACTION, every_seconds: float | None = None):
        self.every_fraction = every_fraction
        self.every_seconds = every_seconds if every_seconds is not None else _seconds_from_env()
        self._tasks: list[_Task] = []

    def __enter__(self) -> "LogProgress":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def note(self, text: str) -> None:
        """A line of its own (a phase starting, a decision), between the progress lines."""
        print(text, file=sys.stderr, flush=True)

    def add_task(self, description: str, total: float | None = None, completed: float = 0, **_: Any) -> int:
        self._tasks.append(_Task(description, None if total is None else int(total), completed, start_done=completed,
                                 total_when_added=total is not None))
        return len(self._tasks) - 1

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def update(self, task_id: int, *, completed: float | None = None, total: float | None = None,
               advance: float | None = None, **_: Any) -> None:
        task = self._tasks[task_id]
        if task.finished and completed is not None and completed < (total if total is not None else task.total or 0):
            # a finished task given new work (a phase's next step, reported under its name): it starts again,
            # or a log stays silent through that step (the fit's grid after its rankings: ~1 h)
            # new work from nothing: what its first report says is done was done in this run, not before it
            task.finished, task.announced, task.total_when_added = False, False, True
            task.started, task.start_done = time.monotonic(), 0.0
        if total is not None:
            task.total = int(total)
        if not task.announced:
            if not task.total_when_added and completed is not None:
                task.start_done = completed  # no total when added: the first report says what a resumed job found
            self._announce(task, clock_from_add=task.total_when_added)
        if completed is not None:
            task.completed = completed
        if advance is not None:
            task.completed += advance
        self._maybe_line(task)

    def start_task(self, task_id: int) -> None:
        """Say the task has started (its clock starts now) before its first report, as rich does."""
        task = self._tasks[task_id]
        if not task.announced:
            self._announce(task)

    def _announce(self, task: _Task, clock_from_add: bool = False) -> None:
        task.announced = True
        if not clock_from_add:  # a task added with its total was started then; otherwise it starts now
            task.started = time.monotonic()
        task.last_line = time.monotonic()
        if task.total is None:
            self.note(f"{task.description}: started")
        elif task.start_done >= task.total:
            return  # nothing left to do at its first report: the "done" line says it all
        elif task.start_done:
            self.note(f"{task.description}: started, {_count(task.start_done)}/{_count(task.total)} already done")
        else:
            self.note(f"{task.description}: started, {_count(task.total)} to do")
        task.last_bucket = self._bucket(task, task.start_done)

    def _bucket(self, task: _Task, done: float) -> int:
        if not task.total or self.every_fraction <= 0:
            return 0
        return int(done / task.total / self.every_fraction + 1e-9)

    def _maybe_line(self, task: _Task) -> None:
        if task.finished:
            return
        now = time.monotonic()
        if task.total is not None and task.completed >= task.total:
            task.finished = True
            elapsed = now - task.started
            done = task.completed - task.start_done
            rate = f", {_rate(done / elapsed)}" if elapsed > 0 and done > 0 and task.total > 1 else ""
            self.note(f"{task.description}: done, {_count(task.completed)}/{_count(task.total)} "
                      f"in {_duration(elapsed)}{rate}")
            return
        bucket = self._bucket(task, task.completed)
        if bucket > task.last_bucket or now - task.last_line >= self.every_seconds:
            task.last_bucket, task.last_line = bucket, now
            self.note(f"{task.description}: {self._status(task, now)}")

    @staticmethod
    def _status(task: _Task, now: float) -> str:
        if task.total is None:
            return f"{_count(task.completed)} done"
        share = task.completed / task.total if task.total else 1.0
        text = f"{_count(task.completed)}/{_count(task.total)} ({share:.0%})"
        elapsed, done = now - task.started, task.completed - task.start_done
        if elapsed > 0 and done > 0:
            rate = done / elapsed
            text += f", {_rate(rate)}, {_duration((task.total - task.completed) / rate)} left"
        return text


def _seconds_from_env() -> float:
    try:
        return float(os.environ.get("RAGSIEVE_PROGRESS_SECONDS", LOG_EVERY_SECONDS))
    except ValueError:
        return LOG_EVERY_SECONDS


def _bar_class() -> type:
    from rich.progress import Progress

    class BarProgress(Progress):
        """rich's bar, plus :meth:`LogProgress.note` (printed above the bar)."""

        def note(self, text: str) -> None:
            self.console.print(text, markup=False, highlight=False)

    return BarProgress


def progress_bar(console: "Console | None" = None) -> "Progress | LogProgress":
    """The one progress display: a rich bar on a terminal, plain lines in a log; always on stderr.

    ``console`` is a stderr console to draw the bar on (default: a new one); a stdout console
    is not used, so progress never mixes with a command's results. Use it as a context manager;
    ``add_task`` / ``update`` / ``advance`` as in ``rich.progress``, ``note(text)`` for a line.
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

    err = console if console is not None and console.stderr else Console(stderr=True)
    if not (err.is_terminal or err.is_jupyter):
        return LogProgress()
    return _bar_class()(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=err
    )


#: a file or a pipe has no width: rich would lay tables out in 80 columns and cut their headers ("accura…"), so
#: results printed there get this many (a table narrower than it is not padded)
FILE_WIDTH = 240


def results_console(stderr: bool = False) -> "Console":
    """The console results are printed with: a terminal's own width; into a file or a pipe (``make demo > log``)
    :data:`FILE_WIDTH` columns, so a table keeps whole rows (``$COLUMNS`` still wins)."""
    from rich.console import Console

    console = Console(stderr=stderr)
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return console
    return Console(stderr=stderr, width=FILE_WIDTH)
