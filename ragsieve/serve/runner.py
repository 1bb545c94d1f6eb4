"""Run the app with uvicorn: in the foreground (the CLI) or on a background thread (tests, bench).

The background server binds its socket before returning, so a client may connect at
once (the kernel queues the connection until uvicorn accepts it): no start-up polling.

Example::

    with BackgroundServer(create_app(ServeConfig(reranker="bm25"))) as server:
        httpx.post(server.url + "/v1/rerank", json={"query": "q", "documents": ["a", "b"]})
"""

from __future__ import annotations

import socket
import threading

DEFAULT_HOST = "127.0.0.1"  # loopback unless the operator asks for more


def bind(host: str = DEFAULT_HOST, port: int = 0) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def uvicorn_server(app, *, log_level: str = "warning", access_log: bool = False):
    import uvicorn

    # our Guard middleware logs every request with its id, so uvicorn's access log is off
    config = uvicorn.Config(
        app, log_level=log_level, access_log=access_log, lifespan="on", timeout_graceful_shutdown=5, backlog=2048
    )
    return uvicorn.Server(config)


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
