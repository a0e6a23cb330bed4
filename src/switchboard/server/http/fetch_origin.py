"""Which page a browser sent a request from, as far as the hub's cookies are concerned.

A ``SameSite=Strict`` cookie stops other *sites*, not other *origins* of the
same site: every port of a host, or every subdomain of a registrable domain,
is one site, and the browser returns the cookie on a ``no-cors`` POST from any
of them. So a request that a cookie alone authorizes must also come from the
hub's own origin. Browsers say where a request comes from: ``Sec-Fetch-Site``
(Fetch Metadata, computed by the browser, so it holds behind a proxy that
rewrites ``Host``) and, on every POST, ``Origin``. A request with neither is
not a browser's (hypha-rpc's Python client, curl): it sends only the cookies
its own jar holds. Pure functions of the headers: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

SAME_ORIGIN_SITES = ("same-origin", "none")  # "none": the user typed or bookmarked it, no page behind it


def own_origins(scheme: str, host: str, public_base_url: str) -> frozenset[str]:
    """The hub's own origins: the one a request was addressed to, and the public URL's (behind a proxy)."""
    own = {f"{scheme}://{host}".lower()}
    if public_base_url:
        scheme_, _, rest = public_base_url.partition("://")
        own.add(f"{scheme_}://{rest.partition('/')[0]}".lower())
    return frozenset(own)


def foreign_page(headers: Mapping[str, str], own: Collection[str]) -> str | None:
    """The header showing that a browser sent this from a page of another origin, or ``None``.

    ``Sec-Fetch-Site`` decides when present; a browser without it is judged by
    ``Origin`` (``null`` for sandboxed and file pages: never the hub's).
    """
    site = headers.get("sec-fetch-site")
    if site is not None:
        return None if site.strip().lower() in SAME_ORIGIN_SITES else f"Sec-Fetch-Site: {site[:40]}"
    origin = headers.get("origin")
    if origin is None or origin.strip().rstrip("/").lower() in own:
        return None
    return f"Origin: {origin[:100]}"
