"""The error renderer (api.error_bodies.error_body): whatever a message or field carries, the
error goes out as the 4xx it is, never a 500 from encoding it."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.errors import api_error, install_error_handlers


def test_lone_surrogates_anywhere_in_an_error_are_escaped_not_a_500():
    """UTF-8 cannot encode a lone surrogate (a request's "\\ud800", decoded from JSON, echoed
    in a message): the response that said so failed to encode, and a 4xx became a 500."""
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    def boom():
        raise api_error(
            400,
            "bad value \ud800 here",
            field="x.\udfff",
            errors=[{"field": "\ud800", "loc": ["body", "\ud800", 0], "message": "é \udc80"}],
        )

    r = TestClient(app).get("/boom")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"] == "bad value \\ud800 here"
    assert error["field"] == error["param"] == "x.\\udfff"
    assert error["errors"] == [
        {"field": "\\ud800", "loc": ["body", "\\ud800", 0], "message": "é \\udc80"}
    ]
