"""Settings: read once, at the edge, into one frozen value.

Each setting is a CLI flag of ``switchboard serve`` and a ``SWITCHBOARD_*``
environment variable (the flag wins). :meth:`Settings.load` is the one parser
of both: the command line hands it the flags' raw text, it casts and checks
each value and names the flag or variable a bad one came from. Every default
states the goal it serves; ``python -m switchboard.config`` prints the table
docs/reference/settings.md shows.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import shortuuid

from switchboard.errors import ConfigError
from switchboard.protocol.hypha import ids

ENV_PREFIX = "SWITCHBOARD_"
MIN_SECRET_BYTES = 32  # 256 bits: HS256's key strength; shorter keys fall to offline guessing
MAKE_SECRET = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'


def setting(default: Any, help: str, why: str, *, minimum: float | None = None, kind: type | None = None) -> Any:
    """A setting; ``kind`` only where the default (``None``: decided at run time) does not tell the type."""
    meta = {"help": help, "why": why, "minimum": minimum, "kind": kind or type(default)}
    return field(default=default, metadata=meta)


# Top-level paths the hub serves itself: a static mount there would hide them.
RESERVED_PATHS = frozenset({"ws", "rpc", "health", "metrics", "assets", "api", "console"})
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._~-]*$")


@dataclass(frozen=True)
class StaticMount:
    path: str  # "/docs"
    directory: str  # as given


def parse_static_mounts(spec: str) -> list[StaticMount]:
    """The mounts ``spec`` names (``"/docs:./site,/img:/srv/img"``); :class:`ConfigError` names a bad one."""
    mounts: list[StaticMount] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        path, sep, directory = item.partition(":")
        segment = path.strip("/")
        if not sep or not directory:
            raise ConfigError(f"static mount {item!r}: write it PATH:DIR, e.g. /docs:./site")
        if not path.startswith("/") or not _SEGMENT.match(segment):
            raise ConfigError(f"static mount {item!r}: PATH must be one top-level segment, e.g. /docs")
        if segment in RESERVED_PATHS:
            raise ConfigError(f"static mount {item!r}: /{segment} is one of the hub's own routes")
        if any(m.path == "/" + segment for m in mounts):
            raise ConfigError(f"static mount {item!r}: /{segment} is mounted twice")
        mounts.append(StaticMount("/" + segment, directory))
    return mounts


def setting_kind(f: dataclasses.Field[Any]) -> type:
    kind: type = f.metadata["kind"]
    return kind


def _default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{shortuuid.uuid()[:6].lower()}"


@dataclass(frozen=True)
class Settings:
    host: str = setting("127.0.0.1", "Interface to listen on.", "loopback: nothing is exposed until you choose to")
    port: int = setting(9527, "TCP port for WebSocket and HTTP.", "the port hypha-rpc examples use", minimum=0)
    server_id: str = setting(
        "switchboard",
        "Id of the hub; the manager id clients see is 'manager-<server-id>'.",
        "a fixed default keeps the manager id stable across restarts, which hypha-rpc 0.21.47 needs to resume",
    )
    replica_id: str = setting(
        "",
        "Id of this replica in logs and metrics (empty: host-pid-random).",
        "unique per process so replicas of one hub can be told apart",
    )
    public_url: str = setting(
        "",
        "Base URL clients reach this hub at (empty: http://HOST:PORT).",
        "encoded into every service reference; must be what clients dial",
    )
    cors_origins: str = setting(
        "*",
        "Origins (scheme://host[:port], comma-separated) whose web pages may use the HTTP endpoints: HTTP-streaming "
        "transport, service calls, status API; '*' any, empty none. Cookies are never allowed cross-origin.",
        "any, as Hypha: every endpoint authenticates with a token the page itself must hold, never with a visitor's "
        "cookies across origins, so a foreign page can do only what its own token allows; list origins to keep other "
        "pages from using the hub at all",
    )
    static_mounts: str = setting(
        "",
        "Directories to serve as static files, PATH:DIR (comma-separated for several), e.g. /docs:./site: the files "
        "under DIR at /PATH/..., DIR/index.html at /PATH/; PATH is one top-level segment (Hypha's --static-mounts).",
        "none: the hub serves no file from disk unless told to; nothing outside DIR is ever served (.., links)",
    )
    redis_url: str = setting(
        "",
        "Redis/Valkey URL shared by all replicas, e.g. redis://host:6379/0 (empty: embedded, one process).",
        "embedded by default: a laptop needs no external service; set it to run any number of replicas as one hub",
    )
    redis_cluster: bool | None = setting(
        None,
        "Whether --redis-url names a Redis/Valkey Cluster (then several seed URLs may be listed, comma-separated); "
        "unset: asked of the node (INFO cluster) at start.",
        "detected, so one URL works for either; set it where the node cannot be asked at start (a firewall, a "
        "cluster still forming) or to refuse the wrong kind",
        kind=bool,
    )
    redis_cluster_node_timeout: float = setting(
        15.0,
        "Seconds of the cluster's cluster-node-timeout, used only when the cluster refuses CONFIG GET (managed "
        "offerings): a replica reads the real value at start otherwise.",
        "15 s, Redis's and Valkey's default. Presence records must outlast a failover of the registry's shard "
        "(no replica can renew them meanwhile): they live 2 x node-timeout + 2 s (the election) + 2 presence rounds (4 s) + 1 s on "
        "a cluster, else every replica would be presumed dead at once, its counts forgotten and its clients probed for "
        "reaping",
        minimum=0.1,
    )
    redis_max_connections: int = setting(
        64,
        "Connections a replica's registry and counter commands may hold open to each Redis node at once (the "
        "bus's publishes have a pool of their own; the leader lease and the presence record one connection "
        "each, apart). A command that finds every one busy waits for one, up to 2 s (a cluster's client retries "
        "a few times instead).",
        "a replica's commands come in bursts, and those of thousands of clients arriving or leaving at once go in "
        "pipelines over a connection or two, so a few dozen keep up with any crowd; and 100 replicas stay far "
        "below Redis's default 10,000 maxclients",
        minimum=1,
    )
    jwt_secret: str = setting(
        "",
        f"HS256 secret for tokens, at least {MIN_SECRET_BYTES} bytes (empty: the one kept in --state-dir, made "
        "on first start). Required with --redis-url, the same on every replica.",
        "one shared secret lets tokens and reconnection survive restarts and work on every replica; 32 bytes (256 "
        "bits, HS256's own strength) cannot be guessed offline from a token it signed",
    )
    state_dir: str = setting(
        "",
        "Directory where a hub without --jwt-secret keeps the token secret it made on first start (created 0700, "
        "the file 0600; a secret file others can read is refused). Empty: $XDG_DATA_HOME/switchboard, else "
        "~/.local/share/switchboard.",
        "the user's data directory, as the XDG spec has it: a quick start keeps its tokens and client identities "
        "across restarts without any setting; a container mounts a volume here",
    )
    oidc_issuer: str = setting(
        "",
        "Issuer URL of an OpenID Connect provider whose tokens the hub accepts beside its own (its "
        "/.well-known/openid-configuration names the keys), e.g. https://keycloak.example.org/realms/lab "
        "(empty: none). Needs --oidc-audience.",
        "none: a hub trusts only the tokens it signed until the operator names the provider of the users",
    )
    oidc_allow_http: bool = setting(
        False,
        "Accept an http:// --oidc-issuer (and an http:// jwks_uri in its discovery): keys fetched without TLS.",
        "off: whoever is on the path of an unencrypted fetch serves keys of their own and signs in as anyone; turn "
        "it on only for a provider on loopback (tests, a local development provider)",
    )
    oidc_audience: str = setting(
        "",
        "The audience (aud) the provider's tokens must carry: the client id or API identifier registered for this hub.",
        "required with --oidc-issuer, no default: without it a token the provider issued to any other application "
        "would open this hub too",
    )
    oidc_roles_claim: str = setting(
        "roles",
        "Claim of a provider's token holding the user's roles: a name (a URL-like name is taken whole), or a dotted "
        "path such as realm_access.roles (Keycloak); a list of strings or one space-separated string.",
        "roles: the claim Azure AD and many Keycloak mappers fill; set it to where your provider puts them",
    )
    oidc_admin_roles: str = setting(
        "",
        "Roles (comma-separated) that make a provider's user an admin of the whole hub (empty: none).",
        "none: being an admin of every workspace is granted by the operator, never assumed from a role name",
    )
    oidc_admin_subjects: str = setting(
        "",
        "Subjects (sub claims, comma-separated) of provider users who are admins of the whole hub (empty: none).",
        "none, as for roles: a provider without roles can still name its hub admins",
    )
    oidc_trust_email: bool = setting(
        False,
        "Take a provider token's email as verified even without email_verified: true (only for a provider that "
        "verifies every address it puts in a token). An email counts (as the user's, and to match an owner a "
        "workspace record names by email) only when verified.",
        "off: many providers let a user type any address, and one claimed but unverified would make its claimant "
        "an owner of the records naming that address",
    )
    oidc_client_id: str = setting(
        "",
        "Client id of this hub at the --oidc-issuer provider, for signing people in (public/hypha-login, "
        "hypha_rpc.login()); register {public-url}/public/apps/hypha-login/callback as its redirect URI. A "
        "confidential client's secret comes from SWITCHBOARD_OIDC_CLIENT_SECRET or --oidc-client-secret-file.",
        "none: the hub signs no one in until the operator registers it at the provider",
    )
    oidc_client_secret_file: str = setting(
        "",
        "File holding the --oidc-client-id client's secret (its first line); SWITCHBOARD_OIDC_CLIENT_SECRET "
        "wins. Empty: none (a public client, PKCE alone).",
        "a file or a variable, never a flag: a command line is readable by every user of the machine",
    )
    oidc_key_refetch_interval: float = setting(
        5.0,
        "Seconds at least between two fetches of the provider's keys that tokens with an unknown key id (kid) "
        "trigger; keys are also fetched again once they are an hour old.",
        "5 s: a rotated key is accepted within seconds and without a restart, while tokens with made-up key ids "
        "cost the provider at most one fetch per 5 s per replica",
        minimum=0.05,
    )
    max_message_bytes: int = setting(
        16 * 1024 * 1024,
        "Largest WebSocket frame or HTTP body accepted, in bytes.",
        "16 MiB, as Hypha: clients chunk at 256 KiB, so only a broken or hostile client comes near it",
        minimum=1024,
    )
    send_queue_bytes: int = setting(
        64 * 1024 * 1024,
        "Bytes queued towards one client before it is dropped as a slow consumer.",
        "64 MiB: holds several 10 MiB payloads in flight yet bounds what one stalled client costs",
        minimum=1024,
    )
    handshake_timeout: float = setting(
        5.0,
        "Seconds a new connection has to send its first frame.",
        "5 s, as Hypha: a real client sends it at once, a stuck one holds no slot for long",
        minimum=0.1,
    )
    header_timeout: float = setting(
        10.0,
        "Seconds an HTTP connection has to send a complete request head (request line and headers), from its start "
        "or from the first byte of a later request; then 408 and closed.",
        "10 s: a real client sends its head in one packet, so this costs it nothing, and a slowloris connection "
        "holds its socket for seconds instead of minutes",
        minimum=0.1,
    )
    max_head_bytes: int = setting(
        64 * 1024,
        "Largest HTTP request head (request line and headers) accepted, in bytes; a larger one gets 431 and is closed.",
        "64 KiB: four times h11's default and twice nginx's (4 × 8 KiB), room for any real token or cookie; "
        "httptools alone would buffer an endless header",
        minimum=1024,
    )
    max_incomplete_heads_per_address: int = setting(
        32,
        "HTTP connections from one address that may wait for their request heads at once; one more closes the "
        "longest-waiting (408), if it has waited a second.",
        "32: an honest client's head follows its connect within a round trip, so a burst of them is never turned "
        "away, while one address cannot hold hundreds of half-open requests; raise it behind a proxy that opens idle "
        "connections ahead of requests",
        minimum=1,
    )
    max_incomplete_heads: int = setting(
        1024,
        "HTTP connections from all addresses that may wait for their request heads at once; one more closes the "
        "longest-waiting (408), if it has waited a second.",
        "1024: bounds the sockets and buffered heads (at most 64 MiB at the default head size) that many addresses "
        "together can hold",
        minimum=1,
    )
    frame_timeout: float = setting(
        20.0,
        "Seconds a WebSocket client has to finish a message it started (a frame partly received, or a fragmented "
        "message); then closed with 1008 and the partial message dropped.",
        "20 s: a 16 MiB frame, the largest accepted, completes on a 6.7 Mbit/s uplink and a 256 KiB hypha-rpc chunk "
        "on 105 kbit/s; a client stalled that long within a frame fails the keepalive anyway (pinged after 20 s "
        "without a byte from it, its pong cannot overtake the frame)",
        minimum=0.1,
    )
    reconnection_token_lifetime: float = setting(
        172800.0,
        "Seconds a reconnection token stays valid (and each refresh of it); never past the expiry of the token the "
        "client connected with, which it carries (an anonymous user, who has none, gets the whole lifetime).",
        "2 days, as Hypha: a laptop that sleeps overnight resumes its identity",
        minimum=60,
    )
    max_services_per_client: int = setting(
        1000,
        "Services one client may register.",
        "1000, as Hypha: far above real use, low enough to stop a runaway loop",
        minimum=1,
    )
    max_service_bytes: int = setting(
        2 * 1024 * 1024,
        "Largest service info one registration may store (as JSON), in bytes.",
        "2 MiB: twice a service with 1 MiB of docs, yet 30 bloated registrations cannot take hundreds of MiB",
        minimum=1024,
    )
    max_registration_bytes: int = setting(
        8 * 1024 * 1024,
        "Bytes of service infos one client may have registered at once; freed when it leaves.",
        "8 MiB: a thousand ordinary services (a few KiB each) fit; one client cannot fill the registry",
        minimum=1024,
    )
    max_upload_bytes: int = setting(
        32 * 1024 * 1024,
        "Bytes of chunked messages (above 256 KiB) one client may have the hub hold at once; freed when it leaves.",
        "32 MiB: two of the largest single frames; the hub holds a chunked message only for the manager or while "
        "pieces arrive out of order",
        minimum=1024 * 1024,
    )
    max_subscriptions_per_client: int = setting(
        1000,
        "Event types one connection may subscribe to at once (subscribe); one more is refused; freed when it leaves.",
        "1000: a client listens to a handful of server events and its own event types, so an honest one never comes "
        "near it, while one connection cannot grow the hub's memory call after call (with the length bound, it holds "
        "at most about 0.3 MiB of names)",
        minimum=1,
    )
    max_event_type_length: int = setting(
        256,
        "Characters an event type may have to be subscribed to; a longer one is refused.",
        "256: ten times the longest event type Hypha itself sends (workspace_status_changed), ample for names clients "
        "make up, and it keeps one connection's subscriptions small",
        minimum=32,
    )
    allow_encrypted_payloads: bool = setting(
        False,
        "Let through payloads a hypha-rpc client encrypted end to end for its callee (connect_to_server with "
        "encryption on, and the callee's public key). The callee then takes the caller's whole context from inside "
        "the box: of an encrypted call's context it can trust only caller_public_key (docs/authorization.md).",
        "off: the hub cannot read an encrypted payload, and hypha-rpc 0.21.47 merges every field inside it (ctx, "
        "from, user, promise) over what the hub stamped, so anyone could have a provider run a call as any user; "
        "turn it on only where every encrypting provider checks callers by key (trusted_keys)",
    )
    max_connections_per_user: int = setting(
        1000,
        "Connections one user, with the holders of the tokens it generated, may hold across the hub (counted "
        "through Redis with several replicas).",
        "1000: far above a user's fleet of workers, low enough that a reconnect loop cannot eat a replica's sockets",
        minimum=1,
    )
    max_connections_per_workspace: int = setting(
        5000,
        "Connections one workspace may hold across the hub.",
        "5000: a large shared workspace fits; one runaway workspace cannot take the whole hub",
        minimum=1,
    )
    max_revocations_per_user: int = setting(
        1000,
        "Revoked tokens charged to one user at once (the root of the revoked token's chain; every anonymous user "
        "shares one allowance); one more revoke is refused until one of them expires.",
        "1000: an operator revokes a handful of leaked tokens, not thousands, while one account minting and revoking "
        "tokens in a loop holds at most about 0.2 MiB",
        minimum=1,
    )
    max_revocations: int = setting(
        100_000,
        "Revoked tokens the hub keeps at once, all users together; one more revoke is refused (retry later) until "
        "one of them expires.",
        "100,000: about 20 MiB in memory or Redis, a hundred busy accounts' worth, so no crowd of accounts can grow "
        "the store without bound",
        minimum=1,
    )
    max_queue_item_bytes: int = setting(
        16 * 1024,
        "Bytes of one task pushed to public/queue (its JSON); an anonymous user's workspace takes a sixteenth. "
        "A larger one is refused.",
        "16 KiB: a task names its work (ids, parameters, a URL), the data itself travels by a service call or "
        "storage, and the hub's ceiling of tasks then holds at most 256 MiB",
        minimum=256,
    )
    max_queue_items_per_workspace: int = setting(
        1000,
        "Tasks the queues of one workspace hold at once (public/queue); a push past it is refused until some are popped.",
        "1000: a backlog of work for a pool of workers, at most 16 MiB per workspace, while a producer without "
        "consumers stops at a bound instead of filling the hub",
        minimum=1,
    )
    max_queue_items_per_user: int = setting(
        4000,
        "Tasks charged to one user at once, in every workspace (the root of the pusher's token chain; every "
        "anonymous user shares one allowance); a push past it is refused until some are popped or expire.",
        "4000: four full workspaces' worth, so one account's queues hold at most about 64 MiB",
        minimum=1,
    )
    max_queue_items: int = setting(
        16_384,
        "Tasks the hub keeps at once in all queues, all users together; a push past it is refused (retry later).",
        "16,384: at most 256 MiB of tasks in memory or Redis, so no crowd of accounts can make the hub run out of memory",
        minimum=1,
    )
    max_deletions_per_user: int = setting(
        10_000,
        "Workspace deletions charged to one user that the hub remembers at once (each for a year, so that no token "
        "the workspace granted enters it again); one more delete_workspace is refused until one of them expires.",
        "10,000: a deletion every hour for a year, while one account creating and deleting workspaces in a loop "
        "holds at most about 1 MiB",
        minimum=1,
    )
    max_deletions: int = setting(
        250_000,
        "Workspace deletions the hub remembers at once, all users together; one more is refused (retry later) until "
        "one of them expires.",
        "250,000: about 50 MiB in memory or Redis, so no crowd of accounts can grow the store without bound",
        minimum=1,
    )
    max_workspace_data_bytes: int = setting(
        256 * 1024 * 1024,
        "Bytes of workspace data (environment variables, service types, bookmarks, event logs) the hub keeps at once, "
        "all workspaces together (in memory, or in Redis for every replica); a write past it is refused.",
        "256 MiB: a thousand busy workspaces' configuration and recent history, well within a small host's memory, "
        "so no crowd of users can make the hub run out of memory",
        minimum=1024 * 1024,
    )
    max_messages_per_second: float = setting(
        1000.0,
        "Average frames per second one client may send, binary or text (token bucket; bursts up to --message-burst). "
        "Replies to open calls are never refused. The same rate bounds the HTTP requests of one user (without a "
        "token: of one address), and each candidate a select: lookup asks counts as a call of the asker.",
        "1000/s: a busy client rarely notices, a flooding one is held to about a third of what a replica routes",
        minimum=1,
    )
    message_burst: int = setting(
        2000,
        "Frames one client may send at once before the per-second rate applies.",
        "2000, as Hypha: covers a 400 MiB payload's chunks sent concurrently",
        minimum=1,
    )
    max_pending_calls: int = setting(
        1000,
        "Calls one client may have waiting for a reply at once; likewise HTTP requests of one user (without a "
        "token: of one address) in progress, and a select: lookup's candidates while they are asked.",
        "1000: real fan-outs stay below it; a caller that never waits for replies is stopped",
        minimum=1,
    )
    call_timeout: float = setting(
        30.0,
        "Seconds an HTTP service call waits for the provider.",
        "30 s, the hypha-rpc default method timeout: callers see the same patience either way",
        minimum=0.1,
    )
    max_app_response_bytes: int = setting(
        1024 * 1024 * 1024,
        "Largest response body an app served at /{workspace}/apps/ may send to one request, in bytes; past it the "
        "response is cut off (its request bodies are bounded by --max-message-bytes).",
        "1 GiB: a model or data file streams through whole, while a runaway stream ends; the hub holds one piece "
        "of a response at a time whatever the total, so the bound is on traffic, not memory",
        minimum=1024,
    )
    undeliverable_retry_window: float = setting(
        6.0,
        "Seconds a frame for a registered but unreachable client is retried before its caller is failed.",
        "6 s: covers one 5 s subscription-reconcile interval plus a subscribe round trip, so a repair costs a delay, "
        "not an error",
        minimum=0,
    )
    transit_grace: float = setting(
        5.0,
        "Seconds a client whose connection ended without a goodbye (a draining replica handing it to a sibling, a "
        "dropped connection) may take to come back with its reconnection token: meanwhile its registrations stay "
        "listed, frames for it wait, and its departure (service_removed, client_disconnected) is announced only if "
        "it is not back by then. 0: announce at once.",
        "5 s: in 140 rolling restarts of 3 replicas (1874 clients moved) a client was back after 12 ms at the "
        "median, 49 ms at p99 and 1.09 s at most (an unmodified hypha-rpc client backing off 1 s after a short-lived "
        "connection): 4.6x headroom, room for hypha-rpc's third attempt (about 3.3 s), and below the 6 s retry "
        "window; the price is that a client that dropped for good is announced gone, and calls to it fail, 5 s later",
        minimum=0,
    )
    subscription_reconcile_interval: float = setting(
        5.0,
        "Seconds between retries of subscriptions Redis has not confirmed.",
        "5 s: a dropped subscribe heals within seconds, at one cheap SUBSCRIBE per missing channel",
        minimum=0.05,
    )
    orphan_reap_interval: float = setting(
        300.0,
        "Seconds between the leader's passes over clients whose replica is gone.",
        "300 s: a dead replica's registrations vanish within minutes, and probing costs little",
        minimum=0.1,
    )
    orphan_reap_min_failures: int = setting(
        3,
        "Consecutive failed probes before a client's registrations are reaped.",
        "3 passes in a row: one lost ping (pub/sub does not buffer) never removes a live client",
        minimum=2,
    )
    leader_lease_ttl: float = setting(
        10.0,
        "Seconds the leader lease lives without renewal (renewed every third of it).",
        "10 s: a dead leader is replaced within seconds, and two lost renewals are survived",
        minimum=0.3,
    )
    drain_timeout: float = setting(
        10.0,
        "Seconds calls in flight may take to finish after SIGTERM before clients are moved anyway, and the "
        "hand-over's budget: clients still here then go at once. Size it at least clients per replica / the "
        "sibling's admissions per second (docs/operations.md).",
        "10 s: fits Kubernetes' default 30 s grace period with room for the preStop delay and exit, and moves about "
        "1,000 clients within their grace at the 80-130 admissions a second measured on 2 loaded cores "
        "(bench/storm.py)",
        minimum=0,
    )
    drain_window: int = setting(
        50,
        "Clients a draining replica has sent to a sibling and not yet seen back, at most (fewer when the sibling "
        "admits fewer: what it admitted in the last second times 0.4 of --transit-grace): it sends the rest in "
        "waves as they arrive (each counted for --transit-grace at most), and whoever is left at --drain-timeout at "
        "once. 0, or without --redis-url (no sibling): all at once.",
        "50: smaller waves keep the sibling serving its own clients (their echo p99 while 6,000 moved in: 28-34 ms, "
        "48-61 ms with 200) and move as fast (all back in 31-42 s against 33-36 s; a client's own move 0.2 s at the "
        "median against 0.8 s), since 50 in flight still outpace a sibling admitting 150 a second; thousands sent at "
        "once overflowed its accept queue and left it admitting nobody for seconds (bench/storm.py)",
        minimum=0,
    )
    links: bool = setting(
        True,
        "With several replicas: send a client's frames straight to the replica holding it, over a direct TCP link, "
        "once that route is learned (Redis stays the fallback).",
        "on: skipping the Redis hop took a cross-replica echo from about 0.87 to 0.65 ms and the hub's CPU per call "
        "down by about 70% (bench/compare.py); turn off only where replicas cannot reach each other",
    )
    link_host: str = setting(
        "",
        "Interface the link listener binds (empty: same as --host).",
        "the same interface as clients by default: replicas reach each other where clients reach them",
    )
    link_port: int = setting(
        0,
        "TCP port of the link listener (0: any free port).",
        "any free port: replicas learn each other's link address from their traffic, so none needs to be fixed; set "
        "one if a firewall must allow it",
        minimum=0,
    )
    link_advertise: str = setting(
        "",
        "host or host:port other replicas dial for links (empty: --link-host and the bound port; a wildcard host "
        "becomes this machine's address).",
        "empty works on one machine and for pods listening on 0.0.0.0; set it where replicas see each other through "
        "NAT or a proxy",
    )
    max_link_handshakes: int = setting(
        64,
        "Connections to the link port that may wait to finish their handshake at once, from all addresses (at most "
        "16 from one); one more is closed at once, unanswered. None is taken while fewer than 256 file descriptors "
        "are left below the process's limit (RLIMIT_NOFILE): those are kept for clients.",
        "64: a replica dials a sibling only when it has no link to it, one dial at a time, so a hub of 65 replicas "
        "links at once, while connections from many addresses that never finish hold at most 64 sockets, 3 s each, "
        "and never the descriptors clients need",
        minimum=1,
    )
    log_level: str = setting(
        "INFO", "Log level (DEBUG, INFO, WARNING, ERROR).", "INFO logs each connect and disconnect, nothing per message"
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check_minimum(f, getattr(self, f.name), _named(f.name))
        if self.port > 65535 or self.link_port > 65535:
            which = "port" if self.port > 65535 else "link_port"
            raise ConfigError(f"{_named(which)}={getattr(self, which)}: must be at most 65535")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError(f"{_named('log_level')}={self.log_level!r}: use DEBUG, INFO, WARNING or ERROR")
        if not ids.is_id(self.manager_id):
            raise ConfigError(
                f"{_named('server_id')}={self.server_id!r}: use {ids.GRAMMAR} (less {ids.MANAGER_PREFIX!r})"
            )
        seeds = [part.strip() for part in self.redis_url.split(",")] if self.redis_url else []
        if any(not seed.startswith(("redis://", "rediss://", "unix://")) for seed in seeds):
            raise ConfigError(
                f"{_named('redis_url')}={self.redis_url!r}: must start with redis://, rediss:// or unix://"
                " (several cluster seeds: each one, comma-separated)"
            )
        if len(seeds) > 1 and self.redis_cluster is False:
            raise ConfigError(
                f"{_named('redis_url')} lists {len(seeds)} URLs but {_named('redis_cluster')} is off: "
                "several seeds only make sense for a cluster"
            )
        if self.jwt_secret and len(self.jwt_secret.encode()) < MIN_SECRET_BYTES:
            raise ConfigError(
                f"{_named('jwt_secret')} is {len(self.jwt_secret.encode())} bytes: use at least "
                f"{MIN_SECRET_BYTES} random bytes, or anyone holding a token can guess the secret offline; "
                f"make one with: {MAKE_SECRET}"
            )
        if self.redis_url and not self.jwt_secret:
            raise ConfigError(
                f"{_named('jwt_secret')} is required with {_named('redis_url')}: "
                "replicas must share it so tokens and reconnection work across them (a state directory is "
                f"per replica); make one with: {MAKE_SECRET}"
            )
        if self.redis_url and not self.public_url:
            raise ConfigError(
                f"{_named('public_url')} is required with {_named('redis_url')}: set it to the "
                "address clients use for the hub (e.g. the load balancer); every replica must share it, "
                "since it is written into every service reference"
            )
        if self.oidc_issuer and not self.oidc_issuer.startswith(("https://", "http://")):
            raise ConfigError(f"{_named('oidc_issuer')}={self.oidc_issuer!r}: must be an http(s) URL")
        if self.oidc_issuer.startswith("http://") and not self.oidc_allow_http:
            raise ConfigError(
                f"{_named('oidc_issuer')}={self.oidc_issuer!r}: an http:// issuer's keys can be swapped by anyone on "
                f"the path; use https://, or set {_named('oidc_allow_http')} for a provider on loopback"
            )
        if bool(self.oidc_issuer) != bool(self.oidc_audience):
            raise ConfigError(
                f"{_named('oidc_issuer')} and {_named('oidc_audience')} go together: the audience is the id this "
                "hub has at the provider, and without it a token the provider made for any application would do"
            )
        if self.oidc_client_id and not self.oidc_issuer:
            raise ConfigError(
                f"{_named('oidc_client_id')} needs {_named('oidc_issuer')}: the client id is this hub's at that provider"
            )
        if not self.replica_id:
            object.__setattr__(self, "replica_id", _default_replica_id())
        if not ids.is_id(self.replica_id):
            raise ConfigError(f"{_named('replica_id')}={self.replica_id!r}: use {ids.GRAMMAR}")
        origins = self.cors_origin_list
        if "*" in origins and len(origins) > 1:
            raise ConfigError(f"{_named('cors_origins')}={self.cors_origins!r}: '*' stands alone")
        for origin in origins:
            scheme, sep, rest = origin.partition("://")
            if origin != "*" and (scheme not in ("http", "https") or not sep or not rest or "/" in rest):
                raise ConfigError(
                    f"{_named('cors_origins')}={self.cors_origins!r}: {origin!r} is not an origin "
                    "(scheme://host[:port], no path), nor '*'"
                )
        try:
            parse_static_mounts(self.static_mounts)
        except ConfigError as exc:
            raise ConfigError(f"{_named('static_mounts')}={self.static_mounts!r}: {exc}") from None
        if self.public_url and not self.public_url.startswith(("http://", "https://")):
            raise ConfigError(f"{_named('public_url')}={self.public_url!r}: must start with http:// or https://")

    @property
    def cors_origin_list(self) -> list[str]:
        """``cors_origins`` as a list (``["*"]``, some origins, or empty)."""
        return [o.strip() for o in self.cors_origins.split(",") if o.strip()]

    @property
    def oidc_admin_role_list(self) -> frozenset[str]:
        return frozenset(r.strip() for r in self.oidc_admin_roles.split(",") if r.strip())

    @property
    def oidc_admin_subject_list(self) -> frozenset[str]:
        return frozenset(r.strip() for r in self.oidc_admin_subjects.split(",") if r.strip())

    @property
    def manager_id(self) -> str:
        """The client id of this hub's manager (the same on every replica)."""
        return ids.manager_id(self.server_id)

    @property
    def manager_address(self) -> str:
        """How frames address the manager: ``*/<manager_id>``, from any workspace."""
        return f"*/{self.manager_id}"

    @property
    def public_base_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    @classmethod
    def load(
        cls, flags: Mapping[str, str | bool | None] | None = None, environ: Mapping[str, str] | None = None
    ) -> Settings:
        """Settings from command-line ``flags`` (raw text, ``None``: not given) over ``SWITCHBOARD_*``.

        A flag wins over its variable; a setting given neither keeps its default.
        """
        flags = flags or {}
        unknown = set(flags) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = read(f.name, flags.get(f.name), environ)
            if value is not None:
                values[f.name] = value
        return cls(**values)


def read(name: str, flag: str | bool | None = None, environ: Mapping[str, str] | None = None) -> Any:
    """One setting: ``flag`` if given, else its ``SWITCHBOARD_*`` variable, cast and checked; else ``None``."""
    f = _FIELDS[name]
    raw: str | bool | None = flag
    source = flag_name(name)
    if raw is None:
        environ = os.environ if environ is None else environ
        source = env_name(name)
        raw = environ.get(source)
        if raw is None:
            return None
    value = raw if isinstance(raw, bool) else _cast(f, raw, source)
    _check_minimum(f, value, source)
    return value


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _named(name: str) -> str:
    """A setting as messages name it, both ways it can be given: ``--port/SWITCHBOARD_PORT``."""
    return f"{flag_name(name)}/{env_name(name)}"


def _check_minimum(f: dataclasses.Field[Any], value: Any, source: str) -> None:
    minimum = f.metadata.get("minimum")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{source}={value!r}: must be at least {minimum}")


_TRUE = ("1", "true", "t", "yes", "y", "on")  # the words click accepted before this parser was the only one
_FALSE = ("0", "false", "f", "no", "n", "off")


def _cast(f: dataclasses.Field[Any], raw: str, source: str) -> Any:
    kind = setting_kind(f)
    try:
        if kind is bool:
            word = raw.strip().lower()
            if word == "auto" and f.default is None:
                return None  # a tri-state setting left to its run-time decision
            if word not in _TRUE + _FALSE:
                raise ValueError
            return word in _TRUE
        return kind(raw)
    except ValueError:
        expected = {bool: "one of " + ", ".join(_TRUE + _FALSE), int: "an integer", float: "a number"}
        raise ConfigError(f"{source}={raw!r}: expected {expected.get(kind, kind.__name__)}") from None


def settings_table() -> str:
    """The settings as a markdown table (docs/reference/settings.md embeds it)."""
    rows = ["| flag / variable | default | what | why this default |", "|---|---|---|---|"]
    for f in dataclasses.fields(Settings):
        flag = flag_name(f.name)
        if setting_kind(f) is bool:
            flag = f"{flag}/--no-{flag[2:]}"
        default = "(empty)" if f.default == "" else "(auto)" if f.default is None else f.default
        rows.append(f"| `{flag}` / `{env_name(f.name)}` | `{default}` | {f.metadata['help']} | {f.metadata['why']} |")
    return "\n".join(rows)


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


if __name__ == "__main__":
    print(settings_table())
