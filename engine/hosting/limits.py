"""Bounds on what one request may ask for, checked before any work starts or anything is stored.

Two layers:

- `check` applies everywhere (CLI, local app, public app): every number of a method's
  request dataclass is range-checked by its field name (seeds 0…2³²−1, `n_boot` 0 where its
  field's metadata "zero_off" says 0 means "no intervals" and otherwise 100…100 000, steps
  and size bounded per preset, every text checked by engine/common/texts.py: at most
  `MAX_TEXT_CHARS`, no NUL, no unpaired surrogate), so bad input is one sentence instead of a
  traceback, and nothing stored is a text the store could not encode or an import would refuse.
- `Budget` applies in public mode (`python app.py --public`): per request, images, steps, size,
  mining generations and mitigation steps (`check_budget`); per hour, images and LLM calls per
  visitor, per client address and for the whole app (engine/hosting/spending.py); storage per visitor
  (engine/hosting/storage.py). A request is charged its method's `Estimate` (the row's
  `estimate` in engine.methods.METHODS): the most images it can generate and its LLM calls.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, is_dataclass, replace
from typing import Callable

from ..common.errors import InputError, OverBudgetError
from ..common.texts import check_texts

SEED_MAX = 2**32 - 1
SEED_FIELDS = ("seed", "image_seed", "llm_seed")
N_BOOT_MIN, N_BOOT_MAX = 100, 100_000
MIN_SIDE = 64

# preset -> (largest steps, largest width/height). Turbo/schnell models are distilled for 1-4 steps.
PRESET_LIMITS = {"sd-turbo": (10, 1024), "sdxl-turbo": (10, 1024), "flux-schnell": (16, 1536),
                 "sd15": (150, 1024)}
DEFAULT_LIMITS = (150, 2048)


@dataclass(frozen=True)
class Estimate:
    """What one request can spend, from its method's `estimate(request, until_cap, proposed)`
    (engine.methods.METHODS): what a public GapLens checks against `Budget` and charges."""

    images: int                 # the most images it can generate (all of its sets)
    llm_calls: int = 0          # LLM calls when every reply is usable (re-asks add to them when made)
    generations: int = 0        # mining iterations (Budget.ga_generations)
    mitigated_axes: int = 0     # axes a mitigation mitigates (Budget.mitigation_steps)


@dataclass
class Budget:
    """What the visitors of a public GapLens may ask for: per request, per hour (per visitor, per
    client address and for the whole app; engine/hosting/spending.py) and in storage (per visitor;
    engine/hosting/storage.py). Defaults are for a Space serving a few dozen visitors an hour."""

    images: int = 64              # images one request may generate (all of its sets)
    steps: int = 50               # denoising steps
    size: int = 1024              # largest width or height
    ga_generations: int = 10      # mining iterations (generations of the genetic algorithm)
    mitigation_steps: int = 4     # axes one mitigation may mitigate
    hourly_images: int = 256      # images per visitor per hour (--hourly-images)
    hourly_llm_calls: int = 200   # LLM calls per visitor per hour, any backend (--hourly-llm-calls)
    visitors_per_address: int = 2  # a client address may spend this many visitors' hourly budgets
    hourly_images_total: int = 4096     # images per hour, all visitors together (--hourly-images-total)
    hourly_llm_calls_total: int = 3200  # LLM calls per hour, all visitors together (--hourly-llm-calls-total)
    storage_mb: int = 512         # each visitor's share of the store: runs, results, images (--visitor-storage-mb)
    hourly_export_mb: int = 1024  # MiB of runs each visitor may export per hour (two shares)
    hourly_export_mb_total: int = 16384


def preset_limits(preset_name: str) -> tuple[int, int]:
    """(largest steps, largest width/height) for a preset ('sd-turbo+custom' counts as 'sd-turbo')."""
    return PRESET_LIMITS.get(preset_name.split("+")[0], DEFAULT_LIMITS)


def _int(value, what: str) -> int:
    if isinstance(value, bool):
        raise InputError(f"{what} must be a whole number, not {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise InputError(f"{what} must be a whole number, not {value!r}")
        return int(value)
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{what} must be a whole number, not {str(value)[:40]!r}") from None


def check_request_texts(request) -> None:
    """InputError (one sentence naming the field) when a text of `request` (a method's request
    dataclass or dict) may not enter (engine/common/texts.py: length, NUL, unpaired surrogates),
    or a list in it is too long or it nests too deeply: checked before anything else looks at
    the request (a method's own checks may look a text up in the store)."""
    fields = asdict(request) if is_dataclass(request) else dict(request)
    for name, value in fields.items():
        check_texts(value, name)


def check(request, preset_name: str) -> None:
    """Raise InputError (one sentence) when a field of `request` (a method's request
    dataclass or dict) is out of range, its texts included (`check_request_texts`). Returns
    None; changes nothing."""
    check_request_texts(request)
    fields = asdict(request) if is_dataclass(request) else dict(request)
    for name, value in fields.items():   # NaN or ±Infinity: never a setting (json lets them through)
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"{name.replace('_', ' ')} must be a finite number; got {value}")
    n = fields.get("n")
    for name in SEED_FIELDS:
        if fields.get(name) is None:
            continue
        seed = _int(fields[name], f"the {name.replace('_', ' ')}")
        last = seed + (max(0, _int(n, "n") - 1) if name in ("seed", "image_seed") and n is not None else 0)
        if not 0 <= seed or last > SEED_MAX:
            raise InputError(f"the {name.replace('_', ' ')} must be between 0 and {SEED_MAX} (2**32 − 1)"
                             + (" including all of its n images' seeds" if last != seed else "") + f"; got {seed}")
    if fields.get("n_boot") is not None:
        n_boot = _int(fields["n_boot"], "n_boot")
        zero_ok = _zero_off(request)
        if not (N_BOOT_MIN <= n_boot <= N_BOOT_MAX or (zero_ok and n_boot == 0)):
            raise InputError(f"n_boot (bootstrap resamples) must be between {N_BOOT_MIN} and {N_BOOT_MAX}"
                             + (" (or 0 for no intervals)" if zero_ok else "") + f"; got {n_boot}")
    if fields.get("cant_tell_below") is not None:
        try:
            threshold = float(fields["cant_tell_below"])
        except (TypeError, ValueError):
            threshold = math.nan
        if not 0.0 <= threshold <= 1.0:   # nan fails too
            raise InputError(f"the \"can't tell\" threshold must be a probability from 0 to 1; got "
                             f"{str(fields['cant_tell_below'])[:40]}")
    max_steps, max_side = preset_limits(preset_name)
    if fields.get("steps") is not None:
        steps = _int(fields["steps"], "steps")
        if not 1 <= steps <= max_steps:
            raise InputError(f"steps must be between 1 and {max_steps} for the preset '{preset_name}'; got {steps}")
    for name in ("width", "height"):
        if fields.get(name) is not None:
            side = _int(fields[name], name)
            if not MIN_SIDE <= side <= max_side or side % 8:
                raise InputError(f"the {name} must be a multiple of 8 between {MIN_SIDE} and {max_side} pixels for "
                                 f"the preset '{preset_name}'; got {side}")
    if fields.get("guidance") is not None:
        try:
            guidance = float(fields["guidance"])
        except (TypeError, ValueError):
            raise InputError(f"guidance must be a number, not {str(fields['guidance'])[:40]!r}") from None
        if not (math.isfinite(guidance) and 0 <= guidance <= 50):
            raise InputError(f"guidance must be between 0 and 50; got {guidance}")


def _zero_off(request) -> bool:
    """Whether the n_boot field of `request` (a dataclass) says 0 means "no intervals"."""
    n_boot = getattr(request, "__dataclass_fields__", {}).get("n_boot")
    return bool(n_boot and n_boot.metadata.get("zero_off"))


def fit_axes(estimate: Callable, request, axes: dict[str, list[str]],
             cap: int) -> tuple[dict[str, list[str]], list[str]]:
    """The LLM's `axes`, in its order, as long as the request's sets stay within `cap` images
    (what a public request with proposed axes was charged; `estimate`: its method's, METHODS),
    and the axes left out."""
    kept: dict[str, list[str]] = {}
    left_out = []
    for axis, cfs in axes.items():
        if estimate(replace(request, axes={**kept, axis: cfs})).images <= cap:
            kept[axis] = cfs
        else:
            left_out.append(axis)
    return kept, left_out


def over_budget(what: str) -> OverBudgetError:
    """The refusal of a public request: what limit it hits, and what to do."""
    return OverBudgetError(f"over budget: {what} on this public GapLens; ask for less, or run GapLens on your "
                           f"own machine for larger audits")


def check_budget(request, budget: Budget, cost: Estimate) -> None:
    """OverBudgetError when `request`, which can spend up to `cost` (its method's estimate),
    exceeds what one request of a public GapLens may ask for (`budget`); the hourly budgets are
    engine/hosting/spending.py's."""
    fields = asdict(request) if is_dataclass(request) else dict(request)
    if fields.get("steps") is not None and _int(fields["steps"], "steps") > budget.steps:
        raise over_budget(f"at most {budget.steps} steps are allowed (asked for {fields['steps']})")
    for name in ("width", "height"):
        if fields.get(name) is not None and _int(fields[name], name) > budget.size:
            raise over_budget(f"images are at most {budget.size} pixels wide and high (asked for {name} "
                              f"{fields[name]})")
    if cost.generations > budget.ga_generations:
        raise over_budget(f"mining runs at most {budget.ga_generations} generations (asked for {cost.generations})")
    if cost.mitigated_axes > budget.mitigation_steps:
        raise over_budget(f"a mitigation may mitigate at most {budget.mitigation_steps} axes (asked for "
                          f"{cost.mitigated_axes})")
    if cost.images > budget.images:
        raise over_budget(f"one request may generate at most {budget.images} images (this one can generate up to "
                          f"{cost.images})")
