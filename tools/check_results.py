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

Outside that table the same numbers get quoted again, and two more checks keep those quotes honest, over
README.md (all but its Results section) and ragsieve/assets/README.md:

* **Attributed figures** (:func:`check_prose`). A sentence that cites a committed JSON file (```bench/results/
  x.json```) or a results folder (```results/x/```, or a file in it: that folder's JSON files) may only hold
  numbers those files hold, at the precision written; a number stated rather than measured there is declared in
  ``tools/prose_sources.yaml`` with the reason. A figure moved to the wrong file, or left behind by a rerun,
  fails.
* **Counts** (:func:`check_counts`). "three ways: a, b, c and d" or "Two consequences:" followed by a bulleted
  list: the number word must equal the items listed.

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
PROSE_SOURCES = Path(__file__).with_name("prose_sources.yaml")
#: the prose files whose quoted figures are checked (besides README.md outside its Results section)
PROSE_FILES = ("README.md", "ragsieve/assets/README.md")
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
    from ragsieve.eval.stats import non_inferior, non_inferior_counts

    if "counts" in claim:
        file, _, path = claim["counts"].partition(":")
        c = json.loads((ROOT / file).read_text(encoding="utf-8"))
        for key in path.split("."):
            c = c[key]
        both = c["a_correct"] - c["a_only"]
        return non_inferior_counts(both, c["a_only"], c["b_only"], c["n"] - both - c["a_only"] - c["b_only"],
                                   float(claim["margin"]))

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


# -- quoted outside the Results table ---------------------------------------------------------------

#: a cited source: a committed JSON file or a results folder (a file inside it stands for the folder)
CITED = re.compile(r"`((?:bench/)?results/[\w./*-]+)`")
NUMBER_WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}
COUNTED = re.compile(r"\b(" + "|".join(list(NUMBER_WORDS)[2:]) + r")((?:\s+[\w-]+){1,3}):", flags=re.I)


def prose(text: str) -> str:
    """``text`` without its Results section and code blocks (line numbers kept)."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    text = re.sub(r"^## Results\n.*?(?=^## |\Z)", blank, text, flags=re.S | re.M)
    return re.sub(r"^```.*?^```", blank, text, flags=re.S | re.M)


def sentences(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line, sentence, sources cited) of each paragraph's sentences, wrapped lines joined. A table's cells are
    paragraphs, and what a row cites (its "where" / "built by" cell) every sentence of the row cites."""
    line = 1
    for para in re.split(r"(\n\s*\n)", text):
        if para.strip().startswith("|"):
            chunks = [(line + i, cell, CITED.findall(row)) for i, row in enumerate(para.strip("\n").split("\n"))
                      for cell in row.strip().strip("|").split(" | ")]
        else:
            chunks = [(line, para, [])] if para.strip() else []
        for at, chunk, row_cites in chunks:
            for sentence in re.split(r"(?<=[.;])\s+(?=[A-Z(`*])", " ".join(chunk.split())):
                yield at, sentence, list(dict.fromkeys(CITED.findall(sentence) + row_cites))
        line += para.count("\n")


def cited_values(cited: list[str], cache: dict) -> list[float]:
    """Every number in the cited JSON files, or in the JSON files at the top of a cited results folder."""
    values: list[float] = []
    for ref in cited:
        path = ref.split("*")[0] if "*" in ref else ref
        if ref.endswith(".json") and "*" not in ref:
            files = [ROOT / ref]
        else:
            folder = ROOT / path if (ROOT / path).is_dir() else (ROOT / path).parent
            files = sorted(folder.glob(Path(ref).name if "*" in ref else "*.json"))
        for file in files:
            values += load(str(file.relative_to(ROOT)), cache) if file.is_file() else []
    return values


def check_prose(text: str, name: str, stated: dict) -> list[str]:
    """Numbers of sentences that cite a JSON file or results folder and that the cited files do not hold.

    ``stated``: sentence start → {number: why} for numbers that are a setting or a target, not a measurement."""
    problems, cache = [], {}
    for line, sentence, cited in sentences(prose(text)):
        if not cited:
            continue
        missing = [ref for ref in cited if not (ROOT / ref.split("*")[0]).exists()
                   and not any((ROOT / ref.split("*")[0]).parent.glob(Path(ref).name))]
        problems += [f"{name}:{line}: `{ref}` does not exist" for ref in missing]
        values = cited_values(cited, cache)
        values += [v / 1000 for v in values]  # a latency the JSON holds in ms, quoted in s
        allowed = {written(str(x))[0] for start, numbers_ in stated.items() if sentence.startswith(start)
                   for x in numbers_}
        for token in numbers(sentence):
            if abs(written(token)[0]) not in allowed and not backed(token, values):
                problems.append(f"{name}:{line}: {token} is in none of {', '.join(cited)}: \"{sentence[:90]}...\"")
    return problems


def split_top_level(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` outside parentheses and brackets."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        depth += text[i] in "([{"
        depth -= text[i] in ")]}"
        if depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            i = start = i + len(separator)
            continue
        i += 1
    return parts + [text[start:]]


def listed_items(rest: str) -> int:
    """How many items follow a "three ways:": a bulleted list's top-level bullets, else the sentence's
    top-level "a, b and c"."""
    bullets = re.match(r"[ \t]*\n(?:\s*\n)*((?:[-*] .*\n(?:[ \t]+.*\n)*)+)", rest)
    if bullets:
        return len(re.findall(r"^[-*] ", bullets.group(1), flags=re.M))
    sentence = " ".join(re.split(r"\.(?:\s|$)|\n\s*\n", rest, maxsplit=1)[0].split())
    parts = split_top_level(sentence, ", ")
    if " and " in parts[-1] and not parts[-1].startswith("and "):
        parts = parts[:-1] + split_top_level(parts[-1], " and ")
    return len(parts)


def check_counts(text: str, name: str) -> list[str]:
    """"three ways:" / "Two consequences worth knowing:" whose list holds another number of items."""
    text, problems = prose(text), []
    for m in COUNTED.finditer(text):
        said, listed = NUMBER_WORDS[m.group(1).lower()], listed_items(text[m.end():])
        if said != listed:
            line = text[: m.start()].count("\n") + 1
            problems.append(f"{name}:{line}: \"{m.group(0)}\" announces {said} and lists {listed}")
    return problems


def check_quoted(files: dict[str, str], stated: dict) -> list[str]:
    """:func:`check_prose` and :func:`check_counts` over ``{name: text}``."""
    return [p for name, text in files.items() for p in check_prose(text, name, stated) + check_counts(text, name)]


def main() -> int:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    problems = check(readme, yaml.safe_load(SOURCES.read_text(encoding="utf-8")))
    problems += check_quoted({name: (ROOT / name).read_text(encoding="utf-8") for name in PROSE_FILES},
                             yaml.safe_load(PROSE_SOURCES.read_text(encoding="utf-8")) or {})
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"check-results: {len(problems)} number(s) or count(s) of README.md not backed by the committed JSON",
              file=sys.stderr)
        return 1
    print("check-results: every number in README.md's Results section, and every figure README.md and "
          "ragsieve/assets/README.md attribute to a JSON file or results folder, matches the committed JSON")
    return 0


if __name__ == "__main__":
    sys.exit(main())
