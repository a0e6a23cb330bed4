"""``switchboard`` command line: ``serve`` runs a hub."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
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
        flag = "--" + f.name.replace("_", "-")
        if kind is bool:
            fn = click.option(
                f"{flag}/--no-{flag[2:]}",
                f.name,
                default=f.default,
                envvar=env_name(f.name),
                show_default=True,
                show_envvar=True,
                help=help_text,
            )(fn)
            continue
        fn = click.option(
            flag,
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
    from switchboard.server.app import create_app
    from switchboard.server.runner import HubServer, uvicorn_config

    try:
        settings = Settings(**values)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [%(replica)s %(client)s] %(message)s",
            defaults={"replica": settings.replica_id, "client": "-"},
        )
    )
    # replace whatever hypha-rpc set up on import: one handler, our format
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler], force=True)
    server = HubServer(uvicorn_config(create_app(settings), settings))
    server.run()
    # Drained and shut down: skip the interpreter's teardown, which after
    # thousands of connections spends most of a second freeing memory the
    # kernel is about to reclaim anyway (bench/compare.py, SIGTERM -> exit).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if server.started else 3)  # 3: it never started (uvicorn's startup-failure code)


@main.command()
@click.option(
    "--redis-url",
    envvar=env_name("redis_url"),
    required=True,
    show_envvar=True,
    help="Redis/Valkey URL the replicas share.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status(redis_url: str, as_json: bool) -> None:
    """Show the replicas of a hub: id, address, age, clients, leader, subscription health."""
    import asyncio
    import json

    from switchboard.hub.status import read_status, render_table

    try:
        replicas, leader = asyncio.run(read_status(redis_url))
    except Exception as exc:  # a CLI answers with a message, not a traceback
        raise click.ClickException(f"cannot read {redis_url}: {exc}") from None
    if as_json:
        click.echo(json.dumps({"leader": leader, "replicas": replicas}, indent=2))
    else:
        click.echo(render_table(replicas, leader))


if __name__ == "__main__":
    main()
