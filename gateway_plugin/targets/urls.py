"""A URL as Spillway prints it: configs put credentials in URLs (a password in the user part, a token
as the user or in the query), and every message, log line and report shows URLs through here."""

from __future__ import annotations

import urllib.parse

MASK = "***"
_MAX_HOST = 255


def masked_url(url: str) -> str:
    """Scheme, host, port and path; the user part and every query value masked, no fragment."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return MASK
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rpartition('@')[2]}"
    query = "&".join(
        f"{pair.split('=', 1)[0]}={MASK}" if "=" in pair else MASK for pair in parts.query.split("&") if pair
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def origin(url: str, base: str = "") -> str:
    """``scheme://host:port`` of ``url`` (resolved against ``base``), nothing else: no user part,
    path or query. What a message may say of a URL that a server chose."""
    try:
        parts = urllib.parse.urlsplit(urllib.parse.urljoin(base, url))
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return MASK
    host = (parts.hostname or "")[:_MAX_HOST]
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}:{port}" if port else f"{parts.scheme}://{host}"


def not_an_origin(url: str) -> str | None:
    """Why ``url`` cannot be a target's, or None. APISIX sends each request to a target's scheme,
    host and port with the client's own path and query, and the function serves its paths from its
    root: a path or query here would reach the signed warm-up ping alone, and break its signature."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, _ = parts.hostname, parts.port  # reading the port refuses one that is not a number
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https") or not host:
        return "is not an http(s) URL with a host"
    if parts.path not in ("", "/") or parts.query or parts.fragment or url.endswith(("?", "#")):
        return "has a path, query or fragment"
    return None


def redirect_refused(status: int, location: str | None, url: str) -> str:
    """A redirect is followed nowhere: a request signed or credentialed for one origin would be
    re-sent, body and headers, to another. The message says where it pointed, by origin alone."""
    where = f"a redirect to {origin(location, url)}" if location else "a redirect without a Location"
    return f"{masked_url(url)} answered {status}, {where}, not followed"


def url_secrets(url: str) -> set[str]:
    """What ``masked_url`` hides, as written and decoded: to recognise it in text a server sends back."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return {url}
    hidden = parts.netloc.rpartition("@")[0].split(":", 1) if "@" in parts.netloc else []
    hidden += [pair.partition("=")[2] if "=" in pair else pair for pair in parts.query.split("&")]
    decoders = (str, urllib.parse.unquote, urllib.parse.unquote_plus)
    return {text for raw in hidden for decode in decoders if (text := decode(raw))}
