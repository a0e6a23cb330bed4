"""A real OpenID Connect provider for tests: discovery and JWKS over HTTP on loopback.

Keys are real (RSA 2048 and EC P-256, made with ``cryptography``), tokens are
signed with them by PyJWT; the hub under test fetches the keys over HTTP like
from any provider. The provider can rotate its keys, go down and come back.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

AUDIENCE = "switchboard-test"


class OidcProvider:
    def __init__(self) -> None:
        self._private: dict[str, tuple[Any, str]] = {}  # kid -> (private key, alg)
        self.published: list[str] = []
        self.fetches = 0  # JWKS requests served (or failed)
        self.failing = False  # up, but answering every request with 503 (an outage behind a proxy)
        self._server: ThreadingHTTPServer | None = None
        self._port = 0
        self._thread: threading.Thread | None = None

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def settings(self, **more: Any) -> dict[str, Any]:
        """The hub settings that trust this provider (over http: it is on loopback)."""
        return {"oidc_issuer": self.issuer, "oidc_audience": AUDIENCE, "oidc_allow_http": True, **more}

    def add_key(self, kind: str = "rsa", *, publish: bool = True) -> str:
        kid = f"{kind}-{len(self._private) + 1}"
        if kind == "rsa":
            self._private[kid] = (rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256")
        else:
            self._private[kid] = (ec.generate_private_key(ec.SECP256R1()), "ES256")
        if publish:
            self.published.append(kid)
        return kid

    def public_pem(self, kid: str) -> bytes:
        from cryptography.hazmat.primitives import serialization

        key = self._private[kid][0].public_key()
        return bytes(key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    def token(self, sub: str = "auth0|5f3c00aa", *, kid: str | None = None, **claims: Any) -> str:
        """A token as the provider would issue it; any claim can be overridden (``None`` drops it)."""
        kid = kid or self.published[0]
        key, alg = self._private[kid]
        now = int(time.time())
        body: dict[str, Any] = {"iss": self.issuer, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + 300}
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})

    def jwks(self) -> dict[str, Any]:
        keys = []
        for kid in self.published:
            key, alg = self._private[kid]
            make = RSAAlgorithm if alg.startswith("RS") else ECAlgorithm
            jwk = make.to_jwk(key.public_key(), as_dict=True)
            keys.append({**jwk, "kid": kid, "alg": alg, "use": "sig"})
        return {"keys": keys}

    def start(self) -> OidcProvider:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                if provider.failing:
                    provider.fetches += 1
                    self.send_error(503)
                    return
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": provider.issuer, "jwks_uri": provider.issuer + "/jwks"}
                elif self.path == "/jwks":
                    provider.fetches += 1
                    body = provider.jwks()
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self._port = self._server.server_address[1]
        # stop() waits for the serving loop to look up (every 0.5 s by default), and a test stops the
        # provider from its event loop: 20 ms keeps that loop free, at 50 cheap wake-ups a second
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """The provider goes down: its port refuses connections (the port is kept for a restart)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> OidcProvider:
        if not self._private:
            self.add_key("rsa")
            self.add_key("ec")
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
