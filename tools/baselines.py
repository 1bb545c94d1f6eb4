"""The speed baseline the benches compare against: a 6-layer MiniLM cross-encoder in fp32.

That is the architecture and cost of the common ``ms-marco-MiniLM-L-6`` rerankers and of ragsieve's
pre-distillation default. No pretrained cross-encoder is available offline, so it is built from the
embedded all-MiniLM-L6-v2 with a fresh one-logit head (seeded): the same forward, untrained, so its
rankings are meaningless and only its speed counts.

Example::

    from tools.baselines import minilm_cross_encoder
    folder = minilm_cross_encoder(Path("/tmp/minilm-ce"))  # then CrossEncoder(str(folder)).predict(pairs)
"""

from __future__ import annotations

from pathlib import Path


def minilm_cross_encoder(target: Path, max_length: int = 512) -> Path:
    """Save (once) the 6-layer MiniLM cross-encoder with a seeded fresh head in ``target``; return it."""
    if (Path(target) / "config.json").is_file():
        return Path(target)
    import torch
    from sentence_transformers import CrossEncoder

    from ragsieve.models import get_embedded

    torch.manual_seed(0)
    CrossEncoder(str(get_embedded("all-minilm-l6-v2").path()), num_labels=1, max_length=max_length).save(str(target))
    return Path(target)
