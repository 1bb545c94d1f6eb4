"""Models that ship inside PyPI packages, so ragsieve runs with no hub access.

The table is :data:`ragsieve.specs.EMBEDDED_TABLE` (with every other ``embedded:<name>``): adding an embedded
model means adding a row there. Kept so that ``from ragsieve.models.embedded import get_embedded`` still works.
"""

from __future__ import annotations

from ragsieve.specs import EMBEDDED_MODELS, EmbeddedModel, get_embedded

__all__ = ["EMBEDDED_MODELS", "EmbeddedModel", "get_embedded"]
