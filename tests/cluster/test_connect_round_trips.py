"""A hypha-rpc connect costs a replica at most five round trips to Redis (issue 26).

Each round trip costs the replica redis-py's client-side CPU (packing, the
pool, parsing, the future, the socket's system calls) besides its latency: a
connect made ten (revocation, deletion mark, workspace record, holder,
registration, counts, claim, SUBSCRIBE, registration, the ``client_connected``
PUBLISH). What an admission must know is now read in one pipeline and its
count and claim are one script (``backends/redis/stores/entrance.py``), so five are
left: those two, the SUBSCRIBE to the client's channel, the registration of
its ``built-in`` service and the ``client_connected`` event.

Counted for real: a fault proxy between the replica and its Valkey keeps what
the replica writes to Redis, one entry per read of its sockets, and the
entries that name the connecting client (its id, its workspace or its
token's id) are the connect's round trips. Whatever else the replica sends
meanwhile (its presence, the lease, probes) names none of them. A client is
connected to the workspace first, so that the one counted is not the first
there (whose connect also subscribes the workspace's channel) and the
replica's scripts are loaded.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypha_rpc import connect_to_server

from switchboard.clock import SystemClock
from switchboard.hub.identity.auth import TokenIssuer
from switchboard.hub.identity.users import Permission, User
from switchboard.testing import ValkeyServer
from switchboard.testing.proxy import ThreadedFaultProxy
from switchboard.testing.replica import ReplicaProcess

pytestmark = pytest.mark.timeout(120)

SECRET = "round-trip-secret-please-ignore-0123456789"
WORKSPACE = "round-trips"
# The connect's round trips to Redis: the admission's reads (one pipeline), its count and claim
# (one script), the SUBSCRIBE to the client's channel, the registration of its built-in service,
# and the client_connected PUBLISH. Ten before the reads and the writes were folded.
ROUND_TRIPS_PER_CONNECT = 5


@pytest.fixture
def proxied_replica(redis_server: ValkeyServer) -> Iterator[tuple[ReplicaProcess, ThreadedFaultProxy]]:
    proxy = ThreadedFaultProxy("127.0.0.1", redis_server.port).start()
    replica = ReplicaProcess(
        replica_id="rt", redis_url=proxy.url_for_redis(), jwt_secret=SECRET, args=["--no-links"]
    ).start()
    try:
        yield replica, proxy
    finally:
        replica.kill()
        proxy.stop()


def token_for(user_id: str) -> tuple[str, tuple[str, ...]]:
    """A token into the workspace, and its ids as a revocation check names them."""
    issuer = TokenIssuer(SECRET, SystemClock())
    user = User(id=user_id, roles=("user",))
    token = issuer.issue(user, workspace=WORKSPACE, permission=Permission.READ_WRITE, expires_in=600)
    return token, issuer.verify(token).revocation_ids


async def test_a_hypha_rpc_connect_takes_at_most_five_round_trips_to_redis(
    proxied_replica: tuple[ReplicaProcess, ThreadedFaultProxy],
) -> None:
    replica, proxy = proxied_replica
    first_token, _ = token_for("first-user")
    first = await connect_to_server(
        {"server_url": replica.url, "client_id": "first", "token": first_token, "workspace": WORKSPACE}
    )
    token, token_ids = token_for("counted-user")
    markers = [f"{WORKSPACE}/counted".encode(), b"counted", WORKSPACE.encode(), *(i.encode() for i in token_ids)]
    try:
        proxy.record()
        client = await connect_to_server(
            {"server_url": replica.url, "client_id": "counted", "token": token, "workspace": WORKSPACE}
        )
        # connect_to_server returns once its built-in service is registered, which the hub
        # answers after the client_connected event is published: everything is sent by now
        sent = proxy.recorded()
        await client.disconnect()
    finally:
        await first.disconnect()
    trips = [data for _, data in sent if any(marker in data for marker in markers)]
    assert len(trips) <= ROUND_TRIPS_PER_CONNECT, (
        f"one connect took {len(trips)} round trips to Redis, at most {ROUND_TRIPS_PER_CONNECT}:\n"
        + "\n".join(repr(data[:160]) for data in trips)
    )
    assert trips, "the connect reached Redis at all (else the markers are wrong and the test proves nothing)"
