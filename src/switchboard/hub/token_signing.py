"""HS256 signing of the tokens this hub issues, without PyJWT's per-call key checks.

PyJWT checks the key on every ``encode``: that it is not PEM, SSH or DER
(cryptography tries to load it as each) and not a JSON key set; with the
JSON of the claims and the header, about a third of a connect's token work
(one reconnection token is signed per connect). The hub's secret does not
change, and every token it signs is verified by PyJWT (``TokenIssuer.verify``),
which still checks the key. What is signed here is the same bytes PyJWT
signs: the header ``{"alg":"HS256","typ":"JWT"}`` and the claims as compact
JSON, base64url without padding (``tests/hub/test_auth.py`` compares the two).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


_HEADER = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":"), sort_keys=True).encode())


def sign_hs256(claims: dict[str, Any], key: bytes) -> str:
    """The compact JWT of ``claims`` signed with HMAC-SHA256 under ``key``."""
    signing_input = _HEADER + b"." + _b64(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(key, signing_input, hashlib.sha256).digest()
    return (signing_input + b"." + _b64(signature)).decode("ascii")
