"""The token secret a hub without ``--jwt-secret`` makes once and keeps in its state directory.

A random secret per process made every token, and every client's identity,
die with the process. Kept in a file, it survives restarts; kept private as
ssh keeps its keys: the directory is made 0700, the file 0600, and a file
that group or others can read is refused rather than trusted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from switchboard.config import MAKE_SECRET, MIN_SECRET_BYTES, Settings
from switchboard.errors import ConfigError

SECRET_FILE = "jwt-secret"
# persistent workspace records of the embedded hub (switchboard.backends.memory_workspaces)
WORKSPACES_FILE = "workspaces.json"
_STATE_DIR = "--state-dir/SWITCHBOARD_STATE_DIR"
_JWT_SECRET = "--jwt-secret/SWITCHBOARD_JWT_SECRET"

log = logging.getLogger(__name__)


def state_path(state_dir: str, environ: Mapping[str, str] | None = None) -> Path:
    """``state_dir`` if set, else ``$XDG_DATA_HOME/switchboard``, else ``~/.local/share/switchboard``."""
    if state_dir:
        return Path(state_dir).expanduser()
    environ = os.environ if environ is None else environ
    xdg = environ.get("XDG_DATA_HOME", "")
    if os.path.isabs(xdg):  # the XDG spec: a relative value is invalid and ignored
        return Path(xdg) / "switchboard"
    try:
        home = Path.home()
    except RuntimeError:
        raise ConfigError(f"no home directory to keep the token secret in: set {_STATE_DIR} or {_JWT_SECRET}") from None
    return home / ".local" / "share" / "switchboard"


def too_open(mode: int) -> bool:
    """Whether a secret file with this mode is readable (or writable) beyond its owner."""
    return bool(mode & 0o077)


def token_secret(settings: Settings) -> str:
    """``--jwt-secret`` if given, else the secret kept in the state directory (made on first use)."""
    if settings.jwt_secret:
        return settings.jwt_secret
    directory = state_path(settings.state_dir)
    secret, made = kept_secret(directory)
    log.info(
        "token secret %s %s (tokens survive restarts; replicas of one hub need %s instead)",
        "made and kept in" if made else "read from",
        directory / SECRET_FILE,
        _JWT_SECRET,
        extra={"replica": settings.replica_id},
    )
    return secret


def kept_secret(directory: Path) -> tuple[str, bool]:
    """The secret in ``directory``, and whether it was made just now.

    Two hubs starting at once on one directory agree: the file appears whole
    (written aside, then hard-linked into place) and only the first link wins.
    """
    path = directory / SECRET_FILE
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not path.exists():
            made = _write_once(directory, path, secrets.token_urlsafe(MIN_SECRET_BYTES))
            return read_secret(path), made
    except OSError as exc:
        raise ConfigError(
            f"cannot keep the token secret in {directory} ({exc.strerror or exc}): make it writable, "
            f"point {_STATE_DIR} elsewhere, or set {_JWT_SECRET}"
        ) from None
    return read_secret(path), False


def _write_once(directory: Path, path: Path, secret: str) -> bool:
    aside = directory / f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (secret + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(aside, path)
    except FileExistsError:
        return False  # another hub made it first: use its secret
    finally:
        os.unlink(aside)
    with contextlib.suppress(OSError):  # the new name durable too, where the platform allows
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return True


def read_secret(path: Path) -> str:
    """The secret in ``path``, refused if group or others can read it or if it is too short."""
    try:
        mode = path.stat().st_mode
        if too_open(mode):
            raise ConfigError(
                f"the token secret {path} is accessible by others (mode {mode & 0o777:04o}): it must be private, "
                f"as ssh requires of keys; run chmod 600 {path} (and check who has read it), or set {_JWT_SECRET}"
            )
        secret = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the token secret {path} ({exc.strerror or exc}); or set {_JWT_SECRET}"
        ) from None
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"the token secret {path} holds {len(secret.encode())} bytes, fewer than {MIN_SECRET_BYTES}: replace it "
            f"with one made by {MAKE_SECRET}, or delete it to have one made (tokens it signed stop working)"
        )
    return secret
