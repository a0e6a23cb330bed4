"""``switchboard`` command line: ``serve`` runs a hub."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import click

from switchboard.config import Settings, env_name
from switchboard.errors import ConfigError


def _settings_options(fn: Any) -> Any:
    """One ``--flag`` per setting, each also read from its ``SWITCHBOARD_*`` variable."""
    for f in reversed(dataclasses.fields(Settings)):
        kind = type(f.default)
        minimum = f.metadata.get("minimum")
        if kind is int:
            ptype: Any = click.IntRange(min=int(minimum)) if minimum is not None else int
        elif kind is float:
            ptype = click.FloatRange(min=minimum) if minimum is not None else float
        else:
            ptype = str
        help_text = f"{f.metadata['help']} Why the default: {f.metadata['why']}."
        fn = click.option(
            "--" + f.name.replace("_", "-"),
            f.name,
            type=ptype,
            default=f.default,
            envvar=env_name(f.name),
            show_default=f.default != "",
            show_envvar=True,
            help=help_text,
        )(fn)
    return fn


@click.group()
@click.version_option(package_name="switchboard")
def main() -> None:
    """Switchboard: an RPC and event hub for hypha-rpc clients."""


@main.command()
@_settings_options
def serve(**values: Any) -> None:
    """Run a hub (embedded backends: one process, no external service)."""
    import uvicorn

    from switchboard.server.app import create_app
    from switchboard.server.runner import uvicorn_config

    try:
        settings = Settings(**values)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s [%(replica)s %(client)s] %(message)s",
        defaults={"replica": settings.replica_id, "client": "-"},
    )
    uvicorn.Server(uvicorn_config(create_app(settings), settings)).run()


if __name__ == "__main__":
    main()
