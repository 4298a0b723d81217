"""Hourly budgets of a public GapLens that a script cannot reset (issue 27).

Every image a visitor's request can generate is charged before it starts (the most it can
generate: `limits.estimate_images`), and every LLM call a visitor's request makes is charged
when it is made, whatever the backend (the synthetic one included). Charges go to the store's
`charges` ledger, kept apart from the runs: deleting runs, opening a new session or restarting
the app gives nothing back. Each charge is checked against three budgets over the last hour:

- the visitor's (Hugging Face login, else Gradio session): `Budget.hourly_images`,
  `Budget.hourly_llm_calls`;
- their client address's, so a script opening new sessions does not start afresh:
  `Budget.visitors_per_address` times a visitor's;
- the whole app's, every visitor together: `hourly_images_total`, `hourly_llm_calls_total`.

A refusal names the budget it hit and when enough of it frees up (a charge leaves the window an
hour after it was made). The host is never charged; local mode has no budgets.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .access import Visitor
from .limits import Budget, over_budget

WINDOW_S = 3600


@dataclass(frozen=True)
class Scope:
    """One hourly budget: whose charges it sums (a visitor, an address, or everyone's) and its limits."""

    who: str
    images: int
    llm_calls: int
    visitor: str | None = None
    address: str | None = None


def scopes(budget: Budget, visitor: Visitor) -> list[Scope]:
    """The budgets a charge of `visitor` must fit: theirs, their address's (when known), the app's."""
    out = [Scope("each visitor may {verb} {limit} {unit} per hour", budget.hourly_images, budget.hourly_llm_calls,
                 visitor=visitor.id)]
    if visitor.address:
        k = max(1, budget.visitors_per_address)
        out.append(Scope("the visitors from one client address may {verb} {limit} {unit} per hour together",
                         k * budget.hourly_images, k * budget.hourly_llm_calls, address=visitor.address))
    out.append(Scope("all visitors of this GapLens together may {verb} {limit} {unit} per hour",
                     budget.hourly_images_total, budget.hourly_llm_calls_total))
    return out


UNITS = {"images": (1, "generate", "images"), "llm_calls": (2, "make", "LLM calls")}


def charge(store, budget: Budget, visitor: Visitor, *, images: int = 0, llm_calls: int = 0, llm_needed: int = 0,
           what: str = "") -> None:
    """Charge `images` and `llm_calls` to `visitor` (and their address) once they, and
    `llm_needed` LLM calls more (a request's expected calls, charged as they are made), fit
    every hourly budget. OverBudgetError naming the first budget they do not fit and when it
    frees up; nothing is charged then."""
    now = time.time()
    with store.ledger() as ledger:
        for scope in scopes(budget, visitor):
            rows = ledger.charges(now - WINDOW_S, scope.visitor, scope.address)
            for kind, wanted in (("images", images), ("llm_calls", llm_calls + llm_needed)):
                column, verb, unit = UNITS[kind]
                limit = getattr(scope, kind)
                spent = sum(r[column] for r in rows)
                if wanted and spent + wanted > limit:
                    raise over_budget(scope.who.format(verb=verb, limit=limit, unit=unit)
                                      + f"; {max(0, limit - spent)} are left this hour and this request needs up to "
                                        f"{wanted}" + _frees_up(rows, column, spent + wanted - limit, now))
        if images or llm_calls:
            ledger.add(visitor.id, visitor.address, images, llm_calls, what)


def _frees_up(rows: list[tuple[float, int, int]], column: int, excess: int, now: float) -> str:
    """When charges worth `excess` have left the hour window (rows oldest first), as text."""
    freed = 0
    for row in rows:
        freed += row[column]
        if freed >= excess:
            at = row[0] + WINDOW_S
            return (f"; enough frees up at {time.strftime('%H:%M UTC', time.gmtime(at))} "
                    f"(in {max(1, round((at - now) / 60))} min)")
    return " (more than this budget allows in any hour)"


def left(store, budget: Budget, visitor: Visitor) -> dict:
    """What `visitor` may still spend this hour: {"images", "llm_calls"}, the least over their budgets."""
    now = time.time()
    with store.ledger() as ledger:
        out = {}
        for scope in scopes(budget, visitor):
            rows = ledger.charges(now - WINDOW_S, scope.visitor, scope.address)
            for kind in UNITS:
                room = getattr(scope, kind) - sum(r[UNITS[kind][0]] for r in rows)
                out[kind] = min(out.get(kind, room), max(0, room))
    return out
