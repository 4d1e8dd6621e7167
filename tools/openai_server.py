"""A small OpenAI-compatible chat server over a local model: the offline judge.

    python -m tools.openai_server --model smollm2-135m-instruct --port 8100

Serves POST /v1/chat/completions (model, messages, temperature, top_p, max_tokens /
max_completion_tokens, n, seed, stop), GET /v1/models and GET /health, with a real model and
transformers `generate` (one request decodes at a time, under a lock). It is for demos and
tests of the evaluation pipeline (real model, real HTTP); a production judge is vLLM or a
hosted model behind the same API. `--api-key` makes it demand `Authorization: Bearer KEY`.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from typing import Annotated, Literal

from fastapi import FastAPI, Header, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from trainer.evaluation.generation import Generator

MAX_TOKENS_CAP = 2048


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send more than we use
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_CAP)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_CAP)
    n: int = Field(1, ge=1, le=16)
    seed: int | None = None
    stop: str | list[str] | None = None


def _cut(text: str, stop: str | list[str] | None) -> tuple[str, bool]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    cuts = [text.find(s) for s in stops if s and s in text]
    return (text[: min(cuts)], True) if cuts else (text, False)


def create_app(generator: Generator, served_name: str, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="humanline local OpenAI-compatible server")
    lock = threading.Lock()

    def check_key(authorization: str | None) -> None:
        if api_key and authorization != f"Bearer {api_key}":
            raise HTTPException(401, detail={"message": "invalid API key", "type": "auth"})

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "model": served_name}

    @app.get("/v1/models")
    def models(authorization: Annotated[str | None, Header()] = None) -> dict:
        check_key(authorization)
        return {
            "object": "list",
            "data": [{"id": served_name, "object": "model", "owned_by": "local"}],
        }

    @app.post("/v1/chat/completions")
    def chat(req: ChatRequest, authorization: Annotated[str | None, Header()] = None) -> dict:
        check_key(authorization)
        if req.model != served_name:
            raise HTTPException(
                404,
                detail={
                    "message": f"model {req.model!r} not served; this server has {served_name!r}"
                },
            )
        messages = [m.model_dump() for m in req.messages]
        max_new = req.max_completion_tokens or req.max_tokens or 256
        with lock:
            samples = generator.generate(
                [messages],
                n=req.n,
                temperature=req.temperature,
                top_p=req.top_p,
                max_new_tokens=max_new,
                seed=req.seed if req.seed is not None else 0,
            )[0]
        prompt_tokens = generator.prompt_tokens(messages)
        choices = []
        for i, s in enumerate(samples):
            text, stopped = _cut(s.text, req.stop)
            choices.append(
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop" if stopped else s.finish_reason,
                }
            )
        completion_tokens = sum(s.num_tokens for s in samples)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": served_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="A built-in model name or a model dir.")
    parser.add_argument("--served-name", help="The model id clients send (default: --model).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--api-key", default=None, help="Require this bearer key.")
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)

    import uvicorn

    generator = Generator.from_source({"type": "base", "name": args.model}, device=args.device)
    app = create_app(generator, args.served_name or args.model, args.api_key)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
