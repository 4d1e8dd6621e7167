"""API keys and operator secrets (the judge's key, AWS credentials) never reach a response or a
log line, on any route, for the owner, another team or a wrong key."""

from __future__ import annotations

import json
import logging

from tests.security.conftest import AWS_SECRET, JUDGE_SECRET, every_route


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage() + " " + json.dumps(record.__dict__, default=str))


def test_api_keys_and_secrets_never_logged_nor_returned(client, app, team_a, team_b, world, capsys):
    handler = Collect()
    loggers = [logging.getLogger(), logging.getLogger("humanline"), logging.getLogger("uvicorn")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    responses = []
    try:
        wrong = team_a.key[:-4] + "AAAA"
        for headers in (team_a.headers, team_b.headers, {"Authorization": f"Bearer {wrong}"}):
            for method, path, params, body in every_route(world):
                if "stream" in path:
                    continue
                responses.append(
                    client.request(method, path, headers=headers, params=params, json=body)
                )
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/v1/nowhere"):
            responses.append(client.get(path, headers=team_a.headers))
        responses.append(client.post("/v1/jobs", headers=team_a.headers, content=b"{not json"))
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)
    captured = capsys.readouterr()  # once: a second read would find both streams empty
    logged = "\n".join(handler.lines) + captured.out + captured.err
    assert len(handler.lines) > 0
    for secret in (team_a.key, team_b.key, wrong, team_a.key.split("_", 1)[-1]):
        assert secret not in logged, "an API key reached the logs"
    for r in responses:
        text = r.text + json.dumps(dict(r.headers))
        for secret in (team_a.key, team_b.key, wrong, JUDGE_SECRET, AWS_SECRET):
            assert secret not in text, (r.request.url, secret)
    assert JUDGE_SECRET not in logged and AWS_SECRET not in logged
