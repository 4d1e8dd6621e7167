"""Schemathesis against the app's own OpenAPI schema: every operation, authenticated with a
real API key, on PostgreSQL. No 5xx and every documented response matches its schema.

Bounded: a few examples per operation (the whole run takes well under a minute).
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance

from tests.api.conftest import upload

EXAMPLES_PER_OPERATION = 25


def test_api_conforms_to_its_schema(app, client, team_a) -> None:
    # a real file, so that the listing routes have something to render
    assert upload(client, team_a).status_code == 201
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    tested = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],  # no shrinking: report the first failure
        )
        def run(case) -> None:
            headers = {**(case.headers or {}), **team_a.headers}
            case.call_and_validate(
                headers=headers, checks=[not_a_server_error, response_schema_conformance]
            )

        run()
        tested.append(operation.label)
    print(f"{len(tested)} operations x {EXAMPLES_PER_OPERATION} examples: {tested}")
