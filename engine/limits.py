"""Bounds on what one request may ask for, checked before any work starts or anything is stored.

Two layers:

- `check_request` applies everywhere (CLI, local app, public app): every number of a method's
  request dataclass is range-checked by its field name (seeds 0…2³²−1, `n_boot` 0 where the
  method allows "no intervals" and otherwise 100…100 000, steps and size bounded per preset, every
  text at most `MAX_TEXT_CHARS`), so bad input is one sentence instead of a traceback.
- `Budget` applies in public mode (`python app.py --public`): images per request, steps, size,
  mining generations, mitigation steps, and a per-visitor hourly number of images
  (`estimate_images` of each request, recorded on its run as `cost`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, is_dataclass

from .errors import InputError, OverBudgetError

SEED_MAX = 2**32 - 1
SEED_FIELDS = ("seed", "image_seed", "llm_seed")
N_BOOT_MIN, N_BOOT_MAX = 100, 100_000
SET_METHODS = {"counterfactuals", "intersectional", "mitigate"}  # requests of counterfactual image sets
NO_INTERVALS_ALLOWED = SET_METHODS  # their n_boot = 0 means "no intervals"
MAX_TEXT_CHARS = 1000
MAX_LIST_ITEMS = 500
MIN_SIDE = 64

# preset -> (largest steps, largest width/height). Turbo/schnell models are distilled for 1-4 steps.
PRESET_LIMITS = {"sd-turbo": (10, 1024), "sdxl-turbo": (10, 1024), "flux-schnell": (16, 1536),
                 "sd15": (150, 1024)}
DEFAULT_LIMITS = (150, 2048)
MINE_DEFAULT_ITERATIONS = 5  # engine.methods.mine.DEFAULT_ITERATIONS (methods sit above this module)
SETS_GUESS = 13  # sets of a counterfactual request whose axes the LLM will propose (1 + 3 axes × 4)


@dataclass
class Budget:
    """What one visitor of a public GapLens may ask for."""

    images: int = 64              # images one request may generate (all of its sets)
    steps: int = 50               # denoising steps
    size: int = 1024              # largest width or height
    ga_generations: int = 10      # mining iterations (generations of the genetic algorithm)
    mitigation_steps: int = 4     # axes one mitigation may mitigate
    hourly_images: int = 256      # images per visitor per hour


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


def _texts(obj, path: str = "request"):
    """Yield (where, text) for every string in a request, and check list lengths."""
    if isinstance(obj, str):
        yield path, obj
    elif isinstance(obj, dict):
        if len(obj) > MAX_LIST_ITEMS:
            raise InputError(f"{path} has {len(obj)} entries; at most {MAX_LIST_ITEMS} are accepted")
        for k, v in obj.items():
            yield from _texts(str(k), f"{path} key")
            yield from _texts(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        if len(obj) > MAX_LIST_ITEMS:
            raise InputError(f"{path} has {len(obj)} items; at most {MAX_LIST_ITEMS} are accepted")
        for v in obj:
            yield from _texts(v, path)


def check_request(method: str, request, preset_name: str) -> None:
    """Raise InputError (one sentence) when a field of `request` (a method's request
    dataclass or dict) is out of range. Returns None; changes nothing."""
    fields = asdict(request) if is_dataclass(request) else dict(request)
    for where, text in _texts(fields):
        if len(text) > MAX_TEXT_CHARS:
            raise InputError(f"{where.removeprefix('request.')} is {len(text)} characters long; the maximum is "
                             f"{MAX_TEXT_CHARS}")
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
        zero_ok = method in NO_INTERVALS_ALLOWED
        if not (N_BOOT_MIN <= n_boot <= N_BOOT_MAX or (zero_ok and n_boot == 0)):
            raise InputError(f"n_boot (bootstrap resamples) must be between {N_BOOT_MIN} and {N_BOOT_MAX}"
                             + (" (or 0 for no intervals)" if zero_ok else "") + f"; got {n_boot}")
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


def estimate_images(method: str, request) -> int:
    """An upper estimate of the images `request` will generate (what a budget counts)."""
    fields = asdict(request) if is_dataclass(request) else dict(request)
    n = max(1, _int(fields.get("n") or 1, "n"))
    if method == "generate":
        return n * max(1, len(fields.get("prompts") or []))
    if method == "mine":
        iterations = fields.get("iterations") or MINE_DEFAULT_ITERATIONS
        return n * max(1, _int(fields.get("population") or 1, "population")) * _int(iterations, "iterations")
    if method in SET_METHODS:  # counterfactual-set methods: one set per counterfactual prompt + the prompt
        axes = fields.get("axes")
        sets = 1 + sum(len(v) for v in axes.values()) if isinstance(axes, dict) and axes else SETS_GUESS
        sets *= max(1, len(fields.get("fill") or []))
        if method == "mitigate" and not fields.get("preview_only"):
            sets *= 2  # the mitigated prompt sets are generated again
        return n * sets
    return n


def check_budget(method: str, request, budget: Budget, spent_last_hour: int) -> int:
    """The request's estimated images; OverBudgetError when it exceeds `budget` (per request
    or, with what the visitor spent in the last hour, per hour)."""
    fields = asdict(request) if is_dataclass(request) else dict(request)

    def over(what: str) -> OverBudgetError:
        return OverBudgetError(f"over budget: {what} on this public GapLens; ask for less, or run GapLens on your "
                               f"own machine for larger audits")

    if fields.get("steps") is not None and _int(fields["steps"], "steps") > budget.steps:
        raise over(f"at most {budget.steps} steps are allowed (asked for {fields['steps']})")
    for name in ("width", "height"):
        if fields.get(name) is not None and _int(fields[name], name) > budget.size:
            raise over(f"images are at most {budget.size} pixels wide and high (asked for {name} {fields[name]})")
    if method == "mine" and _int(fields.get("iterations") or 0, "iterations") > budget.ga_generations:
        raise over(f"mining runs at most {budget.ga_generations} generations (asked for {fields['iterations']})")
    if method == "mitigate":
        wanted = len(fields.get("mitigate") or []) or len(fields.get("axes") or {}) or 0
        if wanted > budget.mitigation_steps:
            raise over(f"a mitigation may mitigate at most {budget.mitigation_steps} axes (asked for {wanted})")
        if fields.get("export"):
            raise InputError("writing the mitigated prompt set to a file on the server is not available on a "
                             "public GapLens; download it from the Mitigate tab instead")
    cost = estimate_images(method, request)
    if cost > budget.images:
        raise over(f"one request may generate at most {budget.images} images (this one needs up to {cost})")
    if spent_last_hour + cost > budget.hourly_images:
        left = max(0, budget.hourly_images - spent_last_hour)
        raise over(f"each visitor may generate {budget.hourly_images} images per hour; {left} are left this hour "
                   f"and this request needs up to {cost}")
    return cost
