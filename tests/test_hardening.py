"""Issue #17, library level: every bad input or damaged artefact is one line, endpoints time out,
atomic folders clean up after killed builds. Fast: no real models, tiny fixtures only.
"""

from __future__ import annotations

import json
import os
import sqlite3
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
        ".idx.k2_x9abc.tmp",  # older write_jsonl (mkstemp), a day old
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


# --------------------------------------------------------------------- 2. damaged or mismatched artefacts


def _truncate(file: Path, keep: float = 0.5) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: int(len(data) * keep)])


def _assert_damaged(info: pytest.ExceptionInfo, file: Path, hint: str) -> None:
    message = one_line(info)
    assert message.startswith(str(file)), message
    assert hint in message, message


@pytest.fixture
def probe_dir(tmp_path) -> Path:
    """A saved probe for a 16-wide, 4-layer LLM, written as ConfidenceProbe.save writes it."""
    from dataclasses import asdict

    from safetensors.torch import save_file

    from ragsieve.probe.model import CONFIG_FILE, WEIGHTS_FILE, ProbeConfig, ProbeHead

    folder = tmp_path / "probe"
    folder.mkdir()
    head = ProbeHead(16, hidden=8)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(folder / WEIGHTS_FILE))
    config = ProbeConfig(llm_spec="hf:tiny", layer=2, num_layers=4, hidden_size=16, probe_hidden=8)
    (folder / CONFIG_FILE).write_text(json.dumps(asdict(config)))
    return folder


def _edit_json(file: Path, **changes) -> None:
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


PROBE_DAMAGE = {
    "layer-as-string": lambda d: _edit_json(d / "probe_config.json", layer="15"),
    "other-hidden-size": lambda d: _edit_json(d / "probe_config.json", hidden_size=32),
    "other-probe-width": lambda d: _edit_json(d / "probe_config.json", probe_hidden=4),
    "config-not-json": lambda d: (d / "probe_config.json").write_text("{layer: 2"),
    "config-a-list": lambda d: (d / "probe_config.json").write_text("[1, 2]"),
    "config-latin1": lambda d: (d / "probe_config.json").write_bytes(b'{"llm_spec": "caf\xe9"}'),
    "truncated-weights": lambda d: _truncate(d / "probe.safetensors"),
    "empty-weights": lambda d: (d / "probe.safetensors").write_bytes(b""),
    "garbage-weights": lambda d: (d / "probe.safetensors").write_bytes((16).to_bytes(8, "little") + b"not json at all"),
}


@pytest.mark.parametrize("damage", PROBE_DAMAGE, ids=list(PROBE_DAMAGE))
def test_damaged_probe_is_one_line_naming_the_file(probe_dir, damage):
    from ragsieve.probe.model import load_head

    load_head(probe_dir)  # the fixture itself loads
    PROBE_DAMAGE[damage](probe_dir)
    with pytest.raises(RagsieveError) as info:
        load_head(probe_dir)
    message = one_line(info)
    assert "probe_config.json" in message or "probe.safetensors" in message, message
    assert "ragsieve probe train" in message


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    """A hybrid index over three passages with given (random) embeddings: no encoder is loaded."""
    import numpy as np

    from ragsieve.retrieve import build_index

    folder = tmp_path_factory.mktemp("index") / "idx"
    vecs = np.random.default_rng(0).normal(size=(len(TINY_PASSAGES), 8)).astype("float32")
    build_index(_passages(), folder, kind="hybrid", embeddings=vecs)
    return folder


INDEX_DAMAGE = {
    "truncated-bm25-npy": ("bm25/data.csc.index.npy", _truncate),
    "truncated-bm25-indptr": ("bm25/indptr.csc.index.npy", _truncate),
    "truncated-bm25-vocab": ("bm25/vocab.index.json", _truncate),
    "truncated-faiss": ("dense/index.faiss", _truncate),
    "truncated-embeddings": ("dense/embeddings.npy", _truncate),
    "missing-faiss": ("dense/index.faiss", Path.unlink),
    "missing-bm25-npy": ("bm25/data.csc.index.npy", Path.unlink),
    "hybrid-json-garbage": ("hybrid.json", lambda f: f.write_text("rrf_k=60")),
    "hybrid-json-missing-key": ("hybrid.json", lambda f: f.write_text('{"depth": 3}')),
    "dense-json-latin1": ("dense/dense.json", lambda f: f.write_bytes(b'{"encoder": "caf\xe9"}')),
    "manifest-truncated": ("manifest.json", _truncate),
    "passages-latin1": ("passages.jsonl", lambda f: f.write_bytes(b'{"id": "p0", "text": "caf\xe9"}\n')),
}


@pytest.mark.parametrize("damage", INDEX_DAMAGE, ids=list(INDEX_DAMAGE))
def test_damaged_index_is_one_line_naming_the_file(index_dir, tmp_path, damage):
    import shutil

    from ragsieve.retrieve import load_index

    copy = tmp_path / "idx"
    shutil.copytree(index_dir, copy)
    name, spoil = INDEX_DAMAGE[damage]
    spoil(copy / name)
    with pytest.raises(RagsieveError) as info:
        load_index(copy)
    message = one_line(info)
    # the damaged file, or for bm25s (which reads several files at once) its folder
    assert str(copy / name) in message or str((copy / name).parent) in message, message
    assert "ragsieve index" in message and "--overwrite" in message, message


def test_truncated_cached_llm_says_delete_the_cache(tmp_path, monkeypatch):
    from ragsieve.models.llm import _embedded_cache_dir, resolve_llm_path

    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path))
    cache = _embedded_cache_dir("smollm2-135m-instruct")
    cache.mkdir(parents=True)
    (cache / "config.json").write_text("{}")
    header = json.dumps({"w": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}).encode()
    (cache / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 100)
    with pytest.raises(RagsieveError) as info:
        resolve_llm_path("embedded:smollm2-135m-instruct")
    message = one_line(info)
    assert message.startswith(str(cache / "model.safetensors")) and "truncated" in message
    assert f"delete {cache}" in message and "rebuilds it" in message


GRADER_DAMAGE = {
    "truncated": lambda f: _truncate(f, 0.9),
    "empty": lambda f: f.write_bytes(b""),
    "garbage-header": lambda f: f.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}"),
}


@pytest.mark.parametrize("damage", GRADER_DAMAGE, ids=list(GRADER_DAMAGE))
def test_damaged_grader_weights_are_one_line_before_the_base_loads(tmp_path, monkeypatch, damage):
    import torch
    from safetensors.torch import save_file

    from ragsieve.registry import grader_class, load_grader
    from ragsieve.grade.base import CONFIG_FILE, WEIGHTS_FILE, GraderConfig

    folder = tmp_path / "grader"
    folder.mkdir()
    config = GraderConfig(kind="head", base="hf:/nonexistent/base", trained={"steps": 1})
    (folder / CONFIG_FILE).write_text(config.model_dump_json())
    save_file({"score.weight": torch.zeros(2, 16)}, str(folder / WEIGHTS_FILE))
    GRADER_DAMAGE[damage](folder / WEIGHTS_FILE)

    def no_base(cls, config):  # the base must not load for a file we can tell is broken
        raise AssertionError("base model loaded before the weights were checked")

    monkeypatch.setattr(grader_class("head"), "create", classmethod(no_base))
    with pytest.raises(RagsieveError) as info:
        load_grader(folder)
    _assert_damaged(info, folder / WEIGHTS_FILE, "ragsieve grader train")


def _store_with_pages(store_dir: Path) -> Path:
    """An evolve store whose file spans many pages (so a damaged page is not the header)."""
    from ragsieve.evolve.store import DB_FILE, EvolveStore

    store = EvolveStore(store_dir, create=True)
    with store.transaction() as conn:
        conn.exec_driver_sql(
            "INSERT INTO examples (id, round, data) VALUES (?, ?, ?)",
            [(f"x{i}", 1, json.dumps({"text": "padding " * 40})) for i in range(400)],
        )
    store.close()
    with sqlite3.connect(store_dir / DB_FILE) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return store_dir / DB_FILE


def _spoil_pages(db: Path) -> None:
    data = bytearray(db.read_bytes())
    data[4096 * 2 : 4096 * 6] = b"\xa5" * (4096 * 4)  # pages 3-6: b-tree pages turned to noise
    db.write_bytes(bytes(data))


STORE_DAMAGE = {
    "not-a-database": lambda db: db.write_bytes(b"this is not an SQLite file, just text\n" * 50),
    "garbage-pages": _spoil_pages,
    "truncated": lambda db: _truncate(db, 0.3),
}


@pytest.mark.parametrize("damage", STORE_DAMAGE, ids=list(STORE_DAMAGE))
@pytest.mark.parametrize("operation", ["step", "status"])
def test_corrupt_evolve_store_is_one_line(tmp_path, damage, operation):
    from ragsieve.evolve.store import run_step, store_status

    db = _store_with_pages(tmp_path / "store")
    STORE_DAMAGE[damage](db)
    with pytest.raises(RagsieveError) as info:
        (run_step if operation == "step" else store_status)(tmp_path / "store")
    _assert_damaged(info, db, "ragsieve evolve init")


# --------------------------------------------------------------------- 3. endpoint timeouts


class _SilentServer:
    """A loopback TCP server that accepts connections and then never answers (or trickles bytes)."""

    def __init__(self, trickle: bool = False):
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.trickle = trickle
        self.connections: list = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def spec(self) -> str:
        return f"openai:http://127.0.0.1:{self.sock.getsockname()[1]}/v1#m"

    def _serve(self) -> None:
        import threading

        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections.append(conn)
            if self.trickle:
                threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn) -> None:
        """Headers at once, then one body byte every 0.1 s: each read is quick, the answer endless."""
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
            while not self.stop.wait(0.1):
                conn.sendall(b" ")
        except OSError:
            pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for conn in self.connections:
            conn.close()
        self.sock.close()


@pytest.fixture
def silent_server():
    server = _SilentServer()
    yield server
    server.close()


@pytest.fixture
def trickle_server():
    server = _SilentServer(trickle=True)
    yield server
    server.close()


@pytest.mark.parametrize("server", ["silent_server", "trickle_server"])
def test_stalled_endpoint_fails_within_the_bound_with_a_warning_per_retry(request, server, caplog):
    import logging
    import time

    from ragsieve.models.llm import OpenAIChatLLM

    spec = request.getfixturevalue(server).spec
    llm = OpenAIChatLLM(spec, timeout=0.6, retries=2, backoff=0.05)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="ragsieve.models.llm"):
        with pytest.raises(RagsieveError) as info:
            llm.generate(["hello"])
    elapsed = time.monotonic() - start
    assert elapsed <= llm.worst_case_seconds + 1.0, elapsed
    message = one_line(info)
    assert "after 3 tries" in message and "--timeout" in message
    retries = [r for r in caplog.records if "retry" in r.getMessage()]
    assert [r.levelno for r in retries] == [logging.WARNING, logging.WARNING]
    assert "retry 1 of 2" in retries[0].getMessage()


def test_default_settings_give_up_on_a_dead_endpoint_within_30_seconds(monkeypatch):
    from ragsieve.models.llm import OpenAIChatLLM

    monkeypatch.delenv("RAGSIEVE_LLM_TIMEOUT", raising=False)
    monkeypatch.delenv("RAGSIEVE_LLM_RETRIES", raising=False)
    llm = OpenAIChatLLM("openai:http://127.0.0.1:9/v1#m")
    assert llm.retries >= 1 and llm.worst_case_seconds <= 30


def test_endpoint_settings_come_from_arguments_then_environment(monkeypatch):
    from ragsieve.models.llm import OpenAIChatLLM, endpoint_settings, load_llm

    monkeypatch.setenv("RAGSIEVE_LLM_TIMEOUT", "2.5")
    monkeypatch.setenv("RAGSIEVE_LLM_RETRIES", "0")
    assert endpoint_settings() == (2.5, 0)
    assert endpoint_settings(timeout=4, retries=1) == (4.0, 1)
    llm = load_llm("openai:http://127.0.0.1:9/v1#m", timeout=3, retries=5)
    assert isinstance(llm, OpenAIChatLLM) and (llm.timeout, llm.retries) == (3.0, 5)


@pytest.mark.parametrize(
    ("env", "value", "kwargs"),
    [
        ("RAGSIEVE_LLM_TIMEOUT", "soon", {}),
        ("RAGSIEVE_LLM_TIMEOUT", "-1", {}),
        ("RAGSIEVE_LLM_TIMEOUT", "0", {}),
        ("RAGSIEVE_LLM_TIMEOUT", "nan", {}),
        ("RAGSIEVE_LLM_RETRIES", "2.5", {}),
        ("RAGSIEVE_LLM_RETRIES", "-1", {}),
        (None, None, {"timeout": 0}),
        (None, None, {"retries": -2}),
        (None, None, {"retries": 2.5}),
    ],
)
def test_bad_endpoint_settings_are_one_line(monkeypatch, env, value, kwargs):
    from ragsieve.models.llm import endpoint_settings

    if env:
        monkeypatch.setenv(env, value)
    with pytest.raises(RagsieveError) as info:
        endpoint_settings(**kwargs)
    one_line(info)


def test_endpoint_answering_html_is_one_line():
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b"<html>\n<body>Bad gateway page</body>\n</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    from ragsieve.models.llm import OpenAIChatLLM

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        llm = OpenAIChatLLM(f"openai:http://127.0.0.1:{server.server_port}/v1#m", timeout=5, retries=0)
        with pytest.raises(RagsieveError) as info:
            llm.generate(["hi"])
        assert "not JSON" in one_line(info)
    finally:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------- 5. property: readers raise only one-liners

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
#: rows a user might put in a jsonl file: mostly objects with the usual keys, sometimes anything
_rows = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={k: _json_values for k in ("id", "text", "passage", "title", "question", "answers", "label")},
    ),
    _json_values,
)
_PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _only_one_line_errors(reader, path: Path) -> None:
    try:
        reader(path)
    except RagsieveError as exc:
        assert str(exc) and "\n" not in str(exc), repr(str(exc))


@pytest.mark.parametrize(("name", "suffix", "reader"), READERS, ids=READER_IDS)
@_PROPERTY
@given(data=st.binary(max_size=300) | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_random_bytes_raise_nothing_but_one_line_errors(tmp_path_factory, name, suffix, reader, data):
    path = tmp_path_factory.mktemp("bytes") / f"input{suffix}"
    path.write_bytes(data)
    _only_one_line_errors(reader, path)


@pytest.mark.parametrize(("name", "suffix", "reader"), READERS, ids=READER_IDS)
@_PROPERTY
@given(
    rows=st.lists(_rows, max_size=5),
    bom=st.booleans(),
    junk=st.sampled_from([b"", b"\n", b"{", b"\xff\xfe", b"\xe9"]),  # a cut last line, invalid UTF-8
)
def test_random_jsonl_rows_raise_nothing_but_one_line_errors(tmp_path_factory, name, suffix, reader, rows, bom, junk):
    text = "\n".join(json.dumps(row, ensure_ascii=False) for row in rows)
    data = (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8", "surrogatepass") + junk
    path = tmp_path_factory.mktemp("rows") / f"input{suffix}"
    path.write_bytes(data)
    _only_one_line_errors(reader, path)


# --------------------------------------------------------------------- option checks (before any model loads)


@pytest.mark.parametrize(
    ("check", "value"),
    [
        ("positive_int", 0),
        ("positive_int", -3),
        ("positive_int", 2.5),
        ("positive_int", True),
        ("non_negative_int", -3),
        ("positive_number", 0.0),
        ("positive_number", float("inf")),
        ("positive_number", float("nan")),
        ("unit_interval", 1.5),
        ("unit_interval", -0.1),
        ("unit_interval", float("nan")),
    ],
)
def test_option_checks_refuse_bad_values_in_one_line(check, value):
    from ragsieve import checks

    with pytest.raises(RagsieveError) as info:
        getattr(checks, check)(value, "--option")
    assert one_line(info).startswith("--option must be")


def test_option_checks_pass_good_values_and_none():
    import numpy as np

    from ragsieve.checks import non_negative_int, positive_int, positive_number, unit_interval

    assert positive_int(3, "k") == 3 and positive_int(np.int64(2), "k") == 2 and positive_int(None, "k") is None
    assert non_negative_int(0, "r") == 0 and positive_number(0.5, "t") == 0.5 and unit_interval(1, "b") == 1


def test_output_and_input_folders_are_checked_without_creating_anything(tmp_path):
    from ragsieve.checks import existing_dir, output_dir

    assert output_dir(tmp_path / "new" / "out") == tmp_path / "new" / "out" and not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(RagsieveError, match="already exists; use --overwrite"):
        output_dir(tmp_path / "old")
    assert output_dir(tmp_path / "old", overwrite=True) == tmp_path / "old"
    with pytest.raises(RagsieveError, match="is a file"):
        output_dir(tmp_path / "file", overwrite=True)
    with pytest.raises(RagsieveError, match="is a file"):
        existing_dir(tmp_path / "file", "probe")
    with pytest.raises(RagsieveError, match="probe folder not found"):
        existing_dir(tmp_path / "nope", "probe")


@pytest.mark.parametrize("max_new_tokens", [0, -1])
def test_generation_length_below_one_is_one_line_before_any_request(max_new_tokens):
    from ragsieve.models.llm import OpenAIChatLLM

    llm = OpenAIChatLLM("openai:http://127.0.0.1:9/v1#m", retries=0)  # nothing listens: a request would fail
    with pytest.raises(RagsieveError) as info:
        llm.generate(["hi"], max_new_tokens=max_new_tokens)
    assert one_line(info).startswith("max_new_tokens must be")


def test_local_generation_length_below_one_is_one_line(tiny_llm_dir):
    from ragsieve.models.llm import load_local_llm

    llm = load_local_llm(str(tiny_llm_dir))
    with pytest.raises(RagsieveError) as info:
        llm.generate(["hi"], max_new_tokens=0)
    assert one_line(info).startswith("max_new_tokens must be")


def test_damaged_hidden_state_cache_says_delete_it(tmp_path):
    from ragsieve.probe.cache import StateCache

    path = tmp_path / "states.sqlite"
    path.write_bytes(b"not a database " * 100)
    with pytest.raises(RagsieveError) as info:
        StateCache(path)
    _assert_damaged(info, path, f"delete {path}")


# --------------------------------------------------------------------- streamed results survive a kill


def test_streamed_results_survive_a_kill_and_resume(tmp_path):
    import subprocess
    import sys

    from ragsieve.data.resumable import ResumableJsonl

    out = tmp_path / "graded.jsonl"
    # a job killed after 3 of 10 items, in the middle of writing the 4th row
    code = (
        "import os, signal, sys\n"
        "from ragsieve.data.resumable import ResumableJsonl\n"
        "out = ResumableJsonl(sys.argv[1], key=('q', 'p'))\n"
        "for i in out.pending(range(10), key=lambda i: ('q1', i)):\n"
        "    if i == 3:\n"
        "        open(sys.argv[1], 'a').write('{\"q\": \"q1\", \"p\": 3, \"sc')\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    out.write({'q': 'q1', 'p': i, 'score': i / 10})\n"
    )
    assert subprocess.run([sys.executable, "-c", code, str(out)], env={**os.environ}).returncode == -9

    resumed = ResumableJsonl(out, key=("q", "p"))
    assert len(resumed) == 3 and resumed.skipped == 1 and ("q1", 2) in resumed
    todo = resumed.pending(range(10), key=lambda i: ("q1", i))
    assert todo == list(range(3, 10))
    for i in todo:
        resumed.write({"q": "q1", "p": i, "score": i / 10})
    again = ResumableJsonl(out, key=("q", "p"))
    assert [r["p"] for r in again.rows()] == list(range(10)) and again.pending(range(10), lambda i: ("q1", i)) == []
    assert ResumableJsonl(out, key=("q", "p"), overwrite=True).rows() == []


def test_resuming_on_another_commands_output_is_one_line(tmp_path):
    from ragsieve.data.resumable import ResumableJsonl

    out = tmp_path / "other.jsonl"
    out.write_text('{"question": "who?"}\n')
    with pytest.raises(DataError) as info:
        ResumableJsonl(out, key="id")
    assert "--overwrite" in one_line(info)


@pytest.mark.parametrize("loader", ["grader", "store", "probe"])
def test_a_file_given_for_a_folder_is_named_as_a_file(tmp_path, loader):
    from ragsieve.evolve.store import store_status
    from ragsieve.registry import load_grader
    from ragsieve.probe.model import load_head

    file = tmp_path / "model.bin"
    file.write_bytes(b"x")
    with pytest.raises(RagsieveError) as info:
        {"grader": load_grader, "store": store_status, "probe": load_head}[loader](file)
    message = one_line(info)
    assert "is a file" in message or "not a saved probe" in message


def test_truncated_cross_encoder_folder_is_one_line(tiny_cross_encoder_dir, tmp_path):
    import shutil

    from ragsieve.registry import load_reranker

    folder = tmp_path / "reranker"
    shutil.copytree(tiny_cross_encoder_dir, folder)
    _truncate(folder / "model.safetensors")
    with pytest.raises(RagsieveError) as info:
        load_reranker(str(folder))
    _assert_damaged(info, folder / "model.safetensors", "ragsieve rerank train")


def test_truncated_lora_adapter_is_one_line_before_the_merge(tmp_path):
    import torch
    from safetensors.torch import save_file

    from ragsieve.models.lora import merge_adapter

    folder = tmp_path / "adapters" / "round-001"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    save_file({"lora_A": torch.zeros(64, 64)}, str(folder / "adapter_model.safetensors"))
    _truncate(folder / "adapter_model.safetensors")
    with pytest.raises(RagsieveError) as info:
        merge_adapter(llm=None, path=folder)  # refused before the LLM is touched
    _assert_damaged(info, folder / "adapter_model.safetensors", "ragsieve evolve init")


def test_unwritable_place_for_a_build_is_one_line(tmp_path):
    from ragsieve.atomic import atomic_directory, atomic_file

    (tmp_path / "file").write_text("x")  # a file where a folder should be: fails for root too
    with pytest.raises(RagsieveError) as info:
        with atomic_directory(tmp_path / "file" / "idx"):
            pass
    assert "cannot write here" in one_line(info)
    with pytest.raises(RagsieveError) as info:
        with atomic_file(tmp_path / "file" / "rows.jsonl"):
            pass
    assert "cannot write here" in one_line(info)
