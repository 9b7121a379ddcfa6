"""CORS (the Fetch standard's cross-origin checks) for browsers calling the
gateway: preflight answers and the Allow-Origin header of answers, for the
origins of ``--cors-origins`` only. Closed by default: no origin is allowed,
so a page elsewhere cannot read what the gateway answers. Pure: headers in,
headers out."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from aiohttp import web

#: What a preflight may ask for (the gateway proxies any method).
METHODS = "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"
#: How long a browser may cache a preflight answer (seconds).
MAX_AGE_S = 600


def is_preflight(headers: Mapping[str, str]) -> bool:
    """An OPTIONS request is a CORS preflight when it names an origin and
    the method it asks for."""
    return "Origin" in headers and "Access-Control-Request-Method" in headers


class Cors:
    """The allowed origins (``--cors-origins``: comma-separated, ``*`` for
    any) and the answers they give."""

    def __init__(self, origins: str) -> None:
        listed = {o.strip().rstrip("/") for o in origins.split(",") if o.strip()}
        self.any = "*" in listed
        self.origins = frozenset(listed - {"*"})

    def allowed(self, origin: str) -> bool:
        """Whether a page of origin may read the gateway's answers."""
        return self.any or origin.rstrip("/") in self.origins

    def preflight(self, headers: Mapping[str, str]) -> web.Response:
        """204 allowing the asked method and headers for an allowed origin;
        403 naming the origin otherwise."""
        origin = headers.get("Origin", "")
        if not self.allowed(origin):
            return web.json_response(
                {"error": {"message": f"Origin: {origin[:100]!r} is not allowed (--cors-origins)",
                           "code": 403, "type": "cors"}},
                status=403,
            )  # fmt: skip
        out = web.Response(status=204)
        out.headers["Access-Control-Allow-Methods"] = METHODS
        asked = headers.get("Access-Control-Request-Headers")
        if asked:
            out.headers["Access-Control-Allow-Headers"] = asked[:1024]
        out.headers["Access-Control-Max-Age"] = str(MAX_AGE_S)
        self.decorate(headers, out.headers)
        return out

    def decorate(self, request: Mapping[str, str], answer: MutableMapping[str, str]) -> None:
        """Allow an allowed origin to read this answer (nothing otherwise)."""
        origin = request.get("Origin")
        if origin is not None and self.allowed(origin):
            answer["Access-Control-Allow-Origin"] = origin
            answer["Vary"] = "Origin"
