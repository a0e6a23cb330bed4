"""A client's call to the manager, from the router to the manager's door."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from support.wire import attach_client, settle
from switchboard.hub.identity.users import Permission, User
from switchboard.protocol.hypha import envelope
from switchboard.server.app import build_hub
from switchboard.testing.clock import FakeClock
from switchboard.testing.hub import settings_for_tests

pytestmark = pytest.mark.timeout(10)

WS = "ws-1"
USER = User(id="u", grants={WS: Permission.READ_WRITE})


async def test_a_clients_call_to_the_manager_is_decoded_once_on_its_way_to_the_door(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The router decodes and stamps the frame; the door works on that, not on a second decode
    of the stamped bytes (a connect's calls to the manager carry its services' schemas)."""
    hub = build_hub(settings_for_tests(), clock=FakeClock())
    await hub.start()
    try:
        peer, wire, writer = await attach_client(hub, WS, "c", USER)
        seen: list[dict[str, Any]] = []
        real = envelope.decode

        def counting(frame: bytes) -> envelope.Envelope:
            env = real(frame)
            seen.append(env.main)
            return env

        monkeypatch.setattr(envelope, "decode", counting)
        call = envelope.encode(
            {"type": "method", "to": f"*/{hub.manager_id}", "method": "services.default.subscribe", "session": "s1"},
            msgpack.packb({"args": [["client_disconnected"]], "promise": "*"}),
        )
        await hub.handle_binary(peer, call)
        await settle()

        decoded = sum(m.get("method") == "services.default.subscribe" for m in seen)
        assert decoded == 1, "decoded once, by the router"
        assert "client_disconnected" in hub.subscribers.names_of(peer), "and the door ran the call"
        writer.cancel()
    finally:
        await hub.stop()


def _call(hub: Any, method: str, session: str, args: list[Any]) -> bytes:
    return envelope.encode(
        {"type": "method", "to": f"*/{hub.manager_id}", "method": method, "session": session},
        msgpack.packb({"args": args, "promise": "*"}),
    )


async def test_the_manager_answers_a_subscribe_before_a_get_service_sent_after_it() -> None:
    """A client's calls are answered in the order they came when none waits on I/O, as Hypha
    answers them: hypha-rpc subscribes to ``client_disconnected`` and then asks for the manager's
    service as it connects, and adds its handler for the event only once the subscribe is
    answered."""
    hub = build_hub(settings_for_tests(), clock=FakeClock())
    await hub.start()
    try:
        peer, wire, writer = await attach_client(hub, WS, "c", USER)
        # the manager's service as the door keeps it once the RPC has encoded it for a first client
        hub.manager.door.service_answer.payload = msgpack.packb({"args": [{"id": "default"}]})
        await hub.handle_binary(peer, _call(hub, "services.default.subscribe", "s1", [["client_disconnected"]]))
        await hub.handle_binary(peer, _call(hub, "services.built-in.get_service", "s2", ["default"]))
        await settle()

        assert wire.methods() == ["s1.resolve", "s2.resolve"]
        writer.cancel()
    finally:
        await hub.stop()
