"""Typed records shared by every stage.

They are plain frozen dataclasses: cheap to build by the hundred thousand, hashable,
and easy to turn into JSON with :func:`dataclasses.asdict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Passage:
    """A retrievable unit of text (paragraph, sentence, snippet, abstract section).

    ``meta`` carries provenance a user's corpus gives (source file, character offsets of
    a chunk, the row's own ``metadata``); it is kept in the index, never scored.
    """

    id: str
    text: str
    title: str = ""
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def full_text(self) -> str:
        """Title and text the way encoders and prompts see them."""
        return f"{self.title}: {self.text}" if self.title else self.text


#: ``Passage.meta`` keys of the vector an index stored for the passage, and the encoder spec that made it: a
#: reranker's cosine half reads it instead of encoding the passage again (issue #62)
STORED_VECTOR = "stored_vector"
STORED_VECTOR_ENCODER = "stored_vector_encoder"


def with_stored_vector(passage: Passage, vector: Any, encoder: str) -> Passage:
    """``passage`` carrying the vector ``encoder`` gave its ``full_text`` (an index hit does)."""
    meta = {**passage.meta, STORED_VECTOR: vector, STORED_VECTOR_ENCODER: encoder}
    return Passage(passage.id, passage.text, passage.title, meta)


def stored_vector(passage: Passage, encoder: str) -> Any:
    """The vector an index stored for ``passage`` with ``encoder`` (None: none, or another encoder's)."""
    if passage.meta.get(STORED_VECTOR_ENCODER) != encoder:
        return None
    return passage.meta.get(STORED_VECTOR)


@dataclass(frozen=True, slots=True)
class Question:
    """A query with its gold answers and, where the dataset has them, gold passage ids."""

    id: str
    text: str
    answers: tuple[str, ...] = ()
    gold_passage_ids: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True, slots=True)
class Judgment:
    """A relevance label: 1 = the passage is relevant to / supports the query."""

    query_id: str
    passage_id: str
    label: int


@dataclass(frozen=True, slots=True)
class LabeledPair:
    """A pointwise (query, passage) example with a binary label (1 relevant / true, 0 not, -1 unknown).

    The one record for labelled pairs: graders train on it, the evolving reranker's rounds
    are lists of it. ``fields`` keeps the dataset's own names (premise/hypothesis,
    claim/evidence, ...) so prompt templates can use them; ``group`` is a batch / round key
    where the data has one (e.g. BioASQ ``7B1``); ``dataset`` names the source.

    Example::

        LabeledPair("pmid1", "pmid1", "Does X cause Y?", "We found ...", 1,
                    {"question": "Does X cause Y?", "context": "We found ..."}, dataset="pubmedqa")
    """

    id: str
    query_id: str
    query: str
    passage: str
    label: int
    fields: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    group: str = ""
    dataset: str = ""

    @classmethod
    def named(cls, id: str, query: tuple[str, str], passage: tuple[str, str], label: int, *,
              query_id: str | None = None, group: str = "") -> "LabeledPair":
        """A pair whose ``fields`` name its query and passage as the dataset does (``query_id`` defaults to ``id``).

        Example::

            LabeledPair.named("c1", ("claim", "Wozniak designed homes."), ("evidence", "He designed the Apple II."), 0)
        """
        (query_name, query_text), (passage_name, passage_text) = query, passage
        return cls(id, query_id if query_id is not None else id, query_text, passage_text, label,
                   {query_name: query_text, passage_name: passage_text}, group)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "dataset": self.dataset, "query_id": self.query_id, "query": self.query,
            "passage": self.passage, "label": self.label, "fields": dict(self.fields), "group": self.group,
        }

    @classmethod
    def from_json(cls, row: dict[str, Any]) -> "LabeledPair":
        return cls(
            id=str(row["id"]), dataset=str(row.get("dataset", "")), query_id=str(row.get("query_id", row["id"])),
            query=str(row.get("query", "")), passage=str(row.get("passage", "")), label=int(row["label"]),
            fields={str(k): str(v) for k, v in (row.get("fields") or {}).items()}, group=str(row.get("group", "")),
        )


@dataclass(slots=True)
class Dataset:
    """Everything one loader yields: questions, the passage pool and gold judgments."""

    name: str
    questions: list[Question]
    passages: list[Passage] = field(default_factory=list)
    judgments: list[Judgment] = field(default_factory=list)
    pairs: list[LabeledPair] = field(default_factory=list)
    skipped_lines: int = 0
    # loader facts: licence, source files, counts of dropped / repaired records
    meta: dict[str, Any] = field(default_factory=dict)

    def passage_by_id(self) -> dict[str, Passage]:
        return {p.id: p for p in self.passages}

    def qrels(self) -> dict[str, dict[str, int]]:
        """Judgments as ``{query_id: {passage_id: label}}`` (positives only), the ranx shape."""
        out: dict[str, dict[str, int]] = {}
        for j in self.judgments:
            if j.label > 0:
                out.setdefault(j.query_id, {})[j.passage_id] = j.label
        return out
