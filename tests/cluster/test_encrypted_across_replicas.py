"""Encrypted payloads across two replicas (issue 21, item 6): refused by default wherever the pieces go.

The provider (hypha-rpc, encryption on) is on replica A; the attacker and the
honest encrypting caller are on replica B. A sealed call is refused by B, the
sender's replica; a sealed message in pieces is refused by A, which walks
every piece for its client whichever replica it came through. With
``--allow-encrypted-payloads`` on both, an encrypted call crosses them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from support.sealed import Raw, forged_ctx, pack, sealed
from switchboard.protocol.hypha.chunks import MESSAGE_CACHE as CACHE

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

SETTING = "--allow-encrypted-payloads"


async def provider_on(url: str, clients: Any) -> tuple[Any, Any, list[dict[str, Any]]]:
    owner = await clients(url, client_id="owner")
    provider = await clients(url, client_id="provider", token=await owner.generate_token(), encryption=True)
    seen: list[dict[str, Any]] = []

    def who(context: dict[str, Any] | None = None) -> str:
        assert context is not None
        seen.append(context)
        return str(context["user"]["id"])

    await provider.register_service(
        {"id": "pub", "config": {"visibility": "public", "require_context": True}, "who": who}
    )
    return owner, provider, seen


def as_root(seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in seen if (c.get("user") or {}).get("id") == "root"]


async def test_by_default_a_sealed_call_or_message_in_pieces_from_another_replica_is_refused(
    replicas: Any, clients: Any
) -> None:
    a, b = replicas.start("ra"), replicas.start("rb")
    owner, provider, seen = await provider_on(a.url, clients)
    ws = owner.config["workspace"]
    target = f"{ws}/provider"
    key = bytes.fromhex(provider.rpc.get_public_key())
    attacker = await Raw.open(b.url, "outsider")
    try:
        kind, message = await attacker.forge(key, target, "services.pub.who", ws)
        assert as_root(seen) == []
        assert kind == "reject"
        assert SETTING in message

        session = attacker.session()
        inside = {"args": [], "with_kwargs": False, "promise": attacker.promise(session), "ctx": forged_ctx(ws, target)}
        head = {"type": "method", "to": target, "method": "services.pub.who", "session": session}
        whole = pack(head) + pack(sealed(key, inside))
        name = attacker.session()
        steps = [await attacker.ask(target, CACHE + "create", {"args": [name, False]})]
        steps.append(await attacker.ask(target, CACHE + "append", {"args": [name, whole, False]}))
        steps.append(await attacker.ask(target, CACHE + "process", {"args": [name, False]}))
        assert as_root(seen) == [], steps
        assert [k for k, _ in steps] == ["resolve", "resolve", "reject"], steps
        assert SETTING in steps[-1][1]
    finally:
        await attacker.close()

    caller = await clients(b.url, client_id="caller", encryption=True)
    svc = await caller.get_service(f"{ws}/provider:pub", {"encryption_public_key": provider.rpc.get_public_key()})
    with pytest.raises(Exception, match=SETTING):
        await asyncio.wait_for(svc.who(), 10)


async def test_with_the_setting_on_both_an_encrypted_call_crosses_replicas(replicas: Any, clients: Any) -> None:
    a, b = replicas.start("ra", SETTING), replicas.start("rb", SETTING)
    owner, provider, seen = await provider_on(a.url, clients)
    caller = await clients(b.url, client_id="caller", encryption=True)
    svc = await caller.get_service(
        f"{owner.config['workspace']}/provider:pub", {"encryption_public_key": provider.rpc.get_public_key()}
    )
    assert await svc.who() == caller.config["user"]["id"]
    assert seen[-1]["encryption"] is True
    assert seen[-1]["caller_public_key"] == caller.rpc.get_public_key()
