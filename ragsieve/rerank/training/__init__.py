"""Reranker training, kept apart from inference (the way sentence-transformers' ``cross_encoder/``
keeps trainer and losses beside the model): :mod:`.trainer` (:class:`CrossEncoderTrainConfig`,
:func:`train_cross_encoder` with its forgetting guards), :mod:`.distill` (gold groups + MiniLM
cosine distillation for the base reranker), :mod:`.losses` (one loss per file).

Nothing in :mod:`ragsieve.rerank`'s inference modules imports this package (an import-linter
contract), so scoring never pulls in the training stack.
"""
