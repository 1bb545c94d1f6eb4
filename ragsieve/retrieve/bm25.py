"""Lexical retrieval with BM25 (the ``bm25s`` package): English stopwords, Snowball stemmer.

Only passages that share at least one (stemmed, non-stopword) term with the query score
above zero; those are the only ones returned, so a search can yield fewer than ``k`` hits
(and none for a query made only of stopwords or unseen words).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from ragsieve.artifacts import INDEX_REBUILD, check_npy, read_json_artifact, reading_artifact
from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.retrieve.base import Hit, Retriever, _check_dir, _load_passages, check_passages

if TYPE_CHECKING:
    import bm25s



def _bm25s():
    """``import bm25s``, then quiet it: its ``__init__`` sets its logger to DEBUG, which logs
    every per-query index build, so the level can only be lowered after the import."""
    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return bm25s


_CONFIG_FILE = "bm25.json"
_STOPWORDS = "en"
_STEMMER_LANGUAGE = "english"


def _stemmer() -> Any:
    import Stemmer

    return Stemmer.Stemmer(_STEMMER_LANGUAGE)


class BM25Retriever(Retriever):
    """BM25 over ``passage.full_text`` (title + text).

    Example::

        bm25 = BM25Retriever.build(passages)
        bm25.search("penicillin discovery", k=5)
    """

    kind = "bm25"
    subdir = "bm25"

    def __init__(self, passages: Sequence[Passage], model: "bm25s.BM25", *, k1: float = 1.5, b: float = 0.75) -> None:
        super().__init__(passages)
        if model.scores["num_docs"] != len(self.passages):
            raise RagsieveError(
                f"BM25 index holds {model.scores['num_docs']} documents for {len(self.passages)} passages; rebuild it"
            )
        self.model = model
        self.k1 = k1
        self.b = b
        self._stem = _stemmer()

    @classmethod
    def build(cls, passages: Iterable[Passage], *, k1: float = 1.5, b: float = 0.75) -> "BM25Retriever":
        """Tokenise (lowercase, English stopwords, stemming) and index ``passages``.

        Inputs: ``k1`` (term-frequency saturation) and ``b`` (length normalisation), the
        usual BM25 parameters.

        Example::

            bm25 = BM25Retriever.build([Passage("p1", "Fleming discovered penicillin.")])
        """
        bm25s = _bm25s()
        passages = check_passages(passages)
        tokens = bm25s.tokenize(
            [p.full_text for p in passages], stopwords=_STOPWORDS, stemmer=_stemmer(), show_progress=False
        )
        empty = not tokens.vocab
        if empty:  # every passage is stopwords (e.g. ["a"]): bm25s cannot index an empty vocabulary, so give it ""
            tokens = bm25s.tokenization.Tokenized(ids=tokens.ids, vocab={"": 0})
        model = bm25s.BM25(k1=k1, b=b)
        with np.errstate(invalid="ignore" if empty else "warn"):  # mean length 0: no term scores anyway
            model.index(tokens, show_progress=False)
        return cls(passages, model, k1=k1, b=b)

    def _query_ids(self, query: str) -> list[int]:
        bm25s = _bm25s()
        tokens = bm25s.tokenize(
            query, stopwords=_STOPWORDS, stemmer=self._stem, return_ids=False, show_progress=False
        )[0]
        return self.model.get_tokens_ids(tokens)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for ``query`` (zeros when no term matches).

        Example::

            bm25.scores("penicillin").argmax()
        """
        ids = self._query_ids(query)
        if not ids:
            return np.zeros(len(self), dtype=np.float32)
        return np.asarray(self.model.get_scores_from_ids(ids))

    def _search(self, query: str, k: int) -> list[Hit]:
        scores = self.scores(query)
        cand = np.flatnonzero(scores > 0)
        if len(cand) > k:
            cand = cand[np.argpartition(-scores[cand], k - 1)[:k]]
        # sort by score, then by position, so equal scores come back in a stable order
        cand = cand[np.lexsort((cand, -scores[cand]))]
        return self._hits(cand, scores[cand])

    def save(self, path: str | Path, *, with_passages: bool = True) -> None:
        """Write the bm25s index files (``bm25s.BM25.save``), ``bm25.json`` and passages.

        Example::

            bm25.save("my_index/bm25")
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save(str(path), show_progress=False)
        config = {"k1": self.k1, "b": self.b, "stopwords": _STOPWORDS, "stemmer": _STEMMER_LANGUAGE, "n_passages": len(self)}
        (path / _CONFIG_FILE).write_text(json.dumps(config, indent=2))
        self._save_passages(path, with_passages)

    @classmethod
    def load(cls, path: str | Path, *, passages: Sequence[Passage] | None = None) -> "BM25Retriever":
        """Load a folder written by :meth:`save`.

        Example::

            bm25 = BM25Retriever.load("my_index/bm25")
        """
        bm25s = _bm25s()
        path = _check_dir(path, cls.kind, _CONFIG_FILE)
        config = read_json_artifact(path / _CONFIG_FILE, INDEX_REBUILD)
        for file in sorted(path.glob("*.npy")):  # a truncated array names itself, not numpy's reshape
            check_npy(file, INDEX_REBUILD)
        with reading_artifact(path, INDEX_REBUILD):
            model = bm25s.BM25.load(str(path), show_progress=False, load_corpus=False)
        with reading_artifact(path / _CONFIG_FILE, INDEX_REBUILD):
            k1, b, n = float(config["k1"]), float(config["b"]), config.get("n_passages")
        passages = _load_passages(path, passages)
        if n is not None and n != len(passages):
            raise RagsieveError(f"{path}: BM25 index covers {n} passages, not {len(passages)}; {INDEX_REBUILD}")
        return cls(passages, model, k1=k1, b=b)
