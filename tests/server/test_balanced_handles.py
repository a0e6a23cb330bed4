"""A service name, not an instance: ``get_service(name, {"mode": "balance:<policy>"})`` with an
unmodified hypha-rpc client, on one in-process hub (issue 41).

The handle's every call goes to one live instance, chosen per call; an
instance that registers is used, one that leaves is not; a call whose
instance dies is re-sent if the service declares the function idempotent,
and fails at once with a clear error otherwise.
"""

from __future__ import annotations

import collections

import pytest
from hypha_rpc.rpc import RemoteException

pytestmark = pytest.mark.timeout(60)


async def _instances(connect, n, *, extra=None, config=None):
    """``n`` clients of one workspace serving ``calc`` (``who`` answers the instance's number)."""
    owner = await connect(client_id="p0")
    token = await owner.generate_token()
    apis = [owner] + [await connect(client_id=f"p{i}", token=token) for i in range(1, n)]
    for i, api in enumerate(apis):
        service = {"id": "calc", "config": dict(config or {}), "who": (lambda i=i: i)}
        service.update((extra or {}).get(i, {}))
        await api.register_service(service)
    return apis, token


async def test_round_robin_sends_each_call_to_the_next_instance(connect):
    apis, token = await _instances(connect, 3)
    caller = await connect(client_id="caller", token=token)
    calc = await caller.get_service("calc", {"mode": "balance:round_robin"})
    answers = [await calc.who() for _ in range(30)]  # noqa
    assert collections.Counter(answers) == {0: 10, 1: 10, 2: 10}


async def test_an_unknown_balance_policy_is_refused_with_the_two_names(connect):
    apis, _ = await _instances(connect, 1)
    with pytest.raises(RemoteException, match="balance:round_robin' or 'balance:least_busy"):
        await apis[0].get_service("calc", {"mode": "balance:fastest"})
