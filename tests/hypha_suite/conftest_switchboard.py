"""Hypha's tests/conftest.py replaced, for ``scripts/hypha-suite``: its fixtures, satisfied by Switchboard.

``run.py`` copies this file over the conftest.py of Hypha's unpacked tests and
starts the hubs before pytest runs, at the addresses Hypha's tests name
(tests/__init__.py): the server fixtures only say where the hubs are, and the
token fixtures mint Hypha's users (the same claims) with Switchboard's issuer
through the ``hypha.core.auth`` shim. Fixtures for things a hub does not have
(MinIO, Postgres, Triton, a server under a base path, custom or local auth
servers) either stand for nothing, where tests only list them, or fail saying why.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from hypha.core import UserInfo, UserPermission
from hypha.core.auth import create_scope, generate_auth_token

os.environ["no_proxy"] = os.environ.get("no_proxy", "") + ",localhost,127.0.0.1"
os.environ["NO_PROXY"] = os.environ.get("NO_PROXY", "") + ",localhost,127.0.0.1"

TOKEN_LIFETIME = 18000  # as Hypha's fixtures


def _mint(user_id: str, roles: list[str], workspaces: dict[str, UserPermission], current: str | None = None) -> str:
    info = UserInfo(
        id=user_id,
        is_anonymous=False,
        email=f"{user_id}@test.com",
        parent=None,
        roles=roles,
        scope=create_scope(workspaces=workspaces, current_workspace=current),
        expires_at=None,
    )
    return asyncio.run(generate_auth_token(info, TOKEN_LIFETIME))


def _user_token(user_id: str, roles: list[str] | None = None) -> str:
    return _mint(user_id, roles or [], {f"ws-user-{user_id}": UserPermission.admin})


def _unavailable(what: str) -> None:
    pytest.fail(f"needs {what}, which Switchboard does not have (scripts/hypha-suite)", pytrace=False)


# -- servers: started by run.py ---------------------------------------------------------


@pytest.fixture(name="fastapi_server", scope="session")
def fastapi_server_fixture() -> None:
    return


@pytest.fixture(name="fastapi_server_sqlite", scope="session")
def fastapi_server_sqlite_fixture() -> None:
    return


@pytest.fixture(name="redis_server", scope="session")
def redis_server_fixture() -> str:
    return os.environ["HYPHA_SUITE_REDIS_URL"]


@pytest.fixture(name="fastapi_server_redis_1", scope="session")
def fastapi_server_redis_1_fixture() -> None:
    return


@pytest.fixture(name="fastapi_server_redis_2", scope="session")
def fastapi_server_redis_2_fixture(fastapi_server_redis_1: None) -> str:
    return os.environ["HYPHA_SUITE_REDIS_2_URL"]


@pytest.fixture(name="minio_server", scope="session")
def minio_server_fixture() -> None:
    return  # listed by tests that do not use S3; those that do fail on the calls they make


@pytest.fixture(name="postgres_server", scope="session")
def postgres_server_fixture() -> None:
    return


@pytest.fixture(name="fastapi_server_unload_grace")
def fastapi_server_unload_grace_fixture() -> None:
    _unavailable("Hypha's HYPHA_WORKSPACE_UNLOAD_GRACE_PERIOD server")


@pytest.fixture(name="fastapi_subpath_server")
def fastapi_subpath_server_fixture() -> None:
    _unavailable("a server under a base path (Hypha's --base-path)")


@pytest.fixture(name="triton_server")
def triton_server_fixture() -> None:
    _unavailable("a Triton inference server")


@pytest.fixture(name="custom_auth_server")
def custom_auth_server_fixture() -> None:
    _unavailable("Hypha's custom authentication startup functions")


@pytest.fixture(name="local_auth_server")
def local_auth_server_fixture() -> None:
    _unavailable("Hypha's local authentication (--enable-local-auth)")


# -- tokens: Hypha's users, minted with Switchboard's issuer ----------------------------


@pytest.fixture(name="root_user_token", scope="session")
def root_user_token_fixture() -> str:
    return _mint("root", [], {"*": UserPermission.admin})


@pytest.fixture(name="admin_role_user_token", scope="session")
def admin_role_user_token_fixture() -> str:
    return _mint("admin-role-user", ["admin"], {"*": UserPermission.admin})


@pytest.fixture(name="wildcard_owner_user_token", scope="session")
def wildcard_owner_user_token_fixture() -> str:
    return _mint("wildcard-owner", [], {"*": UserPermission.read_write}, current="ws-user-wildcard-owner")


@pytest.fixture(name="test_user_token", scope="session")
def test_user_token_fixture() -> str:
    return _user_token("user-1")


@pytest.fixture(name="test_user_token_2", scope="session")
def test_user_token_2_fixture() -> str:
    return _user_token("user-2")


@pytest.fixture(name="test_user_token_temporary", scope="session")
def test_user_token_temporary_fixture() -> str:
    return _user_token("test-user", ["temporary-test-user"])


@pytest.fixture(name="test_user_token_5", scope="session")
def test_user_token_5_fixture() -> str:
    return _user_token("user-5")


@pytest.fixture(name="test_user_token_6", scope="session")
def test_user_token_6_fixture() -> str:
    return _user_token("user-6")


@pytest.fixture(name="test_user_token_7", scope="session")
def test_user_token_7_fixture() -> str:
    return _user_token("user-7")


@pytest.fixture(name="test_user_token_8", scope="session")
def test_user_token_8_fixture() -> str:
    return _user_token("user-8")


@pytest.fixture(name="test_user_token_9", scope="session")
def test_user_token_9_fixture() -> str:
    return _user_token("user-9")
