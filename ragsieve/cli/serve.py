"""``ragsieve serve``: the rerank / filter HTTP service (see :mod:`ragsieve.serve`).

Example::

    ragsieve serve --reranker embedded:base --port 8080            # loopback only
    ragsieve serve --grader results/grader/models/C-long --api-key "$KEY" --host 0.0.0.0
    ragsieve serve -r bm25 --ray local --replicas 2 --feedback-store store/   # Ray Serve: two replicas
    curl -s localhost:8080/v1/rerank -d '{"query": "who wrote hamlet", "documents": ["Paris", "Shakespeare"]}'
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Optional

import typer

from ragsieve.cli.app import app, err_console
from ragsieve.errors import RagsieveError


@app.command("serve")
def serve_cmd(
    sieve: Optional[Path] = typer.Option(
        None, "--sieve", help="A fitted sieve folder (`ragsieve fit`): its reranker, grader, LLM, probe and β."
    ),
    reranker: Optional[str] = typer.Option(None, "--reranker", "-r", help="Reranker spec (default embedded:base)."),
    calibration: Optional[Path] = typer.Option(
        None, "--calibration",
        help="Calibration JSON for the reranker, fitted on your labelled pairs (`ragsieve rerank calibrate`).",
    ),
    grader: Optional[str] = typer.Option(
        None, "--grader", help="Saved grader for /v1/filter (folder or embedded:<name>)."
    ),
    llm: Optional[str] = typer.Option(None, "--llm", help="LLM spec for /v1/ask and /v1/gate (none: not served)."),
    probe: Optional[str] = typer.Option(None, "--probe", help="Probe for /v1/gate, e.g. embedded:smollm2-nq."),
    cbdr_beta: Optional[float] = typer.Option(None, "--cbdr-beta", help="Retrieve when Conf(Q) <= beta."),
    index: Optional[str] = typer.Option(
        None, "--index", help="Index folder or postgresql:// URL for /v1/ask (none: closed-book)."
    ),
    feedback_store: Optional[str] = typer.Option(
        None, "--feedback-store",
        help="Evolve store that /v1/feedback appends to (`ragsieve evolve init`): its folder, or the "
             "postgresql:// URL of a PostgreSQL store's rows (with --ray every replica writes it).",
    ),
    log_traffic: bool = typer.Option(
        False, "--log-traffic",
        help="Write served (query, documents) to --feedback-store as unlabelled examples for `evolve step`.",
    ),
    embedding_cache_mb: Optional[float] = typer.Option(
        None, "--embedding-cache-mb",
        help="Passage vectors kept for the reranker's cosine half across requests (default 256 MB, 0: none).",
    ),
    config: Optional[Path] = typer.Option(
        None, "--config", "-c", help="YAML/JSON of ServeConfig fields (limits, batching, ...)."
    ),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; loopback unless you mean to expose it."),
    port: int = typer.Option(8080, help="Port (0 = any free port; the URL is printed)."),
    api_key: Optional[str] = typer.Option(
        None,
        "--api-key",
        envvar="RAGSIEVE_API_KEY",
        show_envvar=True,
        help="Require this key (Authorization: Bearer / X-API-Key) on every endpoint but /health.",
    ),
    log_level: str = typer.Option("info", help="debug | info | warning | error"),
    ray: Optional[str] = typer.Option(
        None, "--ray",
        help="Serve --replicas copies on Ray Serve: 'local' (a Ray instance here) or a cluster address (ragsieve[ray]).",
    ),
    replicas: Optional[int] = typer.Option(
        None, "--replicas", help="With --ray: copies of the app, each with its own models (default 2)."
    ),
    verbose: bool = typer.Option(
        False, "--verbose", help="Show third-party progress bars and warnings (model loading, ONNX export)."
    ),
) -> None:
    """Serve Cohere/Jina/TEI-compatible /v1/rerank, /v2/rerank, /rerank and /v1/filter."""
    if not 0 <= port <= 65535:  # before any model loads (socket.bind would raise OverflowError)
        raise RagsieveError(f"--port {port}: a TCP port is 1-65535 (0 = any free port)")
    from ragsieve.config import build_config, read_mapping
    from ragsieve.serve import ServeConfig
    from ragsieve.serve.runner import check_address

    values = read_mapping(config) if config else {}
    options = {
        "sieve": str(sieve) if sieve else None,
        "reranker": reranker,
        "calibration": str(calibration.resolve()) if calibration else None,  # Ray replicas run elsewhere
        "grader": grader,
        "api_key": api_key,
        "llm": llm,
        "probe": probe,
        "cbdr_beta": cbdr_beta,
        "index": str(index) if index else None,
        "feedback_store": feedback_store,  # a folder, or a URL the store accepts: passed through as given
        "log_traffic": log_traffic or None,
        "embedding_cache_mb": embedding_cache_mb,
    }
    values.update({k: v for k, v in options.items() if v is not None})  # options override the file
    cfg = build_config(ServeConfig, values, source=str(config or "serve options"))
    logging.getLogger("ragsieve.serve").setLevel(log_level.upper())
    if ray is not None:
        check_address(host, port)  # before Ray starts and the replicas load their models
        return _serve_on_ray(cfg, ray, 2 if replicas is None else replicas, host, port)
    if replicas is not None:
        raise RagsieveError("--replicas needs --ray (one uvicorn process serves one copy)")
    _serve_here(cfg, host, port, log_level)


def _serve_here(cfg, host: str, port: int, log_level: str) -> None:
    """One uvicorn process: the address taken first, the models loaded, then serve until SIGTERM."""
    from ragsieve.serve import create_app
    from ragsieve.serve.runner import listen, reserve, uvicorn_server

    # the address is checked and taken before the models load (≈ 20 s): a port in use fails at once, in one line
    sock = reserve(host, port)
    err_console.print(f"loading {cfg.sieve or cfg.reranker}" + (f" + grader {cfg.grader}" if cfg.grader else ""))
    try:
        application = create_app(cfg)
    except BaseException:  # a bad spec: the port goes back at once
        sock.close()
        raise
    listen(sock)
    bound_host, bound_port = sock.getsockname()[:2]
    auth = "API key required" if cfg.api_key else "no API key"
    # one line a supervisor (or a test) can read the URL from
    print(f"ragsieve serve: http://{bound_host}:{bound_port} ({auth})", flush=True)
    state = application.state.serve
    server = uvicorn_server(application, log_level=log_level, graceful_s=cfg.shutdown_grace_s, drain_s=cfg.drain_s,
                            on_drain=state.drain, on_stop=state.stop)
    # SIGTERM: /ready answers 503 and requests are still served for drain_s; then uvicorn stops accepting, lets
    # in-flight requests finish (shutdown_grace_s), and the app's shutdown writes the queued traffic; it then
    # re-raises the signal, which this handler absorbs, so the exit code is 0
    signal.signal(signal.SIGTERM, lambda *_: None)
    server.run(sockets=[sock])


def _serve_on_ray(cfg, address: str, replicas: int, host: str, port: int) -> None:
    """Deploy on Ray Serve, print the URL, and keep the deployment up until interrupted."""
    import threading

    from ragsieve.serve.ray import APP_NAME, serve_on_ray

    err_console.print(f"deploying {replicas} replica(s) of {cfg.sieve or cfg.reranker} on Ray ({address})")
    url = serve_on_ray(cfg, address=address, replicas=replicas, host=host, port=port)
    auth = "API key required" if cfg.api_key else "no API key"
    print(f"ragsieve serve: {url} ({auth}, {replicas} replicas on Ray Serve)", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        from ray import serve

        serve.delete(APP_NAME)  # the app goes with this command; a cluster keeps running
