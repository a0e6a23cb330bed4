"""The token secret a hub without ``--jwt-secret`` keeps in its state directory: made once, private, refused when not."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from switchboard.config import Settings
from switchboard.errors import ConfigError
from switchboard.server.process.state_dir import SECRET_FILE, kept_secret, state_path, token_secret, too_open


def test_the_default_is_the_users_data_directory() -> None:
    assert state_path("", {"XDG_DATA_HOME": "/data/me"}) == Path("/data/me/switchboard")
    assert state_path("", {}) == Path.home() / ".local" / "share" / "switchboard"
    assert state_path("", {"XDG_DATA_HOME": "relative/path"}) == Path.home() / ".local" / "share" / "switchboard"
    assert state_path("/srv/sb", {"XDG_DATA_HOME": "/data/me"}) == Path("/srv/sb")


def test_the_secret_is_made_once_in_a_private_directory_and_file(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "state"
    first, made = kept_secret(directory)
    again, made_again = kept_secret(directory)
    assert (made, made_again) == (True, False)
    assert first == again
    assert len(first.encode()) >= 32
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / SECRET_FILE).stat().st_mode) == 0o600
    assert [p.name for p in directory.iterdir()] == [SECRET_FILE]  # nothing left aside


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_a_secret_file_others_can_read_is_refused_as_ssh_refuses_a_key(tmp_path: Path, mode: int) -> None:
    kept_secret(tmp_path)
    path = tmp_path / SECRET_FILE
    path.chmod(mode)
    with pytest.raises(ConfigError) as info:
        kept_secret(tmp_path)
    message = str(info.value)
    assert f"{path} is accessible by others (mode {mode:04o})" in message
    assert f"chmod 600 {path}" in message
    assert "--jwt-secret/SWITCHBOARD_JWT_SECRET" in message


def test_too_open_is_any_bit_for_group_or_others() -> None:
    assert not too_open(0o100600)
    assert not too_open(0o400)
    assert all(too_open(0o600 | bit) for bit in (0o040, 0o020, 0o010, 0o004, 0o002, 0o001))


def test_a_short_secret_in_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / SECRET_FILE
    path.write_text("short\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="holds 5 bytes, fewer than 32"):
        kept_secret(tmp_path)


def test_an_unwritable_state_directory_is_refused_naming_both_ways_out(tmp_path: Path) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    with pytest.raises(ConfigError) as info:
        kept_secret(blocked / "state")
    assert "--state-dir/SWITCHBOARD_STATE_DIR" in str(info.value)
    assert "--jwt-secret/SWITCHBOARD_JWT_SECRET" in str(info.value)


def test_jwt_secret_wins_and_nothing_is_written(tmp_path: Path) -> None:
    secret = "s" * 40
    assert token_secret(Settings(jwt_secret=secret, state_dir=str(tmp_path / "state"))) == secret
    assert not (tmp_path / "state").exists()


def test_without_a_secret_the_kept_one_is_used(tmp_path: Path) -> None:
    settings = Settings(state_dir=str(tmp_path))
    assert token_secret(settings) == token_secret(settings) == (tmp_path / SECRET_FILE).read_text().strip()


def test_the_suite_never_uses_the_real_data_directory() -> None:
    """tests/conftest.py points both the variable and XDG_DATA_HOME at temporary directories."""
    home_default = Path.home() / ".local" / "share" / "switchboard"
    assert state_path(os.environ.get("SWITCHBOARD_STATE_DIR", "")) != home_default
    assert state_path("") != home_default


def test_serve_refuses_to_start_on_a_secret_file_others_can_read(tmp_path: Path) -> None:
    kept_secret(tmp_path)
    (tmp_path / SECRET_FILE).chmod(0o644)
    with socket.socket() as taken:  # were the file accepted, the hub would exit 3 on the bind, not hang
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = subprocess.run(
            [sys.executable, "-m", "switchboard", "serve", "--port", str(taken.getsockname()[1])],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "SWITCHBOARD_STATE_DIR": str(tmp_path)},
        )
    assert done.returncode == 1, done.stderr
    assert "is accessible by others (mode 0644)" in done.stderr
