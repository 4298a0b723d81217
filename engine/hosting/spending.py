"""Hourly budgets of a public GapLens that a script cannot reset (issue 27).

Every image a visitor's request can generate is charged before it starts (the most it can
generate: its METHODS row's estimate), every LLM call a visitor's request makes is charged when it
is made, whatever the backend (the synthetic one included), and every export by the bytes the
exported runs hold. Charges go to the store's
`charges` ledger, kept apart from the runs: deleting runs, opening a new session or restarting
the app gives nothing back. Each charge is checked against three budgets over the last hour:

- the visitor's (Hugging Face login, else Gradio session): `Budget.hourly_images`,
  `hourly_llm_calls`, `hourly_export_mb`;
- their client address's, so a script opening new sessions does not start afresh:
  `Budget.visitors_per_address` times a visitor's;
- the whole app's, every visitor together: `hourly_images_total`, `hourly_llm_calls_total`,
  `hourly_export_mb_total`.

A refusal names the budget it hit and when enough of it frees up (a charge leaves the window an
hour after it was made). The host is never charged; local mode has no budgets.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..common.access import Visitor
from .limits import Budget, over_budget

WINDOW_S = 3600


@dataclass(frozen=True)
class Scope:
    """One hourly budget: whose charges it sums (a visitor, an address, or everyone's) and its
    limits by kind (KINDS)."""

    who: str
    limits: dict
    visitor: str | None = None
    address: str | None = None


# kind -> (its column in Ledger.charges rows, the verb and unit a refusal uses, the unit's size)
KINDS = {"images": (1, "generate", "images", 1), "llm_calls": (2, "make", "LLM calls", 1),
         "export_bytes": (3, "export", "MiB", 2**20)}


def scopes(budget: Budget, visitor: Visitor) -> list[Scope]:
    """The budgets a charge of `visitor` must fit: theirs, their address's (when known), the app's."""
    mine = {"images": budget.hourly_images, "llm_calls": budget.hourly_llm_calls,
            "export_bytes": budget.hourly_export_mb * 2**20}
    out = [Scope("each visitor may {verb} {limit} {unit} per hour", mine, visitor=visitor.id)]
    if visitor.address:
        k = max(1, budget.visitors_per_address)
        out.append(Scope("the visitors from one client address may {verb} {limit} {unit} per hour together",
                         {kind: k * v for kind, v in mine.items()}, address=visitor.address))
    out.append(Scope("all visitors of this GapLens together may {verb} {limit} {unit} per hour",
                     {"images": budget.hourly_images_total, "llm_calls": budget.hourly_llm_calls_total,
                      "export_bytes": budget.hourly_export_mb_total * 2**20}))
    return out


def charge(store, budget: Budget, visitor: Visitor, spend: dict, needed: dict | None = None, what: str = "") -> None:
    """Charge `spend` ({kind: amount}, KINDS) to `visitor` (and their address) once it, and what
    is `needed` besides (a request's expected LLM calls, charged as they are made), fits every
    hourly budget. OverBudgetError naming the first budget it does not fit and when that frees
    up; nothing is charged then."""
    now = time.time()
    with store.ledger() as ledger:
        for scope in scopes(budget, visitor):
            rows = ledger.charges(now - WINDOW_S, scope.visitor, scope.address)
            for kind, (column, verb, unit, size) in KINDS.items():
                wanted, limit = spend.get(kind, 0) + (needed or {}).get(kind, 0), scope.limits[kind]
                spent = sum(r[column] for r in rows)
                if wanted and spent + wanted > limit:
                    raise over_budget(scope.who.format(verb=verb, limit=limit // size, unit=unit)
                                      + f"; {max(0, limit - spent) // size} are left this hour and this request needs "
                                        f"up to {-(-wanted // size)}" + _frees_up(rows, column, spent + wanted - limit, now))
        if any(spend.values()):
            ledger.add(visitor.id, visitor.address, spend, what)


def _frees_up(rows: list[tuple], column: int, excess: int, now: float) -> str:
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
    """What `visitor` may still spend this hour ({kind: amount}), the least over their budgets."""
    now = time.time()
    out: dict = {}
    with store.ledger(write=False) as ledger:
        for scope in scopes(budget, visitor):
            rows = ledger.charges(now - WINDOW_S, scope.visitor, scope.address)
            for kind, (column, *_) in KINDS.items():
                room = max(0, scope.limits[kind] - sum(r[column] for r in rows))
                out[kind] = min(out.get(kind, room), room)
    return out
