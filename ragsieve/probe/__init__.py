"""Knowledge-boundary probe: Conf(prompt) from an LLM's mid-layer pre-token hidden state.

Modules: ``hidden`` (batched early-exit extraction), ``cache`` (SQLite state cache),
``labels`` (correctness labels from greedy answers), ``model`` (the MLP head and
:class:`ConfidenceProbe`), ``train`` (early-stopped head training).

Example::

    from ragsieve.models import load_local_llm
    from ragsieve.registry import load_probe
    probe = load_probe("embedded:smollm2-nq", load_local_llm())  # the shipped probe (a folder works too)
    probe.score("who wrote hamlet?")             # Conf(Q)
    probe.score("who wrote hamlet?", passage)    # Conf(Q+C)
"""

from ragsieve.probe.model import ConfidenceProbe, ProbeConfig, ProbeHead, load_head

__all__ = ["ConfidenceProbe", "ProbeConfig", "ProbeHead", "load_head"]
