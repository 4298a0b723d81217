"""Who is asking: the visitor of a public GapLens, carried in a context variable.

Local mode (`python app.py`, the CLI, scripts) has one user who may do everything: no
visitor is set and the store applies no filter. In public mode (`python app.py --public`, the
default on a Hugging Face Space) the app sets the visitor for the duration of each request
(`tabs.common.bind_visitors`); the store then shows and changes only that visitor's runs
(plus the runs the host published, read-only), and host-only actions refuse everyone else.
A public engine with no visitor set acts for an anonymous visitor: it sees published runs only.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass, field

from .errors import NotAllowedError


@dataclass(frozen=True)
class Visitor:
    """`id` keys the visitor's runs (a Gradio session hash or a Hugging Face user name);
    `host` is the operator, who may do everything; `address` is the client address the request
    came from ('' when unknown), which per-address budgets key on (engine/hosting/spending.py)."""

    id: str
    host: bool = False
    address: str = field(default="", compare=False)


ANONYMOUS = Visitor("anonymous")
HOST = Visitor("", host=True)

_VISITOR: contextvars.ContextVar[Visitor | None] = contextvars.ContextVar("gaplens_visitor", default=None)


def current() -> Visitor | None:
    """The visitor of the request being served, or None outside a public app's request."""
    return _VISITOR.get()


@contextlib.contextmanager
def acting_as(visitor: Visitor | None):
    """Serve the enclosed code for `visitor` (restores the previous one afterwards)."""
    token = _VISITOR.set(visitor)
    try:
        yield visitor
    finally:
        _VISITOR.reset(token)


def visitor_for(public: bool) -> Visitor:
    """Whom a store or engine in this mode acts for now: the host in local mode, else the
    current visitor (anonymous when none was set)."""
    if not public:
        return HOST
    return current() or ANONYMOUS


FORWARDED_HOPS = "GAPLENS_FORWARDED_HOPS"   # app.py's --forwarded-hops, for every process serving the app


def forwarded_hops() -> int:
    """How many proxies in front of the app append to X-Forwarded-For and are believed
    (app.py's --forwarded-hops, kept in $GAPLENS_FORWARDED_HOPS): by default 1 on a Hugging Face
    Space ($SPACE_ID set: the Space's proxy), else 0 (the socket peer is the client)."""
    try:
        return max(0, int(os.environ[FORWARDED_HOPS]))
    except (KeyError, ValueError):
        return 1 if os.environ.get("SPACE_ID") else 0


def client_address(peer: str | None, forwarded_for, hops: int) -> str:
    """The address a request came from, decided here for every use (budgets, queue admission, the
    fair queue's HTTP side), with the semantics of Werkzeug's ProxyFix (`x_for`) and uvicorn's
    ProxyHeadersMiddleware: `hops` proxies are trusted, each appending the address it was reached
    from to X-Forwarded-For (`forwarded_for`: a line or the list of the header's lines), so the
    client is the `hops`-th entry from the right of all lines joined in order; with fewer entries,
    or `hops` 0, the socket peer (which uvicorn rewrites only for the proxies a host names in
    FORWARDED_ALLOW_IPS, app.py's --forwarded-allow-ips).

    A client may send lines of its own. A proxy that joins them, or adds its entry at the end,
    leaves the right end to itself; one that appends to the first line leaves a client's later
    line at the right end. So when a request has several lines, the header is believed only if
    the first line alone names the same client: lines that disagree are a client's claims, and
    the peer counts. '' when nothing is known."""
    lines = [forwarded_for] if isinstance(forwarded_for, str) else list(forwarded_for or [])
    if hops > 0 and lines:
        joined = [entry.strip() for entry in ",".join(lines).split(",")]
        first = [entry.strip() for entry in lines[0].split(",")]
        address = joined[-hops] if len(joined) >= hops else ""
        if address and (len(lines) == 1 or (len(first) >= hops and first[-hops] == address)):
            return address[:64]
    return (peer or "")[:64]


def require_host(public: bool, action: str) -> None:
    """Raise NotAllowedError naming `action` unless the current user is the host."""
    if not visitor_for(public).host:
        raise NotAllowedError(f"{action} is for the host of this public GapLens only; visitors cannot do it "
                              f"(run GapLens on your own machine to do everything)")
