"""Framework adapters: a ragsieve ranker (in-process) or a ``ragsieve serve`` URL as a framework component.

Each adapter lives in its own module and imports its framework only there, so
``import ragsieve.integrations`` needs none of them:

- :mod:`ragsieve.integrations.langchain` — ``RagsieveCompressor`` (a LangChain ``BaseDocumentCompressor``)
- :mod:`ragsieve.integrations.llama_index` — ``RagsieveRerank`` (a LlamaIndex ``BaseNodePostprocessor``)
- :mod:`ragsieve.integrations.haystack` — ``RagsieveRanker`` (a Haystack ``@component``)
"""
