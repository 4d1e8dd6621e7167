"""`humanline webhooks`: create (prints the signing secret, once), list, show, delete,
deliveries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Optional

import typer

from ._app import JsonOpt, LimitOpt, app
from ._output import (
    _client,
    _command,
    _emit,
    _err,
    _first,
    _out,
    _rows_table,
    _show_command,
    _table,
    _when,
)

webhooks_app = typer.Typer(
    help="Create, list, show and delete webhook endpoints; see their deliveries.",
    no_args_is_help=True,
)
app.add_typer(webhooks_app, name="webhooks")

WEBHOOK_COLUMNS = ["ID", "URL", "EVENTS", "STATUS", "CREATED"]
DELIVERY_COLUMNS = ["ID", "EVENT", "STATUS", "ATTEMPTS", "LAST", "CREATED"]


def _webhook_rows(hooks: Iterable[Any]) -> list[list[Any]]:
    return [[h.id, h.url, ",".join(h.events), h.status, _when(h.created_at)] for h in hooks]


def _delivery_rows(deliveries: Iterable[Any]) -> list[list[Any]]:
    return [
        [d.id, d.event, d.status, d.attempts, d.last_error or d.last_status_code or "",
         _when(d.created_at)]
        for d in deliveries
    ]  # fmt: skip


def _show_webhook(h: Any) -> None:
    rows = [[k, v] for k, v in h.to_dict().items() if k != "secret" or v]
    _out().print(_table(["FIELD", "VALUE"], rows))


@_command(webhooks_app, "create")
def webhooks_create(
    url: Annotated[str, typer.Argument(help="An https:// URL that receives the events.")],
    event: Annotated[
        Optional[list[str]],
        typer.Option(
            "--event",
            "-e",
            help="An event to send (repeat): job.succeeded, job.failed, job.cancelled, "
            "evaluation.succeeded, evaluation.failed. Default: all.",
        ),
    ] = None,
    description: Annotated[Optional[str], typer.Option(help="A note for people.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Register a webhook endpoint. Its signing secret is printed now and never again."""
    hook = _client().webhooks.create(url=url, events=event, description=description)

    def show(h: Any) -> None:
        _out().print(f"{h.id}  {h.url}  ({', '.join(h.events)})")
        _out().print(f"secret: {h.secret}")
        _err().print("Keep the secret: it verifies each delivery and is not shown again.")

    _emit(hook, as_json, show)


@_command(webhooks_app, "list")
def webhooks_list(limit: LimitOpt = 20, as_json: JsonOpt = False) -> None:
    """List the team's webhook endpoints, newest first."""
    client = _client()
    hooks = _first(lambda size: client.webhooks.list(limit=size), limit)
    _emit(hooks, as_json, _rows_table(WEBHOOK_COLUMNS, _webhook_rows))


_show_command(
    webhooks_app, "webhook", lambda client, hook_id: client.webhooks.retrieve(hook_id),
    _show_webhook,
)  # fmt: skip


@_command(webhooks_app, "delete")
def webhooks_delete(webhook_id: str, as_json: JsonOpt = False) -> None:
    """Delete a webhook endpoint: nothing more is sent to it."""
    deleted = _client().webhooks.delete(webhook_id)
    _emit(deleted, as_json, lambda deleted: _out().print(f"deleted {deleted.id}"))


@_command(webhooks_app, "deliveries")
def webhooks_deliveries(webhook_id: str, limit: LimitOpt = 20, as_json: JsonOpt = False) -> None:
    """The endpoint's deliveries, newest first (--json: with every attempt)."""
    client = _client()
    items = _first(lambda size: client.webhooks.deliveries(webhook_id, limit=size), limit)
    _emit(items, as_json, _rows_table(DELIVERY_COLUMNS, _delivery_rows))
