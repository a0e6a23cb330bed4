"""An end-to-end encrypted payload cannot carry a forged context (issue 21, item 6).

hypha-rpc can encrypt a call's payload for its callee
(``connect_to_server({"encryption": True})``): the payload becomes
``{"_enc": {"v": 2, "pub": <caller's key>, "nonce": ...}, "data": <box>}``,
and the callee, after it built the context from the header the hub stamped,
opens the box and merges *every* field in it over the message: ``ctx``,
``from``, ``user``, ``promise``. The hub cannot read the box, so it cannot
check it. Before the fix an anonymous stranger sealed ``{"ctx": {"user":
{"id": "root"}, "ws": W}}`` for a provider and its ``require_context``
function saw user ``root`` in its own workspace.

So the hub refuses encrypted payloads unless ``--allow-encrypted-payloads``
is on: a call gets a reject naming the setting at once, any other frame an
error frame. With the setting on, encrypted calls between real clients work,
and what a provider may trust of an encrypted call's context is only
``caller_public_key`` (and hypha-rpc's ``trusted_keys``, which checks it):
the other fields are whatever the caller sealed (docs/authorization.md).

The provider is a real hypha-rpc client with encryption on, in workspace W.
The attackers are raw WebSocket clients that seal their boxes with the
provider's public key the way hypha-rpc does: an anonymous outsider, and a
member of W with a read token; a real encrypting hypha-rpc client is the
honest caller.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from support.sealed import Raw, forged_ctx, pack, sealed
from switchboard.config import Settings
from switchboard.protocol.hypha.chunks import MESSAGE_CACHE as CACHE
from switchboard.testing.hub import RunningServer, settings_for_tests

pytestmark = pytest.mark.timeout(60)

SETTING = "--allow-encrypted-payloads"


@pytest.fixture
def settings(request: pytest.FixtureRequest) -> Settings:
    """The hub's settings: the default, or (``indirect`` parameter ``True``) encrypted payloads allowed."""
    if getattr(request, "param", False):
        return settings_for_tests(allow_encrypted_payloads=True)
    return settings_for_tests()


allowed = pytest.mark.parametrize("settings", [True], indirect=True, ids=["allowed"])


@dataclasses.dataclass
class Victim:
    workspace: str
    owner: Any
    provider: Any
    key: bytes  # the provider's public key: public, as keys are (a service may publish it)
    seen: list[dict[str, Any]]  # the context of every call of pub.who and prot.act

    def forged(self) -> list[dict[str, Any]]:
        return [c for c in self.seen if (c.get("user") or {}).get("id") == "root"]


@pytest.fixture
async def victim(connect: Any) -> Victim:
    owner = await connect(client_id="owner")
    ws = owner.config["workspace"]
    provider = await connect(client_id="provider", token=await owner.generate_token(), encryption=True)
    seen: list[dict[str, Any]] = []

    def who(context: dict[str, Any] | None = None) -> dict[str, Any]:
        assert context is not None
        seen.append(context)
        return {"user": context["user"]["id"], "ws": context["ws"], "key": context.get("caller_public_key")}

    def act(context: dict[str, Any] | None = None) -> str:
        assert context is not None
        seen.append(context)
        return "the-crown-jewels" if context["user"]["id"] == "root" else "nothing"

    config = {"require_context": True}
    await provider.register_service({"id": "pub", "config": {**config, "visibility": "public"}, "who": who})
    await provider.register_service({"id": "prot", "config": {**config, "visibility": "protected"}, "act": act})
    return Victim(ws, owner, provider, bytes.fromhex(provider.rpc.get_public_key()), seen)


@pytest.fixture
async def raw(server: RunningServer) -> AsyncIterator[Any]:
    opened: list[Raw] = []

    async def _open(client_id: str, **kwargs: Any) -> Raw:
        opened.append(await Raw.open(server.url, client_id, **kwargs))
        return opened[-1]

    yield _open
    for r in opened:
        await r.close()


async def attackers(raw: Any, victim: Victim) -> list[Raw]:
    """An anonymous outsider, and a member of W holding a read token."""
    read = await victim.owner.generate_token({"permission": "read"})
    return [await raw("outsider"), await raw("reader", token=read, workspace=victim.workspace)]


def assert_refused(answer: tuple[str, str]) -> None:
    kind, message = answer
    assert kind == "reject", answer
    assert "encrypted" in message, answer
    assert SETTING in message, answer


async def test_an_outsider_cannot_seal_a_forged_context_into_a_public_service(victim: Victim, raw: Any) -> None:
    outsider = await raw("outsider")
    answer = await outsider.forge(victim.key, f"{victim.workspace}/provider", "services.pub.who", victim.workspace)
    assert victim.forged() == [], "the provider ran a call as root"
    assert_refused(answer)


async def test_a_read_member_cannot_seal_root_into_a_protected_service(victim: Victim, raw: Any) -> None:
    read = await victim.owner.generate_token({"permission": "read"})
    reader = await raw("reader", token=read, workspace=victim.workspace)
    answer = await reader.forge(victim.key, f"{victim.workspace}/provider", "services.prot.act", victim.workspace)
    assert victim.forged() == [], "the provider ran a protected call as root"
    assert_refused(answer)


async def test_a_sealed_payload_is_refused_in_a_chunked_message_too(victim: Victim, raw: Any) -> None:
    provider = f"{victim.workspace}/provider"
    for attacker in await attackers(raw, victim):
        for where in ("payload", "header"):
            session = attacker.session()
            head = {"type": "method", "to": provider, "method": "services.pub.who", "session": session}
            inside = {"args": [], "with_kwargs": False, "promise": attacker.promise(session)}
            inside["ctx"] = forged_ctx(victim.workspace, provider)
            box = sealed(victim.key, inside)
            message = pack({**head, **box}) if where == "header" else pack(head) + pack(box)
            key = attacker.session()
            steps = [await attacker.ask(provider, CACHE + "create", {"args": [key, False]})]
            steps.append(await attacker.ask(provider, CACHE + "append", {"args": [key, message, False]}))
            steps.append(await attacker.ask(provider, CACHE + "process", {"args": [key, False]}))
            assert victim.forged() == [], (where, steps)
            assert [kind for kind, _ in steps] == ["resolve", "resolve", "reject"], (where, steps)
            assert SETTING in steps[-1][1], (where, steps)


async def test_a_sealed_header_is_refused(victim: Victim, raw: Any) -> None:
    provider = f"{victim.workspace}/provider"
    for attacker in await attackers(raw, victim):
        session = attacker.session()
        inside = {"args": [], "promise": attacker.promise(session), "ctx": forged_ctx(victim.workspace, provider)}
        head = {"type": "method", "to": provider, "method": "services.pub.who", "session": session}
        await attacker.ws.send(pack({**head, **sealed(victim.key, inside)}))
        answer = await asyncio.wait_for(asyncio.shield(attacker.future(session)), 10)
        assert victim.forged() == [], "the provider ran a call as root"
        assert_refused(answer)


async def test_a_real_encrypting_caller_is_refused_at_once_naming_the_setting(victim: Victim, connect: Any) -> None:
    caller = await connect(client_id="caller", encryption=True)
    svc = await caller.get_service(
        f"{victim.workspace}/provider:pub", {"encryption_public_key": victim.provider.rpc.get_public_key()}
    )
    with pytest.raises(Exception, match=SETTING):
        await asyncio.wait_for(svc.who(), 10)
    plain = await caller.get_service(f"{victim.workspace}/provider:pub")  # without the key: not encrypted
    assert (await plain.who())["user"] == caller.config["user"]["id"]


@allowed
async def test_with_the_setting_on_encrypted_calls_between_real_clients_work(victim: Victim, connect: Any) -> None:
    caller = await connect(client_id="caller", encryption=True, token=await victim.owner.generate_token())
    key = caller.rpc.get_public_key()
    for sid in ("pub", "prot"):
        svc = await caller.get_service(
            f"{victim.workspace}/provider:{sid}", {"encryption_public_key": victim.provider.rpc.get_public_key()}
        )
        result = await (svc.who() if sid == "pub" else svc.act())
        assert result == (
            {"user": caller.config["user"]["id"], "ws": victim.workspace, "key": key} if sid == "pub" else "nothing"
        )
        context = victim.seen[-1]
        assert context["encryption"] is True
        assert context["caller_public_key"] == key  # what the provider can trust: the box opened with this key


@allowed
async def test_with_the_setting_on_only_the_callers_key_can_be_trusted(victim: Victim, raw: Any, connect: Any) -> None:
    """As documented: a sealed context is the caller's claim; ``caller_public_key`` is not,
    and hypha-rpc's ``trusted_keys`` refuses every key but those listed."""
    outsider = await raw("outsider")
    answer = await outsider.forge(victim.key, f"{victim.workspace}/provider", "services.pub.who", victim.workspace)
    assert answer[0] == "resolve"
    forged = victim.forged()
    assert len(forged) == 1
    assert forged[0]["caller_public_key"] != victim.provider.rpc.get_public_key()
    honest = await connect(client_id="honest", encryption=True)
    trusted = honest.rpc.get_public_key()

    def reveal(context: dict[str, Any] | None = None) -> str:
        return "the-crown-jewels"

    await victim.provider.register_service(
        {
            "id": "keyed",
            "config": {"visibility": "public", "require_context": True, "trusted_keys": [trusted]},
            "reveal": reveal,
        }
    )
    kind, message = await outsider.forge(
        victim.key, f"{victim.workspace}/provider", "services.keyed.reveal", victim.workspace
    )
    assert kind == "reject"
    assert "trusted keys" in message
    svc = await honest.get_service(
        f"{victim.workspace}/provider:keyed", {"encryption_public_key": victim.provider.rpc.get_public_key()}
    )
    assert await svc.reveal() == "the-crown-jewels"
