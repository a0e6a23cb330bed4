"""``switchboard`` command line: ``serve`` runs a hub, ``status`` shows its replicas, ``token`` mints a token."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any

import click

from switchboard import config
from switchboard.config import Settings, env_name, flag_name
from switchboard.errors import ConfigError, UnsupportedServer

_METAVAR = {int: "INTEGER", float: "NUMBER", str: "TEXT"}


def _settings_options(fn: Any) -> Any:
    """One ``--flag`` per setting. Click only collects the flags' raw text:
    :meth:`Settings.load` casts and checks it, and reads the ``SWITCHBOARD_*``
    variables, so flags and variables share one parser and one set of messages."""
    for f in reversed(dataclasses.fields(Settings)):
        kind = config.setting_kind(f)
        default = "(empty)" if f.default == "" else "(auto)" if f.default is None else f.default
        help_text = (
            f"{f.metadata['help']} Why the default: {f.metadata['why']}. "
            f"[env var: {env_name(f.name)}; default: {default}]"
        )
        flag = flag_name(f.name)
        decls = [f"{flag}/--no-{flag[2:]}"] if kind is bool else [flag]
        fn = click.option(*decls, f.name, default=None, metavar=_METAVAR.get(kind), help=help_text)(fn)
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
    from switchboard.server.process import collector
    from switchboard.server.runner import HubServer, uvicorn_config

    try:
        settings = Settings.load(values)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [%(replica)s %(client)s] %(message)s",
            defaults={"replica": settings.replica_id, "client": "-"},
        )
    )
    # replace whatever hypha-rpc set up on import: one handler, our format
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler], force=True)
    try:
        app = create_app(settings)
    except ConfigError as exc:  # the state directory's secret (server/process/state_dir.py): unusable as it is
        raise click.ClickException(str(exc)) from None
    try:
        server = HubServer(uvicorn_config(app, settings), app.state.switchboard)
    except UnsupportedServer as exc:  # the start-up check (server/process/versions.py)
        raise click.ClickException(str(exc)) from None
    collector.tune()
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
    default=None,
    metavar="TEXT",
    help=f"Redis/Valkey URL the replicas share. [env var: {env_name('redis_url')}; required]",
)
@click.option(
    "--redis-cluster/--no-redis-cluster",
    default=None,
    help=f"Whether --redis-url names a cluster (default: ask it). [env var: {env_name('redis_cluster')}]",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status(redis_url: str | None, redis_cluster: bool | None, as_json: bool) -> None:
    """Show the replicas of a hub: id, address, age, clients, leader, subscription health;
    on a cluster, its shards too: master, replicas, slots, pub/sub health per master."""
    import asyncio
    import json

    from switchboard.replicas.upkeep.status import read_status, render_table

    redis_url = config.read("redis_url", redis_url)
    if not redis_url:
        raise click.UsageError(f"Missing option '--redis-url' (or {env_name('redis_url')}).")

    from switchboard.backends.redis.cluster_status import read_shards, render_shards
    from switchboard.backends.redis.shared.cluster_setup import detect_cluster

    shards: list[dict[str, Any]] | None = None
    try:
        is_cluster = detect_cluster(redis_url, config.read("redis_cluster", redis_cluster))
        replicas, leader = asyncio.run(read_status(redis_url, is_cluster))
        if is_cluster:
            shards = asyncio.run(read_shards(redis_url, [r["id"] for r in replicas if "id" in r]))
    except Exception as exc:  # a CLI answers with a message, not a traceback
        raise click.ClickException(f"cannot read {redis_url}: {exc}") from None
    if as_json:
        click.echo(json.dumps({"leader": leader, "replicas": replicas, "shards": shards}, indent=2))
    else:
        click.echo(render_table(replicas, leader))
        if shards is not None:
            click.echo("")
            click.echo(render_shards(shards))


@main.command()
@click.option(
    "--user",
    "user_id",
    default=None,
    help="Name of the operator's user the token stands for (letters, digits, _ - | .); its id is op.<name>, "
    "never the id of a provider's user.",
)
@click.option(
    "--workspace",
    default=None,
    help="Workspace the token grants: a name users cannot create (e.g. lab_shared, LabShared); access to a "
    "workspace a user created is handed out by its owner (generate_token).",
)
@click.option(
    "--root",
    is_flag=True,
    help="A token of the hub's root user instead (admin of every workspace, the only one to reach admin-utils); "
    "it opens the root user's workspace ws-user-root. Keep it as safe as the hub's secret. Not with --user, "
    "--workspace or --permission.",
)
@click.option(
    "--permission",
    type=click.Choice(["read", "read_write", "admin"]),
    default="read_write",
    show_default=True,
    help="What the token may do in the workspace.",
)
@click.option("--expires-in", type=float, default=3600.0, show_default=True, help="Seconds the token is valid.")
@click.option("--jwt-secret", default=None, metavar="TEXT", help=f"As for serve. [env var: {env_name('jwt_secret')}]")
@click.option("--state-dir", default=None, metavar="TEXT", help=f"As for serve. [env var: {env_name('state_dir')}]")
def token(
    user_id: str | None,
    workspace: str | None,
    root: bool,
    permission: str,
    expires_in: float,
    jwt_secret: str | None,
    state_dir: str | None,
) -> None:
    """Print a token signed with the hub's secret (the settings and state directory of serve), for scripts, CI
    and handing out access to a shared workspace."""
    from switchboard.clock import SystemClock
    from switchboard.errors import ProtocolError
    from switchboard.hub.identity.auth import TokenIssuer
    from switchboard.hub.identity.users import ROOT, Permission, User, operator_user_id, user_workspace
    from switchboard.hub.manager.manager import MAX_TOKEN_LIFETIME
    from switchboard.hub.manager.ownership import anyone_may_create
    from switchboard.protocol.hypha import ids
    from switchboard.server.process.state_dir import token_secret

    if root:
        if user_id is not None or workspace is not None or permission != "read_write":
            raise click.UsageError("--root stands for the root user: give no --user, --workspace or --permission")
        user, workspace, grant = ROOT, user_workspace(ROOT.id), Permission.ADMIN
    else:
        if user_id is None:
            raise click.UsageError("Missing option '--user' (or --root).")
        if workspace is None:
            raise click.UsageError("Missing option '--workspace' (or --root).")
        try:
            ids.check_id(user_id, "user id")
            ids.check_id(workspace, "workspace")
        except ProtocolError as exc:
            raise click.UsageError(str(exc)) from None
        if anyone_may_create(workspace):
            raise click.UsageError(
                f"--workspace={workspace} is a name any user may create (lowercase letters, digits and hyphens): "
                "while it has no record, the first user to create it would own it and every token for it. Use a "
                f"name users cannot create (e.g. {workspace.replace('-', '_')}), or have its owner create it and "
                "call generate_token."
            )
        grant = Permission.parse(permission)
        user = User(id=operator_user_id(user_id), grants={workspace: grant})
    if not 0 < expires_in <= MAX_TOKEN_LIFETIME:
        raise click.UsageError(f"--expires-in={expires_in:g}: use a number of seconds from 0 to {MAX_TOKEN_LIFETIME:g}")
    try:
        settings = Settings.load({"jwt_secret": jwt_secret, "state_dir": state_dir})
        secret = token_secret(settings)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    issuer = TokenIssuer(secret=secret, clock=SystemClock())
    click.echo(issuer.issue(user, workspace=workspace, permission=grant, expires_in=expires_in))


if __name__ == "__main__":
    main()
