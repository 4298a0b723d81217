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


def client_address(peer: str | None, forwarded_for, behind_proxy: bool) -> str:
    """The address a request came from, decided here for every use (budgets, queue admission, the
    fair queue's HTTP side): behind a proxy that appends the client's address to X-Forwarded-For (a
    Hugging Face Space's), the last entry of all of that header's lines joined (`forwarded_for`: a
    line or the list of lines; a client may send lines of its own, but the proxy's entry comes
    last); otherwise the socket peer (which uvicorn rewrites only for the proxies a host names in
    FORWARDED_ALLOW_IPS, app.py's --forwarded-allow-ips). '' when neither is known."""
    if behind_proxy and forwarded_for:
        lines = [forwarded_for] if isinstance(forwarded_for, str) else list(forwarded_for)
        last = ",".join(lines).split(",")[-1].strip()
        if last:
            return last[:64]
    return (peer or "")[:64]


def require_host(public: bool, action: str) -> None:
    """Raise NotAllowedError naming `action` unless the current user is the host."""
    if not visitor_for(public).host:
        raise NotAllowedError(f"{action} is for the host of this public GapLens only; visitors cannot do it "
                              f"(run GapLens on your own machine to do everything)")
