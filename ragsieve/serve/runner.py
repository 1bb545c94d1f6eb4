"""Run the app with uvicorn: in the foreground (the CLI) or on a background thread (tests, bench).

The background server binds its socket before returning, so a client may connect at
once (the kernel queues the connection until uvicorn accepts it): no start-up polling.

Example::

    with BackgroundServer(create_app(ServeConfig(reranker="bm25"))) as server:
        httpx.post(server.url + "/v1/rerank", json={"query": "q", "documents": ["a", "b"]})
"""

from __future__ import annotations

import errno
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable

import uvicorn

from ragsieve.errors import RagsieveError

DEFAULT_HOST = "127.0.0.1"  # loopback unless the operator asks for more
BACKLOG = 2048

log = logging.getLogger("ragsieve.serve")


def reserve(host: str = DEFAULT_HOST, port: int = 0) -> socket.socket:
    """A socket bound to ``host:port`` but not listening yet: taken before the models load, so a port in use or
    a host that is not this machine's fails at once in one line (:class:`RagsieveError`), and nobody else takes
    the port meanwhile; connections are refused, not left hanging, until :func:`listen`.

    Example::

        sock = reserve("127.0.0.1", 8080)   # RagsieveError: --port 8080: already in use ...
        app = create_app(config)            # the models load
        listen(sock)
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise RagsieveError(f"--host {host}: does not resolve ({getattr(exc, 'strerror', None) or exc})") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise RagsieveError(f"--port {port}: already in use on {host} (stop what holds it, or pick another "
                                "port; 0 takes any free one)") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise RagsieveError(f"--host {host}: not an address of this machine (use 127.0.0.1, 0.0.0.0 or one "
                                "of its own addresses)") from None
        if exc.errno == errno.EACCES:
            raise RagsieveError(f"--port {port}: permission denied (ports below 1024 need privileges)") from None
        raise RagsieveError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def check_address(host: str, port: int) -> None:
    """:func:`reserve`'s checks for a server that binds the port itself (Ray Serve's proxy): the port is free
    now and the host is this machine's (one line, :class:`RagsieveError`, otherwise)."""
    reserve(host, port).close()


def listen(sock: socket.socket) -> socket.socket:
    sock.listen(BACKLOG)
    return sock


def bind(host: str = DEFAULT_HOST, port: int = 0) -> socket.socket:
    """A listening socket on ``host:port``."""
    return listen(reserve(host, port))


def uvicorn_server(app, *, log_level: str = "warning", access_log: bool = False, graceful_s: float = 5.0,
                   drain_s: float = 0.0, on_drain: Callable[[], None] | None = None,
                   on_stop: Callable[[], None] | None = None) -> DrainingServer:
    """``graceful_s``: after the drain, how long in-flight requests may run before they are cancelled;
    ``drain_s``, ``on_drain``, ``on_stop``: see :class:`DrainingServer`."""
    # our Guard middleware logs every request with its id, so uvicorn's access log is off
    config = uvicorn.Config(
        app, log_level=log_level, access_log=access_log, lifespan="on", timeout_graceful_shutdown=graceful_s,
        backlog=BACKLOG,
    )
    return DrainingServer(config, drain_s=drain_s, on_drain=on_drain, on_stop=on_stop)


class DrainingServer(uvicorn.Server):
    """uvicorn under Kubernetes' termination contract. On SIGTERM ``on_drain`` runs at once (``/ready`` answers
    503, so the load balancer stops sending) and the server goes on reading and answering for ``drain_s``:
    requests already in the socket, or sent by a balancer that has not seen the 503 yet, are answered. Then
    ``on_stop`` runs (a request arriving later on an open connection is refused with 503 + ``Retry-After``) and
    uvicorn's own shutdown follows: it stops accepting and lets in-flight requests finish within
    ``timeout_graceful_shutdown``. A second SIGTERM, or SIGINT (Ctrl-C), skips the rest of the drain."""

    def __init__(self, config: uvicorn.Config, *, drain_s: float = 0.0, on_drain: Callable[[], None] | None = None,
                 on_stop: Callable[[], None] | None = None):
        super().__init__(config)
        self.drain_s = drain_s
        self.on_drain = on_drain
        self.on_stop = on_stop
        self.drain_until: float | None = None

    def handle_exit(self, sig: int, frame) -> None:
        if sig == signal.SIGTERM and self.drain_until is None and not self.should_exit:
            self._captured_signals.append(sig)  # re-raised once the server is down, as uvicorn does
            self.drain_until = time.monotonic() + self.drain_s
            log.warning("SIGTERM: /ready answers 503; serving %.1f s more, then finishing in-flight requests "
                        "(within %.0f s)", self.drain_s, self.config.timeout_graceful_shutdown or 0)
            if self.on_drain is not None:
                self.on_drain()
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_until is not None and time.monotonic() >= self.drain_until:
            self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets=None) -> None:
        if self.on_stop is not None:
            self.on_stop()
        await super().shutdown(sockets=sockets)


class BackgroundServer:
    """uvicorn on a loopback port in a daemon thread; ``url`` is ready as soon as this returns."""

    def __init__(self, app, host: str = DEFAULT_HOST, port: int = 0, log_level: str = "warning"):
        self.sock = bind(host, port)
        bound_host, bound_port = self.sock.getsockname()[:2]
        self.url = f"http://{bound_host}:{bound_port}"
        self.server = uvicorn_server(app, log_level=log_level)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
