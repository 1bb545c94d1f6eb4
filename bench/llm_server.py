"""A tiny OpenAI-compatible ``/v1/chat/completions`` server over a local LLM (the embedded SmolLM2 by default).

It stands in for vLLM / Ollama / a hosted API, so an endpoint-only ``ragsieve fit --llm openai:URL#model``
can be run and tested on one machine: the tests start it on a loopback port (``serve_in_background``),
and a real endpoint-only fit runs against it from another shell::

    python bench/llm_server.py --port 8011            # serves embedded:smollm2-135m-instruct
    ragsieve fit --llm openai:http://127.0.0.1:8011/v1#smollm2 --index IDX --questions QA --out SIEVE

Greedy decoding only (``temperature`` is ignored; ``max_tokens`` is honoured): the answers are the
local LLM's own, so an endpoint fit sees what a local fit would.
"""

# no `from __future__ import annotations`: FastAPI and pydantic read the request model's annotations at run time

import argparse
import threading
import time
from typing import Any

from pydantic import BaseModel


class Message(BaseModel):
    role: str
    content: str


class ChatRequest(BaseModel):
    model: str = "local"
    messages: list[Message]
    max_tokens: int = 32
    temperature: float = 0.0  # ignored: answers are greedy


def create_app(llm: Any):
    """The FastAPI app answering ``POST /v1/chat/completions`` with ``llm.generate`` (system + last user message)."""
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title="ragsieve loopback LLM")
    lock = threading.Lock()  # one generation at a time: the model is not shared across threads

    @app.post("/v1/chat/completions")
    def chat(request: ChatRequest) -> dict:
        users = [m.content for m in request.messages if m.role == "user"]
        if not users or request.max_tokens < 1:
            raise HTTPException(422, "need a user message and max_tokens >= 1")
        system = next((m.content for m in request.messages if m.role == "system"), None)
        with lock:
            answer = llm.generate([users[-1]], system=system, max_new_tokens=request.max_tokens, batch_size=1)[0]
        return {"id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion", "model": request.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}]}

    return app


def serve_in_background(llm: Any):
    """The app on a free loopback port in a daemon thread; ``.url`` + ``/v1`` is the endpoint, ``.close()`` stops it."""
    from ragsieve.serve.runner import BackgroundServer

    return BackgroundServer(create_app(llm))


def main() -> None:
    import uvicorn

    from ragsieve.models import load_local_llm
    from ragsieve.models.specs import DEFAULT_LLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm", default=DEFAULT_LLM, help="a local LLM spec (embedded:..., an HF folder)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    args = parser.parse_args()
    uvicorn.run(create_app(load_local_llm(args.llm)), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
