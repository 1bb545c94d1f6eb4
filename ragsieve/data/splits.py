"""Deterministic, order-independent train/test splits keyed on ids.

Every id gets a uniform number in [0, 1) from SHA-256 of ``f"{seed}:{id}"``, so an
id lands in the same split whatever order (or subset) the ids come in, on every
machine and Python version (unlike the salted built-in ``hash``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence

from ragsieve.errors import RagsieveError

__all__ = ["SplitError", "held_out_questions", "read_split_file", "split_by_id", "stratified_split_by_id", "id_unit"]

DEFAULT_FRACTIONS: dict[str, float] = {"train": 0.8, "test": 0.2}


class SplitError(RagsieveError, ValueError):
    """Bad split fractions or labels."""


def id_unit(id_: str, seed: int = 0, salt: str = "") -> float:
    """The id's position in [0, 1) for ``seed``: the first 8 bytes of SHA-256 as a fraction.

    ``salt`` makes a split independent of every other split drawn at the same seed (without
    it, a test share of 0.2 taken twice picks the same ids both times).
    """
    digest = hashlib.sha256(f"{salt}{seed}:{id_}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _check_fractions(fractions: Mapping[str, float] | None) -> dict[str, float]:
    fractions = dict(DEFAULT_FRACTIONS if fractions is None else fractions)
    if not fractions:
        raise SplitError("split fractions are empty; give e.g. {'train': 0.8, 'test': 0.2}")
    for name, frac in fractions.items():
        if not isinstance(frac, (int, float)) or math.isnan(frac) or not 0.0 <= frac <= 1.0:
            raise SplitError(f"split fraction {name!r}={frac!r} must be a number in [0, 1]")
    total = sum(fractions.values())
    if abs(total - 1.0) > 1e-6:
        shown = ", ".join(f"{k}={v}" for k, v in fractions.items())
        raise SplitError(f"split fractions must sum to 1 (got {total:.6g}: {shown})")
    return fractions


def _unique(ids: Iterable[Hashable]) -> list[str]:
    return sorted({str(i) for i in ids})


def split_by_id(
    ids: Iterable[Hashable],
    fractions: Mapping[str, float] | None = None,
    seed: int = 0,
    salt: str = "",
) -> dict[str, list[str]]:
    """Assign each id to a split by its hash; default fractions train 0.8 / test 0.2.

    Ids are compared as strings and de-duplicated; each split's list is sorted, so the
    result depends only on the set of ids. Sizes match the fractions in expectation
    only; use :func:`stratified_split_by_id` for exact per-label counts.
    """
    fractions = _check_fractions(fractions)
    names = list(fractions)
    bounds: list[float] = []
    acc = 0.0
    for name in names:
        acc += fractions[name]
        bounds.append(acc)
    out: dict[str, list[str]] = {name: [] for name in names}
    for id_ in _unique(ids):
        u = id_unit(id_, seed, salt)
        for name, bound in zip(names, bounds):
            if u < bound:
                out[name].append(id_)
                break
        else:  # u fell past a sum that rounds just below 1
            last = next((n for n in reversed(names) if fractions[n] > 0), names[-1])
            out[last].append(id_)
    return out


def _largest_remainder(n: int, fractions: dict[str, float]) -> dict[str, int]:
    """Integer counts summing to ``n`` that are closest to ``n * fraction``."""
    raw = {k: n * f for k, f in fractions.items()}
    counts = {k: math.floor(v) for k, v in raw.items()}
    left = n - sum(counts.values())
    order = sorted(fractions, key=lambda k: (-(raw[k] - counts[k]), list(fractions).index(k)))
    for k in order[:left]:
        counts[k] += 1
    return counts


def stratified_split_by_id(
    ids: Iterable[Hashable],
    labels: Mapping[Hashable, Hashable] | Sequence[Hashable],
    fractions: Mapping[str, float] | None = None,
    seed: int = 0,
) -> dict[str, list[str]]:
    """Split ids so every label keeps the fractions (largest-remainder rounding per label).

    ``labels`` is either a mapping id -> label or a sequence aligned with ``ids``.
    Within a label the ids are ordered by their hash, so the result is independent of
    input order. An id given twice must carry the same label.
    """
    fractions = _check_fractions(fractions)
    ids = list(ids)
    if isinstance(labels, Mapping):
        try:
            pairs = [(str(i), labels[i]) for i in ids]
        except KeyError as e:
            raise SplitError(f"no label for id {e.args[0]!r}") from None
    else:
        labels = list(labels)
        if len(labels) != len(ids):
            raise SplitError(f"got {len(ids)} ids but {len(labels)} labels")
        pairs = [(str(i), lab) for i, lab in zip(ids, labels)]
    label_of: dict[str, Hashable] = {}
    for id_, lab in pairs:
        if label_of.setdefault(id_, lab) != lab:
            raise SplitError(f"id {id_!r} has two labels: {label_of[id_]!r} and {lab!r}")
    strata: dict[Hashable, list[str]] = {}
    for id_, lab in label_of.items():
        strata.setdefault(lab, []).append(id_)
    out: dict[str, list[str]] = {name: [] for name in fractions}
    for members in strata.values():
        members.sort(key=lambda i: (id_unit(i, seed), i))
        start = 0
        for name, count in _largest_remainder(len(members), fractions).items():
            out[name].extend(members[start : start + count])
            start += count
    return {name: sorted(v) for name, v in out.items()}


def held_out_questions(questions: Sequence, test_fraction: float = 0.2, seed: int = 0) -> list:
    """The questions (anything with ``.id``) in the ``test`` split, sorted by id.

    The demo and the retrieval comparison both call this, so they hold out the same
    questions for the same seed.
    """
    ids = split_by_id([q.id for q in questions], {"train": 1 - test_fraction, "test": test_fraction}, seed=seed)
    held_out = set(ids["test"])
    return sorted((q for q in questions if q.id in held_out), key=lambda q: q.id)


def read_split_file(path, required: Sequence[str]) -> dict[str, list[str]]:
    """A saved ``split.json`` (split name → ids), checked to hold an id list under every ``required`` name.

    Example::

        ids = read_split_file("results/probe_nq/split.json", ["test"])["test"]
    """
    import json
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise SplitError(f"split file {path} not found: run the probe study that writes it first")
    split = json.loads(path.read_text())
    missing = [k for k in required if not isinstance(split.get(k), list)]
    if missing:
        raise SplitError(f"split file {path} has no {' / '.join(missing)} id list")
    return split
