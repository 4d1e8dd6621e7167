"""Team isolation on every route: another team's requests get 404 and none of the owner's
data, requests without a key 401, and ids that look like keys or traversals are unknown ids
(DESIGN.md §6). PostgreSQL (tests/security/conftest.py)."""

from __future__ import annotations

from tests.api.conftest import stored_objects
from tests.security.conftest import MARKER, every_route


def test_other_teams_get_404_on_every_route_and_no_data(client, team_a, team_b, world, store):
    objects_before = stored_objects(store)
    for method, path, params, body in every_route(world):
        r = client.request(method, path, headers=team_b.headers, params=params, json=body)
        assert r.status_code == 404, (method, path, r.status_code, r.text)
        assert r.json()["error"]["type"] == "not_found_error", r.text
        for secret in (MARKER, team_a.id, "model.safetensors", "step-4"):
            if secret not in path:  # a 404 may name the id it was asked for (a model's)
                assert secret not in r.text, (method, path, secret, r.text)
    for path in ("/v1/files", "/v1/jobs", "/v1/evaluations", "/v1/webhooks"):
        r = client.get(path, headers=team_b.headers)
        assert r.status_code == 200 and r.json()["data"] == [], (path, r.text)
    # nothing of team A's was touched
    assert stored_objects(store) == objects_before
    assert client.get(f"/v1/jobs/{world.job}", headers=team_a.headers).json()["status"] == (
        "succeeded"
    )
    assert client.get(f"/v1/files/{world.train}", headers=team_a.headers).status_code == 200
    # and the owner does see all of it
    for method, path, params, _body in every_route(world):
        if method == "GET" and "stream" not in path:
            r = client.get(path, headers=team_a.headers, params=params)
            assert r.status_code == 200, (path, r.text)


def test_every_route_that_names_an_object_is_in_every_route(app, world):
    """every_route is written by hand: a route added later must be added there too."""
    from starlette.routing import Match

    named = {
        (method, route.path)
        for route in app.routes
        if "{" in getattr(route, "path", "")
        for method in getattr(route, "methods", None) or ()
        if method != "HEAD"
    }
    creates = {("POST", "/v1/jobs"), ("POST", "/v1/evaluations"), ("POST", "/v1/fine_tuning/jobs")}
    covered = set()
    for method, path, _params, _body in every_route(world):
        scope = {"type": "http", "path": path, "method": method, "root_path": ""}
        full = [r for r in app.routes if r.matches(scope)[0] == Match.FULL]
        assert len(full) == 1, (method, path, full)
        covered.add((method, full[0].path))
    assert named | creates <= covered, sorted((named | creates) - covered)


def test_every_route_needs_a_key(app, client, world):
    from api.ratelimit import AuthFailureLimiter

    # more keyless requests than the failed-login burst (20; tests/security/test_brute_force.py)
    app.state.auth_limiter = AuthFailureLimiter(per_minute=1000)
    for method, path, params, body in every_route(world):
        r = client.request(method, path, params=params, json=body)
        assert r.status_code == 401, (method, path, r.text)
        assert MARKER not in r.text


def test_cross_team_object_keys_via_ids_are_404(client, team_a, team_b, world):
    """Ids that look like keys or traversals are just unknown ids, to the owner too. Each
    request reaches the route (its 404 names the field): an id with a '/' is refused by
    routing before any lookup, so the fakes here carry none."""
    job = world.job
    assert client.get(f"/v1/jobs/{job}", headers=team_a.headers).status_code == 200
    fakes = (f"..{job}", f"{job}..", f".\\{job}", f"{job}%2e%2e", job.upper(), f" {job}")
    for fake in (job, *fakes):
        for team in (team_b,) if fake == job else (team_a, team_b):
            for tail in ("", "/checkpoints", "/events"):
                path = f"/v1/jobs/{fake}{tail}"
                r = client.get(path, headers=team.headers)
                assert r.status_code == 404, (fake, path, r.text)
                assert r.json()["error"].get("field") == "job_id", (fake, path, r.text)
                assert MARKER not in r.text
