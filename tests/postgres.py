"""A real PostgreSQL for the tests: ``initdb`` in a temporary folder, ``pg_ctl`` on a free loopback
port with its unix socket in that folder, stopped and removed afterwards.

PostgreSQL refuses to run as root: under root the server runs as the ``postgres`` system user
(``nobody`` where there is none), which owns the temporary folder. Binaries come from
``RAGSIEVE_PG_BIN`` or Debian's ``/usr/lib/postgresql/<version>/bin``.

Example::

    with TempPostgres() as pg:
        url = pg.new_database()        # postgresql://ragsieve@127.0.0.1:<port>/t_<hex>, empty
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

SUPERUSER = "ragsieve"


def pg_bin() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl`` (the newest Debian install), or None."""
    given = os.environ.get("RAGSIEVE_PG_BIN")
    candidates = [given] if given else sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for folder in candidates:
        if folder and (Path(folder) / "initdb").is_file() and (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    return None


def skip_reason() -> str | None:
    """Why PostgreSQL tests cannot run here (None: they can)."""
    if pg_bin() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) not found: set RAGSIEVE_PG_BIN or install postgresql"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (make install)"
    return None


def _server_user() -> pwd.struct_passwd | None:
    """The account the server runs as when we are root (it refuses root); None: run as ourselves."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root and there is neither a 'postgres' nor a 'nobody' user to run PostgreSQL as")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TempPostgres:
    """One throwaway server (see the module doc); ``new_database()`` gives each test its own database."""

    def __init__(self, *, fsync: bool = False) -> None:
        self.fsync = fsync  # off for tests (nothing to keep); on for a benchmark of real commits
        self.bin = pg_bin()
        if self.bin is None:
            raise RuntimeError(skip_reason())
        self.user = _server_user()
        self.root = Path(tempfile.mkdtemp(prefix="ragsieve-pg-"))
        self.data = self.root / "data"
        self.port = 0

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        kwargs = {}
        if self.user is not None:
            kwargs = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        return subprocess.run(
            [str(self.bin / args[0]), *args[1:]], cwd=self.root, capture_output=True, text=True, check=check,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}, timeout=120, **kwargs,
        )

    def start(self) -> "TempPostgres":
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "--encoding=UTF8",
                  "--no-locale", "--no-sync")
        for _ in range(3):  # the free port may be taken between the probe and the bind
            self.port = _free_port()
            options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=100"
            options += "" if self.fsync else " -F"
            done = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                             "-o", options, "start", check=False)
            if done.returncode == 0:
                return self
        raise RuntimeError(f"PostgreSQL did not start: {done.stderr}\n{self.log()}")

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace")[-2000:] if path.is_file() else ""

    def stop(self) -> None:
        if self.data.is_dir():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """An empty database of its own (a test's store), by URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop a database under its users' feet (their sessions are ended): a store that went away."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {url.rsplit('/', 1)[1]} WITH (FORCE)")

    def __enter__(self) -> "TempPostgres":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
