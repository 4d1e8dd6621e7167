"""The `humanline` application: its sub-apps (one per resource, filled by the modules beside
this one), the global options and the client they configure."""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Optional

try:
    import typer
except ImportError as exc:  # pragma: no cover - depends on the install
    raise SystemExit(
        f"the humanline CLI needs typer and rich ({exc}): pip install 'humanline-client[cli]'"
    ) from None

from .._client import Client
from .._retries import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT
from .._version import __version__

app = typer.Typer(
    name="humanline",
    help=(
        "Humanline command line: upload training data, run SFT, DPO, KTO and GRPO jobs "
        "(offline or online, with or without humanline) on a Humanline server, evaluate "
        "them and fetch their reports.\n\n"
        "Configure with --base-url/--api-key or HUMANLINE_BASE_URL/HUMANLINE_API_KEY. "
        "Add --json to any command for machine-readable output.\n\n"
        "Server-side commands (migrate, create-team, create-key, serve) are in the "
        "service's own CLI, `humanline-server`."
    ),
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
files_app = typer.Typer(help="Upload, list, show, download and delete files.", no_args_is_help=True)
jobs_app = typer.Typer(
    help="Create, list, show, follow and cancel training jobs.", no_args_is_help=True
)
evals_app = typer.Typer(
    help="Create, list, show and wait for evaluations; fetch their reports.",
    no_args_is_help=True,
)
reports_app = typer.Typer(help="Reports across jobs.", no_args_is_help=True)
app.add_typer(files_app, name="files")
app.add_typer(jobs_app, name="jobs")
app.add_typer(evals_app, name="evals")
app.add_typer(reports_app, name="reports")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts).")]
HtmlOpt = Annotated[
    Optional[Path],
    typer.Option("--html", help="Save the HTML page to this file.", dir_okay=False),
]
OpenOpt = Annotated[
    bool,
    typer.Option(
        "--open", help="Open the HTML page in a browser (from a temporary file without --html)."
    ),
]


# Options several commands take
LimitOpt = Annotated[int, typer.Option(help="At most this many (newest first).")]
StatusOpt = Annotated[Optional[str], typer.Option(help="Only those in this status.")]
TimeoutOpt = Annotated[Optional[float], typer.Option(help="Give up after this many seconds.")]
PollOpt = Annotated[float, typer.Option(help="Seconds between polls while waiting.")]
WaitOpt = Annotated[bool, typer.Option("--wait", help="Wait for it to finish.")]
FileOpt = Annotated[
    Optional[str],
    typer.Option("--file", help="A file id, or a local JSONL path (uploaded first)."),
]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--set",
        help="Any other field as key=value, dotted for nested fields; values are JSON when "
        "they parse: --set optim.lr=1e-6 --set generation.n=8 --set prompt_template='Q: {x}'",
    ),
]
SpecOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--spec",
        help="A request to start from, YAML or JSON (options override it).",
        exists=True,
        dir_okay=False,
    ),
]


class _Config:
    def __init__(
        self,
        base_url: Optional[str],
        api_key: Optional[str],
        timeout: Optional[float],
        retries: int,
    ):
        self.base_url = base_url
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = retries
        self._client: Optional[Client] = None

    def client(self) -> Client:
        if self._client is None:
            self._client = Client(
                base_url=self.base_url,
                api_key=self.api_key,
                timeout=DEFAULT_TIMEOUT if self.timeout is None else self.timeout,
                max_retries=self.max_retries,
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


# The running command's configuration: set by the global options' callback (_main) before any
# command runs, so that commands reach their client without threading the context through.
_config: ContextVar[_Config] = ContextVar("humanline_cli_config")


def configured_client() -> Client:
    return _config.get().client()


def _version(value: bool) -> None:
    if value:
        typer.echo(f"humanline {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    base_url: Annotated[
        Optional[str],
        typer.Option(
            "--base-url",
            envvar="HUMANLINE_BASE_URL",
            help="Server root (default http://127.0.0.1:8000).",
        ),
    ] = None,
    api_key: Annotated[
        Optional[str],
        typer.Option(
            "--api-key", envvar="HUMANLINE_API_KEY", help="API key (hl_...).", show_default=False
        ),
    ] = None,
    timeout: Annotated[
        Optional[float],
        typer.Option(
            help="Seconds per HTTP attempt (default: the SDK's, 60, and 10 to connect).",
            show_default=False,
        ),
    ] = None,
    max_retries: Annotated[
        int, typer.Option(help="Retries of failed requests.")
    ] = DEFAULT_MAX_RETRIES,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    config = _Config(base_url, api_key, timeout, max_retries)
    ctx.obj = config
    _config.set(config)
    ctx.call_on_close(config.close)
