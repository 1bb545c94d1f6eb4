"""Issue #17, library level: every bad input or damaged artefact is one line, endpoints time out,
atomic folders clean up after killed builds. Fast: no real models, tiny fixtures only.
"""

from __future__ import annotations

import json
import os
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


# --------------------------------------------------------------------- 4. atomic folders and leftovers

TINY_PASSAGES = [
    ("p0", "Alexander Fleming discovered penicillin in 1928."),
    ("p1", "The Eiffel Tower is a wrought-iron lattice tower in Paris."),
    ("p2", "William Shakespeare wrote Hamlet around 1600."),
]


def _passages():
    from ragsieve.data.records import Passage

    return [Passage(i, t) for i, t in TINY_PASSAGES]


def _dead_pid() -> int:
    """A pid that is certainly not running: a child that has exited and been reaped."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def _killed_build(target: Path) -> None:
    """Run a build in a child process and SIGKILL it mid-way, as a user's ``kill -9`` would."""
    import subprocess
    import sys

    code = (
        "import os, signal, sys\n"
        "from ragsieve.atomic import atomic_directory\n"
        "with atomic_directory(sys.argv[1]) as tmp:\n"
        "    (tmp / 'half.bin').write_bytes(b'x' * 100)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(target)], env={**os.environ})
    assert result.returncode == -9


def test_killed_index_build_leftover_is_removed_by_the_next_build(tmp_path):
    from ragsieve.retrieve import build_index, load_index

    _killed_build(tmp_path / "idx")
    assert len(_hidden(tmp_path)) == 1 and _hidden(tmp_path)[0].endswith(".building")
    build_index(_passages(), tmp_path / "idx", kind="bm25")
    assert _hidden(tmp_path) == []
    assert len(load_index(tmp_path / "idx").passages) == 3


@pytest.mark.parametrize(
    "name",
    [
        ".idx.{dead}@{host}.0123abcd.building",  # this module's name, builder gone
        ".idx.{dead}@{host}.0123abcd.old",  # an overwrite killed between its two renames
        ".idx.ab12cd34.building",  # older ragsieve (mkdtemp), a day old
        ".idx.old-0123abcd",  # older ragsieve's overwrite leftover, a day old
    ],
)
def test_stale_siblings_are_removed(tmp_path, name):
    from ragsieve.atomic import _host, atomic_directory

    stale = tmp_path / name.format(dead=_dead_pid(), host=_host())
    stale.mkdir()
    (stale / "weights.bin").write_bytes(b"0" * 10)
    day_ago = os.path.getmtime(stale) - 2 * 24 * 3600
    os.utime(stale, (day_ago, day_ago))
    with atomic_directory(tmp_path / "idx") as tmp:
        (tmp / "x").write_text("x")
    assert not stale.exists() and (tmp_path / "idx" / "x").is_file()


@pytest.mark.parametrize(
    "name",
    [
        ".idx.{live}@{host}.0123abcd.building",  # a build running right now (our parent process)
        ".idx.{dead}@otherhost.0123abcd.building",  # another machine's build on a shared disk
        ".idx.ab12cd34.building",  # older ragsieve, fresh: may still be running
        ".idx-notes",  # a user's file that merely looks similar
        ".idx.keep.me",
    ],
)
def test_live_or_foreign_siblings_are_kept(tmp_path, name):
    from ragsieve.atomic import _host, atomic_directory

    other = tmp_path / name.format(live=os.getppid(), dead=_dead_pid(), host=_host())
    other.mkdir()
    with atomic_directory(tmp_path / "idx") as tmp:
        (tmp / "x").write_text("x")
    assert other.exists()


def test_atomic_directory_keeps_the_old_folder_on_error_and_refuses_existing(tmp_path):
    from ragsieve.atomic import atomic_directory

    target = tmp_path / "model"
    with atomic_directory(target) as tmp:
        (tmp / "v").write_text("1")
    with pytest.raises(RagsieveError) as info:
        with atomic_directory(target):
            pass
    assert "already exists" in one_line(info)
    with pytest.raises(KeyboardInterrupt):
        with atomic_directory(target, overwrite=True) as tmp:
            (tmp / "v").write_text("2")
            raise KeyboardInterrupt
    assert (target / "v").read_text() == "1" and _hidden(tmp_path) == []
    with atomic_directory(target, overwrite=True) as tmp:
        (tmp / "v").write_text("3")
    assert (target / "v").read_text() == "3" and _hidden(tmp_path) == []


@pytest.fixture
def umask_002():
    old = os.umask(0o002)
    yield 0o002
    os.umask(old)


def _modes(root: Path) -> set[tuple[str, int]]:
    import stat

    return {("d" if p.is_dir() else "f", stat.S_IMODE(p.stat().st_mode)) for p in [root, *root.rglob("*")]}


def test_index_and_jsonl_modes_follow_the_umask(tmp_path, umask_002):
    from ragsieve.data.jsonl import write_jsonl
    from ragsieve.retrieve import build_index

    build_index(_passages(), tmp_path / "idx", kind="bm25")
    assert _modes(tmp_path / "idx") == {("d", 0o775), ("f", 0o664)}
    write_jsonl(tmp_path / "rows.jsonl", [{"a": 1}])
    assert _modes(tmp_path / "rows.jsonl") == {("f", 0o664)}


def test_current_umask_reads_without_changing(umask_002):
    from ragsieve.atomic import current_umask

    assert current_umask() == 0o002 and current_umask() == 0o002
