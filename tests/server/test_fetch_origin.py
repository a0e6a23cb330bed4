"""Which page a browser sent a request from: a table of headers, decided without I/O."""

from __future__ import annotations

import pytest

from switchboard.server.http.fetch_origin import foreign_page, own_origins

OWN = own_origins("http", "127.0.0.1:8000", "https://hub.example.org/prefix")


def test_own_origins_are_the_addressed_one_and_the_public_urls() -> None:
    assert own_origins("http", "127.0.0.1:8000", "https://hub.example.org/prefix") == {
        "http://127.0.0.1:8000",
        "https://hub.example.org",
    }


@pytest.mark.parametrize(
    ("headers", "foreign"),
    [
        ({}, None),  # not a browser
        ({"sec-fetch-site": "same-origin", "origin": "http://127.0.0.1:8000"}, None),
        ({"sec-fetch-site": "none"}, None),
        ({"origin": "http://127.0.0.1:8000"}, None),
        ({"origin": "HTTPS://hub.example.org/"}, None),  # behind the proxy, case and a trailing slash aside
        ({"sec-fetch-site": "same-origin", "origin": "http://internal:9"}, None),  # the browser knows best
        ({"sec-fetch-site": "same-site", "origin": "http://127.0.0.1:8000"}, "Sec-Fetch-Site: same-site"),
        ({"sec-fetch-site": "cross-site"}, "Sec-Fetch-Site: cross-site"),
        ({"origin": "http://127.0.0.1:8001"}, "Origin: http://127.0.0.1:8001"),  # another port: same site
        ({"origin": "https://app.example.org"}, "Origin: https://app.example.org"),  # a sibling subdomain
        ({"origin": "null"}, "Origin: null"),
    ],
)
def test_a_page_of_another_origin_is_named_by_the_header_that_shows_it(headers, foreign) -> None:
    assert foreign_page(headers, OWN) == foreign
