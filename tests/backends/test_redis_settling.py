"""After Redis lost its data, the registry says so until every replica had its turn to re-assert."""

from __future__ import annotations

from switchboard.backends.redis import RedisRegistry
from switchboard.testing import ValkeyServer
from switchboard.testing.wait import eventually


async def test_the_replica_that_notices_a_loss_first_keeps_lookups_wary_for_the_settling_time():
    with ValkeyServer() as own:
        first = RedisRegistry(own.url, replica_id="r1")
        late = RedisRegistry(own.url, replica_id="r2")
        try:
            assert await first.check_reset() is False  # both record the epoch
            assert await late.check_reset() is False
            own.restart()  # empty

            assert await first.lost_data() is True  # nobody noticed yet: the epoch is gone
            assert await first.check_reset(settle=1.0) is True  # r1 notices first and re-asserts ...
            # ... but r2 has not yet: an empty lookup on r1 proves nothing either
            assert await first.lost_data() is True
            assert await late.lost_data() is True
            assert await late.check_reset(settle=1.0) is True  # r2's turn: it does not extend the time
            await eventually(lambda: _settled(first), timeout=3, interval=0.05, what="settled on r1")
            assert await late.lost_data() is False
        finally:
            await first.close()
            await late.close()


async def _settled(registry: RedisRegistry) -> bool:
    return not await registry.lost_data()


async def test_a_first_epoch_is_no_loss():
    with ValkeyServer() as own:
        registry = RedisRegistry(own.url, replica_id="r1")
        try:
            assert await registry.check_reset(settle=5.0) is False
            assert await registry.lost_data() is False  # a new deployment is not "settling"
        finally:
            await registry.close()


async def test_the_settling_ends_as_soon_as_every_replica_the_first_knew_has_written_its_registrations_back():
    with ValkeyServer() as own:
        first = RedisRegistry(own.url, replica_id="r1")
        late = RedisRegistry(own.url, replica_id="r2")
        try:
            assert await first.check_reset() is False
            assert await late.check_reset() is False
            own.restart()  # empty

            assert await first.check_reset(settle=30.0, expect={"r2"}) is True
            await first.settled()
            assert await first.lost_data() is True  # r2 has not written its registrations back yet
            assert await late.check_reset(settle=30.0, expect={"r1"}) is True  # the second does not start another
            assert await late.lost_data() is True
            await late.settled()
            assert await first.lost_data() is False  # at once, not 30 s later
            assert await late.lost_data() is False
        finally:
            await first.close()
            await late.close()
