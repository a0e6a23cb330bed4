"""``eventually``: every test's one bounded wait, scaled by SWITCHBOARD_TEST_TIME_SCALE."""

from __future__ import annotations

import pytest

from switchboard.errors import ConfigError
from switchboard.testing.wait import eventually, eventually_blocking, scaled


async def test_it_returns_the_first_truthy_result() -> None:
    answers = iter([0, None, "", 42])
    assert await eventually(lambda: next(answers), "an answer", interval=0) == 42


async def test_an_async_check_is_awaited_and_its_errors_mean_not_yet() -> None:
    calls = 0

    async def check() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("not yet")
        return "up"

    assert await eventually(check, "the service", interval=0) == "up"


async def test_it_fails_naming_what_it_waited_for_and_the_last_result(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHBOARD_TEST_TIME_SCALE", "1")
    with pytest.raises(AssertionError, match=r"the door to open: not within 0.05 s \(last: ValueError\('stuck'\)\)"):
        await eventually(lambda: (_ for _ in ()).throw(ValueError("stuck")), "the door to open", timeout=0.05)


def test_the_time_scale_multiplies_every_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHBOARD_TEST_TIME_SCALE", "3")
    assert scaled(5.0) == 15.0
    with pytest.raises(AssertionError, match=r"not within 0.03 s"):
        eventually_blocking(lambda: False, "never", timeout=0.01)


@pytest.mark.parametrize("bad", ["0", "-1", "fast"])
def test_a_bad_time_scale_is_refused(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("SWITCHBOARD_TEST_TIME_SCALE", bad)
    with pytest.raises(ConfigError, match="SWITCHBOARD_TEST_TIME_SCALE"):
        scaled(1.0)
