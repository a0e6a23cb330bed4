"""Across replicas, a reconnection token still expires with the credential it descends from (issue 21, item 4).

The bound travels inside the token, so replica B, which never saw the
credential, refuses a reconnection token replica A issued once the credential
it came from has expired, as A itself would.
"""

from __future__ import annotations

from hypha_rpc import connect_to_server

from support.tokens import claims, credential, first_reply, past

LIFE = 4.0  # seconds: enough to resume on B once before the credential expires


async def test_a_reconnection_token_from_a_is_refused_on_b_once_the_credential_expired(replicas) -> None:
    a = replicas.start("life-a")
    b = replicas.start("life-b")
    token, expires = credential("carol", LIFE)
    client = await connect_to_server({"server_url": a.url, "client_id": "carols-worker", "token": token})
    try:
        resume = client.config["reconnection_token"]
        workspace = client.config["workspace"]
    finally:
        await client.disconnect()
    assert claims(resume)["exp"] <= expires, "replica A issued a reconnection token that outlives the credential"
    # before the credential expires, B resumes the client: it takes A's tokens
    before = await first_reply(b.url, "carols-worker", workspace=workspace, reconnection_token=resume)
    assert before["type"] == "connection_info", before
    refreshed = before["reconnection_token"]
    assert claims(refreshed)["exp"] <= expires, "replica B renewed the token past the credential"
    await past(expires)
    for candidate in (resume, refreshed):
        after = await first_reply(b.url, "carols-worker", workspace=workspace, reconnection_token=candidate)
        assert after["type"] == "error", f"resumed on B after the credential expired: {after}"
        assert "token has expired" in after["message"]
