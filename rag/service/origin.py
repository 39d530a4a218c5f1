"""Who may talk to the keyless loopback service: requests addressed to
this machine by name (``Host``) and, from a browser, sent by its own page
(``Origin``, ``Sec-Fetch-Site``).

Without API keys the service trusts everyone who can reach it, which on
loopback is meant to be this machine's user. A web page in a browser can
reach it too: by DNS rebinding (a hostile name resolving to 127.0.0.1, so
``Host`` names the attacker's domain) or by a plain cross-site form post
(``Origin`` is the other site). Both are refused here (issue 27).

Does not: check API keys (``gate`` does) or apply with keys set: a keyed
service is reached through proxies and names of its operator's choosing.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from .settings import is_loopback

SAFE_FETCH_SITES = frozenset({b"same-origin", b"none"})  # "none": typed into the address bar


def _hostname(authority: str) -> str | None:
    """The host of ``host[:port]`` (IPv6 in brackets), lowercased; None if malformed."""
    try:
        parts = urlsplit("//" + authority)
        parts.port  # noqa: B018 - raises ValueError for a bad port
        return (parts.hostname or "").rstrip(".") or None
    except ValueError:
        return None


def _allowed_host(name: str | None, configured: str) -> bool:
    return name is not None and (is_loopback(name) or name == configured.lower().strip("[]"))


def refusal(headers: dict[bytes, bytes], configured_host: str) -> str | None:
    """Why a request to the keyless service must be refused (one line), or
    None: its ``Host`` is not a loopback name or address or the configured
    host, its ``Origin`` is not the same origin, or the browser says it
    comes from another site.

    ``refusal({b"host": b"evil.example"}, "127.0.0.1") -> "Host 'evil.example' ..."``
    """
    raw_host = headers.get(b"host", b"").decode("latin-1").strip()
    # No Host at all is an HTTP/1.0 tool, never a browser (which always sends one).
    if raw_host and not _allowed_host(_hostname(raw_host), configured_host):
        return (f"Host {raw_host[:100]!r} is not this machine: the keyless service answers only requests "
                "addressed to a loopback name (localhost, 127.0.0.1, ::1); set API keys to serve other names")
    origin = headers.get(b"origin")
    if origin is not None:
        text = origin.decode("latin-1").strip()
        parts = urlsplit(text) if "://" in text else None
        same = parts is not None and parts.scheme in ("http", "https") and \
            (parts.netloc or "").lower() == raw_host.lower()
        if not same:
            return (f"Origin {text[:100]!r} is another site: the keyless service answers only its own page "
                    "and clients that send no Origin")
    site = headers.get(b"sec-fetch-site")
    if site is not None and site.strip().lower() not in SAFE_FETCH_SITES:
        return f"a {site.decode('latin-1')[:30]} request from a browser: the keyless service answers only its own page"
    return None
