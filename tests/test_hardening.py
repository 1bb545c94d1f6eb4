"""Issue #17, library level: every bad input or damaged artefact is one line, endpoints time out,
atomic folders clean up after killed builds. Fast: no real models, tiny fixtures only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragsieve.errors import DataError, RagsieveError


def one_line(exc_info: pytest.ExceptionInfo) -> str:
    """The message of a caught ragsieve error, after checking it is a single line."""
    message = str(exc_info.value)
    assert message and "\n" not in message, message
    return message


# --------------------------------------------------------------------- 1. text input policy

def _readers():
    """(name, suffix, reader) for every text reader that takes a user file."""
    from ragsieve.config import read_mapping
    from ragsieve.data.jsonl import read_jsonl
    from ragsieve.data.passage_files import read_passages_file

    return [
        ("passages-txt", ".txt", read_passages_file),
        ("passages-jsonl", ".jsonl", read_passages_file),
        ("jsonl", ".jsonl", lambda p: list(read_jsonl(p))),
        ("config-yaml", ".yaml", read_mapping),
        ("config-json", ".json", read_mapping),
    ]


READERS = _readers()
READER_IDS = [r[0] for r in READERS]


@pytest.mark.parametrize(("name", "suffix", "reader"), READERS, ids=READER_IDS)
def test_latin1_file_is_one_line_naming_file_line_and_offset(tmp_path, name, suffix, reader):
    body = {
        ".txt": "first passage\nCafé au lait\n".encode("latin-1"),
        ".jsonl": b'{"text": "ok"}\n{"text": "caf\xe9"}\n',
        ".yaml": b"name: ok\ntitle: caf\xe9\n",
        ".json": b'{"name": "ok",\n "title": "caf\xe9"}\n',
    }[suffix]
    path = tmp_path / f"bad{suffix}"
    path.write_bytes(body)
    with pytest.raises(DataError) as info:
        reader(path)
    message = one_line(info)
    offset = body.index(b"\xe9")
    assert f"{path}:2:" in message and f"byte offset {offset}" in message and "UTF-8" in message


@pytest.mark.parametrize(("name", "suffix", "reader"), READERS, ids=READER_IDS)
def test_directory_is_reported_as_a_directory(tmp_path, name, suffix, reader):
    folder = tmp_path / f"folder{suffix}"
    folder.mkdir()
    with pytest.raises(DataError) as info:
        reader(folder)
    assert "is a directory" in one_line(info)


@pytest.mark.parametrize(("name", "suffix", "reader"), READERS, ids=READER_IDS)
def test_missing_file_is_not_found(tmp_path, name, suffix, reader):
    with pytest.raises(DataError) as info:
        reader(tmp_path / f"nope{suffix}")
    assert "not found" in one_line(info)


def test_bom_is_dropped_everywhere(tmp_path):
    from ragsieve.config import read_mapping
    from ragsieve.data.jsonl import read_jsonl
    from ragsieve.data.passage_files import read_passages_file

    bom = b"\xef\xbb\xbf"
    (tmp_path / "p.txt").write_bytes(bom + "Première passage\nsecond\n".encode())
    assert read_passages_file(tmp_path / "p.txt")[0].text == "Première passage"
    (tmp_path / "p.jsonl").write_bytes(bom + b'{"text": "first"}\n')
    assert read_passages_file(tmp_path / "p.jsonl")[0].text == "first"
    assert list(read_jsonl(tmp_path / "p.jsonl")) == [{"text": "first"}]
    (tmp_path / "c.yaml").write_bytes(bom + b"rounds: 3\n")
    assert read_mapping(tmp_path / "c.yaml") == {"rounds": 3}
    (tmp_path / "c.json").write_bytes(bom + b'{"rounds": 3}')
    assert read_mapping(tmp_path / "c.json") == {"rounds": 3}


def test_jsonl_offset_counts_from_file_start_and_skip_bad_still_skips(tmp_path):
    from ragsieve.data.jsonl import read_jsonl

    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"b": "\xff"}\n{"c": 3}\n')
    with pytest.raises(DataError, match=r"rows\.jsonl:3: invalid UTF-8 \(byte 0xFF at byte offset 17\)"):
        list(read_jsonl(path))
    reader = read_jsonl(path, skip_bad=True)
    assert list(reader) == [{"a": 1}, {"c": 3}] and reader.skipped == 1


def test_yaml_values_pyyaml_cannot_build_are_one_line(tmp_path):
    from ragsieve.config import read_mapping

    path = tmp_path / "c.yaml"
    path.write_text("when: 2001-13-45\n")  # looks like a date, is not one: PyYAML raises ValueError
    with pytest.raises(RagsieveError) as info:
        read_mapping(path)
    assert "not valid YAML" in one_line(info)
