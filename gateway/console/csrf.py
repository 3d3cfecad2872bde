"""Cross-site request forgery defences for the console's state-changing forms (every POST).

Two independent checks, both required:

1. **Where the request comes from.** Browsers say it: ``Sec-Fetch-Site`` must be
   ``same-origin`` (or ``none``: typed by the user); without it, an ``Origin`` header must
   name this host. Another site, another port of this host (``same-site``) and the opaque
   ``null`` origin are refused. SameSite=Strict on the session cookie does not cover other
   ports of the same host, which count as the same site; this check does.
2. **A secret the attacker cannot read.** The form's ``csrf_token`` field (or an
   ``X-CSRF-Token`` header) must equal the session's token (synchronizer token). The login
   form, before any session exists, uses a double-submit token instead: the same random
   value in a cookie and in the form.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from urllib.parse import urlsplit

FIELD = "csrf_token"
HEADER = "x-csrf-token"
_ALLOWED_FETCH_SITES = frozenset({"same-origin", "none"})


def cross_site_reason(headers: Mapping[str, str], host: str | None) -> str | None:
    """Why a state-changing request with these headers must be refused as cross-site, or
    None when it comes from this console's own pages. ``host``: the request's ``Host``
    header (the origin's host and port must match it; the scheme is not compared, so a
    proxy that ends TLS in front of the gateway keeps working)."""
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site.lower() not in _ALLOWED_FETCH_SITES:
        return f"the request came from another site (Sec-Fetch-Site: {fetch_site[:32]})"
    origin = headers.get("origin")
    if origin is None:
        if fetch_site is None:
            return "the request names no origin (no Origin or Sec-Fetch-Site header)"
        return None
    if origin == "null" or not host:
        return "the request's origin is opaque"
    if urlsplit(origin).netloc.lower() != host.lower():
        return f"the request came from another origin ({origin[:100]})"
    return None


def tokens_match(expected: str | None, given: str | None) -> bool:
    """Whether the token a form carried is the expected one (constant time; an empty or
    missing token never matches)."""
    if not expected or not given:
        return False
    return hmac.compare_digest(expected.encode(), given.encode())
