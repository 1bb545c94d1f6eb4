"""Checks for option and config values, to run before anything slow or irreversible.

``ask --top-k 0`` used to be refused only after the LLM had loaded, and a bad config
value only after ``out_dir/work`` existed. Each check here returns the value when it is
fine and raises a one-line :class:`RagsieveError` naming the option otherwise, so a
command can check everything it was given first:

Example::

    top_k = positive_int(top_k, "--top-k")
    beta = unit_interval(cbdr, "--cbdr")          # None passes through
    out = output_dir(out, overwrite=overwrite)    # refuses an existing folder up front
"""

from __future__ import annotations

import math
import numbers
import os
from pathlib import Path
from typing import TypeVar

from ragsieve.errors import RagsieveError

__all__ = ["existing_dir", "non_negative_int", "output_dir", "positive_int", "positive_number", "unit_interval"]

T = TypeVar("T")


def _is_int(value: object) -> bool:
    # Integral: numpy integers count; bool is an int to Python but never a count here
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive_int(value: T, name: str) -> T:
    """``value`` if it is an integer >= 1 (None passes: "not given")."""
    if value is not None and not (_is_int(value) and value >= 1):
        raise RagsieveError(f"{name} must be a whole number of at least 1, got {value!r}")
    return value


def non_negative_int(value: T, name: str) -> T:
    """``value`` if it is an integer >= 0 (None passes)."""
    if value is not None and not (_is_int(value) and value >= 0):
        raise RagsieveError(f"{name} must be a whole number of 0 or more, got {value!r}")
    return value


def positive_number(value: T, name: str) -> T:
    """``value`` if it is a finite number > 0 (None passes)."""
    ok = _is_number(value) and math.isfinite(value) and value > 0
    if value is not None and not ok:
        raise RagsieveError(f"{name} must be a positive number, got {value!r}")
    return value


def unit_interval(value: T, name: str) -> T:
    """``value`` if it is a number in [0, 1] (a probability or a threshold; None passes)."""
    ok = _is_number(value) and 0.0 <= value <= 1.0
    if value is not None and not ok:
        raise RagsieveError(f"{name} must be between 0 and 1, got {value!r}")
    return value


def existing_dir(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` if it is a folder; "is a file" and "not found" are told apart."""
    path = Path(path).expanduser()
    if path.is_file():
        raise RagsieveError(f"{path}: is a file; give the {what} folder")
    if not path.is_dir():
        raise RagsieveError(f"{path}: {what} folder not found")
    return path


def output_dir(path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """``path`` if a command may create it: absent, or present with ``overwrite``; nothing is created.

    Checked before the work starts, so a long build is not thrown away at the end.
    """
    path = Path(path).expanduser()
    if path.is_file():
        raise RagsieveError(f"{path}: is a file; give a folder to write into")
    if path.exists() and not overwrite:
        raise RagsieveError(f"{path} already exists; use --overwrite or pick another folder")
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        raise RagsieveError(f"{path}: cannot create it, {parent} is not writable")
    return path
