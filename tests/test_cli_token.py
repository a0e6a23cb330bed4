"""``switchboard token`` hands out access to a shared workspace (issue 22): a hub with the same
state directory takes the token with exactly the permission printed; bad input is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from hypha_rpc import connect_to_server

from support.tokens import claims, first_reply
from switchboard.cli import main
from switchboard.testing.hub import running, settings_for_tests


def _token(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["token", *args])
    return result.exit_code, result.output.strip()


@pytest.mark.parametrize(("permission", "code"), [("read", "r"), ("read_write", "rw"), ("admin", "a")])
async def test_a_printed_token_opens_the_shared_workspace_of_a_hub_on_the_same_state_dir(
    tmp_path: Path, permission: str, code: str
) -> None:
    status, token = _token(
        "--user", "ci-bot", "--workspace", "lab_shared", "--permission", permission, "--expires-in", "600",
        "--state-dir", str(tmp_path),
    )  # fmt: skip
    assert status == 0, token
    assert f"ws:lab_shared#{code}" in claims(token)["scope"]
    async with running(settings_for_tests(jwt_secret="", state_dir=str(tmp_path))) as hub:
        reply = await first_reply(hub.url, "bot", token=token)
        assert reply["type"] == "connection_info", reply
        assert reply["workspace"] == "lab_shared"
        assert reply["user"]["id"] == "op.ci-bot"  # an operator's user: never a provider's subject
        client = await connect_to_server({"server_url": hub.url, "client_id": "bot2", "token": token})
        try:
            service = {"id": "svc", "config": {"visibility": "public"}, "f": lambda: 1}
            if permission == "read":
                with pytest.raises(Exception, match="(?i)permission"):  # noqa: PT011 - hypha-rpc's error types
                    await client.register_service(service)
            else:
                await client.register_service(service)
        finally:
            await client.disconnect()


async def test_a_token_from_another_state_dir_is_refused(tmp_path: Path) -> None:
    status, token = _token("--user", "x", "--workspace", "w", "--state-dir", str(tmp_path / "a"))
    assert status == 0
    async with running(settings_for_tests(jwt_secret="", state_dir=str(tmp_path / "b"))) as hub:
        reply = await first_reply(hub.url, "x", token=token)
        assert reply["type"] == "error"


async def test_a_root_token_opens_the_root_users_workspace_and_reaches_admin_utils(tmp_path: Path) -> None:
    status, token = _token("--root", "--expires-in", "600", "--state-dir", str(tmp_path))
    assert status == 0, token
    assert claims(token)["sub"] == "root"
    async with running(settings_for_tests(jwt_secret="", state_dir=str(tmp_path))) as hub:
        client = await connect_to_server({"server_url": hub.url, "token": token})
        try:
            assert client.config["workspace"] == "ws-user-root"
            admin = await client.get_service("admin-utils")
            assert await admin.list_servers() == [hub.hub.replica_id]
        finally:
            await client.disconnect()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--user", "bad user", "--workspace", "w"], "invalid user id"),
        (["--user", "u", "--workspace", "a/b"], "invalid workspace"),
        (["--user", "u", "--workspace", "w#a"], "invalid workspace"),
        (["--user", "u", "--workspace", "w", "--permission", "owner"], "Invalid value for '--permission'"),
        (["--user", "u", "--workspace", "w", "--expires-in", "0"], "--expires-in"),
        (["--user", "u", "--workspace", "w", "--expires-in", "1e12"], "--expires-in"),
        (["--user", "u", "--workspace", "w", "--jwt-secret", "short"], "at least 32"),
        (["--workspace", "w"], "Missing option '--user'"),
        (["--root", "--user", "u"], "--root stands for the root user"),
        (["--root", "--permission", "read"], "--root stands for the root user"),
    ],
)
def test_bad_input_gets_a_clear_error_and_a_non_zero_exit(tmp_path: Path, args: list[str], message: str) -> None:
    status, output = _token(*args, "--state-dir", str(tmp_path))
    assert status != 0
    assert message in output
    assert "Traceback" not in output
