"""Request and response bodies: the Cohere/Jina rerank shape, TEI's, and ragsieve's own.

Request models ignore unknown fields (clients send ``rank_fields``, ``max_tokens_per_doc``,
``truncate`` ...), so any client of those APIs works unchanged; responses are typed so
``/openapi.json`` documents them.
"""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class DocumentIn(_Request):
    """A document as an object (Cohere v1 / Jina); only ``text`` is read."""

    text: str


Document = Union[str, DocumentIn]


class RerankRequest(_Request):
    """Cohere v1/v2 and Jina rerank body. ``model`` is accepted and ignored (the response names the served model)."""

    query: str = Field(..., min_length=1)
    documents: list[Document]
    model: str | None = None
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False


class TEIRerankRequest(_Request):
    """Text Embeddings Inference's ``/rerank`` body.

    ``score`` is in [0, 1] (the calibrated probability, as for ``/v1/rerank``); ``raw_scores: true``
    returns the logit instead (a sigmoid-output ranker's mapped back; BM25 & co. their raw score). ``truncate`` is
    accepted for compatibility and changes nothing: long texts are chunked, never truncated.
    """

    query: str = Field(..., min_length=1)
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False


class FilterRequest(RerankRequest):
    """The sieve over the documents: rerank, cut to ``top_n`` (default: the server's ``top_k``), keep those
    graded relevant. ``threshold`` overrides the configured grader's (without a grader it thresholds the
    reranker's own scores)."""

    threshold: float | None = None


class GateRequest(_Request):
    query: str = Field(..., min_length=1)
    beta: float | None = Field(None, ge=0.0, le=1.0)  # overrides the configured β


class AskRequest(_Request):
    query: str = Field(..., min_length=1)


class GateResponse(BaseModel):
    confidence: float  # Conf(Q): the probe's P(the LLM answers correctly closed-book)
    retrieve: bool  # Conf(Q) <= beta
    beta: float


class Context(BaseModel):
    id: str
    text: str
    title: str = ""


class AskResponse(BaseModel):
    answer: str
    retrieved: bool
    confidence: float | None = None
    contexts: list[Context] = []
    graded_out: int = 0
    seconds: float


class DocumentOut(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float  # in [0, 1]: calibrated probability (BaseRanker.unit_scores)
    document: DocumentOut | None = None


class FilteredDocument(RerankResult):
    """One kept document of ``/v1/filter`` (the HTTP shape of a :class:`~ragsieve.pipeline.stages.FilterResult`)."""

    relevant: bool
    grade_score: float


class Meta(BaseModel):
    """Cohere's ``meta`` (clients parse ``api_version``, ``billed_units``, ``warnings``) plus ragsieve's details."""

    api_version: dict = {"version": "2"}
    billed_units: dict = {"search_units": 1}
    warnings: list[str] = []
    chunked_documents: dict[int, int] = {}  # document index -> chunks scored (longer than the model window)
    truncated_documents: list[int] = []  # documents longer than max_chunks_per_doc chunks: the tail was not read
    request_id: str = ""


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    meta: Meta
    usage: dict = {}


class TEIRerankResult(BaseModel):
    index: int
    score: float
    text: str | None = None


class FilterResponse(BaseModel):
    id: str
    model: str
    grader: str
    threshold: float
    results: list[FilteredDocument]  # kept documents, best first
    dropped: int  # documents not kept: cut by top_n / top_k or graded irrelevant
    meta: Meta


class FeedbackResponse(BaseModel):
    stored: int  # rows written (a chosen/rejected pair is two)
    pending: int  # rows waiting for the next `ragsieve evolve step`
    request_id: str = ""


class ErrorBody(BaseModel):
    error: str
    request_id: str = ""


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "ragsieve"
    kind: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: str
    model: str
    batches: int
    pairs: int
    replica: str | None = None  # on Ray Serve: the replica that answered
