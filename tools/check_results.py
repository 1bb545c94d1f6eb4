"""`make check-results`: every number in README.md's "## Results" section, re-derived from the committed JSON.

Each row of the Results table (and the paragraph above it) is declared in ``tools/results_sources.yaml``:
the JSON files and the parts of them (``file.json:key.key``, ``*`` for every key at a level) that back
the row, and the few numbers that are stated rather than measured (a target, a design size), each
with the reason. A number in the row must equal, at the precision it is written with, a value in
those parts (as written, or ×100 for a percentage or percentage points; the sign is not compared, as
"trails by 6.6 pp" reads a negative difference); otherwise the check fails and names the row and the
number. A new number without a source fails too, so the table cannot drift from the runs. The
numbers a verdict rests on are also pinned to their one JSON value (a regex whose groups are the
numbers, and the value of each), so they cannot match a neighbour by accident. A claim that one configuration
is as good as another (``margins``: "non-inferior at δ = 2 pp" / "undecided at δ = 2 pp") is re-derived from
the committed per-question outcomes (:func:`ragsieve.eval.stats.non_inferior`), and its interval's numbers
may be quoted.

Run from the repository root: ``python tools/check_results.py`` (exit 1 on a mismatch).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SOURCES = Path(__file__).with_name("results_sources.yaml")
# A number: optional sign (ASCII or the typographic minus), digits with thousands commas, decimals.
NUMBER = re.compile(r"(?P<sign>[−+-]?)(?P<digits>\d{1,3}(?:,\d{3})+|\d+)(?P<decimals>\.\d+)?")


def results_section(readme: str) -> str:
    """The text of README.md from "## Results" to the next "## " heading."""
    match = re.search(r"^## Results\n(.*?)(?=^## |\Z)", readme, flags=re.S | re.M)
    if not match:
        raise SystemExit("README.md has no '## Results' section")
    return match.group(1)


def rows(section: str) -> Iterator[tuple[str, str]]:
    """(key, text) of the intro paragraph and of each table row; the key is the row's first cell."""
    intro, table = [], []
    for line in section.splitlines():
        (table if line.startswith("|") else intro).append(line)
    yield "intro", " ".join(intro)
    for line in table:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or set(cells[0]) <= {"-"} or cells[0] == "what":
            continue
        yield cells[0], " | ".join(cells[:-1])  # the last cell is the folder ("where")


def numbers(text: str) -> Iterator[str]:
    """The numbers of a row as written, without code spans, names with digits (SmolLM2, P@3, top-3,
    M_4, #15) or exponents."""
    text = re.sub(r"`[^`]*`", " ", text)
    for m in NUMBER.finditer(text):
        before = text[m.start() - 1] if m.start() else " "
        after = text[m.end()] if m.end() < len(text) else " "
        if before.isalnum() or before in "@_#./" or after.isalpha() or after in "@_":
            continue
        if before == "-" and m.start() > 1 and text[m.start() - 2].isalpha():
            continue  # top-3
        if m.group("sign") == "-" and m.start() and text[m.start() - 1].isalpha():
            continue
        if after == "e" or (m.start() > 1 and text[m.start() - 1] == "e" and text[m.start() - 2].isdigit()):
            continue  # 1e-5
        yield m.group(0)


def leaves(value, path: list[str]) -> Iterator[float]:
    """Every number under ``path`` of ``value`` (``*`` matches every key or item at that level)."""
    if path:
        head, rest = path[0], path[1:]
        if head == "*":
            children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
            for child in children:
                yield from leaves(child, rest)
        elif isinstance(value, dict) and head in value:
            yield from leaves(value[head], rest)
        elif isinstance(value, list) and head.isdigit() and int(head) < len(value):
            yield from leaves(value[int(head)], rest)
        else:
            raise KeyError(head)
        return
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield float(value)
    elif isinstance(value, dict):
        for child in value.values():
            yield from leaves(child, [])
    elif isinstance(value, list):
        for child in value:
            yield from leaves(child, [])


def written(token: str) -> tuple[Decimal, int]:
    """A number as written: its value and its number of decimals."""
    clean = token.replace("−", "-").replace(",", "").lstrip("+")
    decimals = len(clean.split(".")[1]) if "." in clean else 0
    return Decimal(clean), decimals


def backed(token: str, values: list[float]) -> bool:
    """Whether some value, rounded as the token is written (as is or ×100), gives the token (sign aside)."""
    target, decimals = written(token)
    for v in values:
        for scaled in (v, v * 100):
            got = Decimal(f"{scaled:.{decimals}f}")  # rounded as the tables' f-strings round a float
            if got == target or got == -target:
                return True
    return False


def load(spec: str, cache: dict) -> list[float]:
    file, _, path = spec.partition(":")
    if file not in cache:
        cache[file] = json.loads((ROOT / file).read_text(encoding="utf-8"))
    try:
        return list(leaves(cache[file], path.split(".") if path else []))
    except KeyError as missing:
        raise SystemExit(f"tools/results_sources.yaml: {spec}: no key {missing} in {file}") from None


def derive(expression: str, cache: dict) -> float:
    """A value computed from JSON values, e.g. ``bench/results/retrieval.json:n_synthetic / bench/results/
    retrieval.json:n_vectors`` (each ``file:path`` one number; + − × / and parentheses only)."""
    def value(m: re.Match) -> str:
        found = load(m.group(0), cache)
        if len(found) != 1:
            raise SystemExit(f"tools/results_sources.yaml: {m.group(0)} is {len(found)} numbers, not one")
        return repr(found[0])

    arithmetic = re.sub(r"[\w./-]+\.json:[\w.@*-]+", value, expression)
    if not re.fullmatch(r"[\d.eE+\-*/() ]+", arithmetic):
        raise SystemExit(f"tools/results_sources.yaml: '{expression}' is not arithmetic on JSON values")
    return float(eval(arithmetic, {"__builtins__": {}}))  # digits and operators only, checked above


def margin_test(claim: dict):
    """The non-inferiority test a README row's verdict rests on: ``a`` against ``b`` at ``margin``, from the
    per-question outcomes of a committed rows file (``{"name", "correct"}`` per line), or from the paired
    counts of a committed comparison (``counts``: a ``file.json:path`` holding ``n``, ``a_correct``, ``a_only``,
    ``b_only``)."""
    sys.path.insert(0, str(ROOT))
    from ragsieve.eval.stats import NonInferiority, paired_proportion_difference

    if "counts" in claim:
        file, _, path = claim["counts"].partition(":")
        c = json.loads((ROOT / file).read_text(encoding="utf-8"))
        for key in path.split("."):
            c = c[key]
        both = c["a_correct"] - c["a_only"]
        diff, low, high = paired_proportion_difference(both, c["a_only"], c["b_only"],
                                                       c["n"] - both - c["a_only"] - c["b_only"])
        return NonInferiority(c["n"], c["a_correct"], both + c["b_only"], c["a_only"], c["b_only"], diff, low, high,
                              float(claim["margin"]))
    from ragsieve.eval.stats import non_inferior

    outcomes = {}
    for line in (ROOT / claim["rows"]).read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        outcomes[row["name"]] = row["correct"]
    missing = [name for name in (claim["a"], claim["b"]) if name not in outcomes]
    if missing:
        raise SystemExit(f"tools/results_sources.yaml: {claim['rows']} has no row {missing}")
    return non_inferior(outcomes[claim["a"]], outcomes[claim["b"]], float(claim["margin"]))


def check(readme: str, sources: dict) -> list[str]:
    """The mismatches: rows without a declaration, numbers without a source, declarations without a row."""
    problems, cache, seen = [], {}, set()
    for key, text in rows(results_section(readme)):
        # the most specific declaration: "sentence pruning with the keep head" before "sentence pruning"
        name = max((n for n in sources if key.startswith(n) or n == key), key=len, default=None)
        if name is None:
            problems.append(f"row '{key[:60]}': not declared in tools/results_sources.yaml")
            continue
        entry = sources[name]
        seen.add(name)
        values = [v for spec in entry.get("json", []) for v in load(spec, cache)]
        values += [derive(expr, cache) for expr in entry.get("derived", [])]
        for claim in entry.get("margins", []):  # "as good as" only at a margin, re-derived from the outcomes
            found, test = re.search(claim["text"], text), margin_test(claim)
            values += [test.diff, test.low, test.high, test.margin]
            if not found:
                problems.append(f"row '{key[:60]}': no text matches margin claim /{claim['text']}/")
            elif found.group(1) != test.verdict:
                problems.append(f"row '{key[:60]}': says '{found.group(1)}' where "
                                f"{claim.get('rows') or claim['counts']} gives '{test.verdict}' ({test.diff:+.3f} "
                                f"[{test.low:+.3f}, {test.high:+.3f}])")
        stated = {written(str(x))[0] for x in entry.get("stated", {})}
        for pin in entry.get("pinned", []):  # a number at its place: the regex's groups, one JSON value each
            found = re.search(pin["text"], text)
            if not found:
                problems.append(f"row '{key[:60]}': no text matches pinned /{pin['text']}/")
                continue
            for token, spec in zip(found.groups(), pin["json"]):
                if not backed(token, load(spec, cache)):
                    problems.append(f"row '{key[:60]}': {token} is not {spec} = {load(spec, cache)}")
        for token in numbers(text):
            if written(token)[0] in stated or abs(written(token)[0]) in stated:
                continue
            if not backed(token, values):
                problems.append(f"row '{key[:60]}': {token} is in no source {entry.get('json', [])}")
    problems += [f"tools/results_sources.yaml: '{name}' matches no row of the Results section"
                 for name in sources if name not in seen]
    return problems


def main() -> int:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    problems = check(readme, yaml.safe_load(SOURCES.read_text(encoding="utf-8")))
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"check-results: {len(problems)} number(s) of README.md's Results not backed by the committed JSON",
              file=sys.stderr)
        return 1
    print("check-results: every number in README.md's Results section matches the committed JSON")
    return 0


if __name__ == "__main__":
    sys.exit(main())
