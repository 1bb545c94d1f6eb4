"""Benchmark-specific data builders: what the studies, the base reranker's recipe and the report
tables build from the six bundled datasets, kept out of the library's inference packages.

- :mod:`.relevance`: gold relevance sources, training groups and held-out ranking sets;
- :mod:`.mining`: hard-negative mining pools for the six datasets;
- :mod:`.forgetting`: the forgetting gold sets and their per-query measurement;
- :mod:`.base_reranker`: the recipe that trains ``embedded:base`` once and caches it.
"""
