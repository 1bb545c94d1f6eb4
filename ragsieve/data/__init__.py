"""Data layer: typed records, benchmark loaders, JSON-lines I/O and id-keyed splits."""

from __future__ import annotations

from ragsieve.data.jsonl import JsonlReader, append_jsonl, read_jsonl, write_jsonl
from ragsieve.data.loaders import (
    DATASET_LICENCES,
    DatasetInfo,
    available_datasets,
    dataset_info,
    dataset_licence,
    default_data_dir,
    load_dataset,
    register_dataset,
)
from ragsieve.data.records import Dataset, Judgment, LabeledPair, Passage, Question
from ragsieve.data.splits import SplitError, held_out_questions, read_split_file, split_by_id, stratified_split_by_id

__all__ = [
    "DATASET_LICENCES",
    "Dataset",
    "DatasetInfo",
    "Judgment",
    "JsonlReader",
    "LabeledPair",
    "Passage",
    "Question",
    "SplitError",
    "append_jsonl",
    "available_datasets",
    "dataset_info",
    "dataset_licence",
    "held_out_questions",
    "default_data_dir",
    "load_dataset",
    "read_jsonl",
    "read_split_file",
    "register_dataset",
    "split_by_id",
    "stratified_split_by_id",
    "write_jsonl",
]
