"""Bounds on what one request may ask for, checked before any work starts or anything is stored.

Two layers:

- `check` applies everywhere (CLI, local app, public app): every number of a method's
  request dataclass is range-checked by its field name (seeds 0…2³²−1, `n_boot` 0 where the
  method allows "no intervals" and otherwise 100…100 000, steps and size bounded per preset, every
  text at most `MAX_TEXT_CHARS`), so bad input is one sentence instead of a traceback.
- `Budget` applies in public mode (`python app.py --public`): per request, images, steps, size,
  mining generations and mitigation steps (`check_budget`); per hour, images and LLM calls per
  visitor, per client address and for the whole app (engine/hosting/spending.py); storage per visitor
  (engine/hosting/storage.py). A request is charged `max_images`, the most it can generate.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, is_dataclass

from ..common.errors import InputError, OverBudgetError

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
PROPOSE_CALLS = 3  # TIBET's three-turn axes proposal (engine.methods.cfsets.propose_axes)


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


def check_text(text: str | None, what: str) -> None:
    """InputError when `text` (a search, a name typed in a box) is longer than MAX_TEXT_CHARS."""
    if text is not None and len(text) > MAX_TEXT_CHARS:
        raise InputError(f"the {what} is {len(text)} characters long; the maximum is {MAX_TEXT_CHARS}")


def check(method: str, request, preset_name: str) -> None:
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


def estimate_images(method: str, request, *, until_cap: int | None = None, proposed: int | None = None) -> int:
    """The most images `request` can generate (what a budget charges). `until_cap`: the largest
    N a Single Prompt's `until_half_width` may grow its set to (None: it is not counted);
    `proposed`: the images a request whose axes the LLM proposes is held to (its sets are cut to
    fit, `fit_axes`; None: SETS_GUESS sets, a guess)."""
    fields = asdict(request) if is_dataclass(request) else dict(request)
    n = max(1, _int(fields.get("n") or 1, "n"))
    if method == "generate":
        return n * max(1, len(fields.get("prompts") or []))
    if method == "single_prompt":
        return max(n, until_cap or 0) if fields.get("until_half_width") else n
    if method == "mine":
        iterations = fields.get("iterations") or MINE_DEFAULT_ITERATIONS
        return n * max(1, _int(fields.get("population") or 1, "population")) * _int(iterations, "iterations")
    if method == "compare_models":
        child = dict(fields.get("request") or {})
        if fields.get("method") != "single_prompt" and not child.get("axes") and proposed is not None:
            return proposed  # every model's sets are cut to proposed // models
        models = len({str(g).strip() for g in fields.get("generators") or [] if str(g).strip()})
        return max(1, models) * estimate_images(str(fields.get("method")), child, until_cap=until_cap)
    if method in SET_METHODS:  # one set per counterfactual prompt + the prompt, per fill value
        axes = fields.get("axes")
        if not (isinstance(axes, dict) and axes):
            return proposed if proposed is not None else n * SETS_GUESS * max(1, len(fields.get("fill") or []))
        per_prompt = _mitigate_sets(fields, axes) if method == "mitigate" else 1 + sum(len(v) for v in axes.values())
        return n * per_prompt * max(1, len(fields.get("fill") or []))
    return n


def _axis(name) -> str:  # engine.methods.cfsets.axis_name (methods sit above this module)
    return " ".join(str(name).replace("_", " ").split()).lower()


def _mitigate_sets(fields: dict, axes: dict) -> int:
    """Sets of N images a mitigation can make (engine/methods/mitigate.py): the prompt set of the
    initial state and of every step (N images each in all), and per InterMit step the
    counterfactual sets of every remaining candidate axis (N images per counterfactual). A step
    mitigates a target (B*) when there is one, any axis otherwise; the baseline ('all') makes no
    matrix; a preview one matrix."""
    select = {_axis(a) for a in fields.get("select") or []}
    sizes = {_axis(a): len(v) for a, v in axes.items() if not select or _axis(a) in select}
    if not sizes:
        return 1
    named = {_axis(a) for a in fields.get("mitigate") or []} or \
        {_axis(a) for a, w in (fields.get("priorities") or {}).items() if _positive(w)} or set(sizes)
    if fields.get("strategy") == "all":
        return 1 + len(named)
    candidates = sum(sizes.values()) if len(named) > 1 else max(sizes.values())
    if fields.get("preview_only"):
        return 1 + candidates
    steps = len(sizes) if len(named) > 1 else 1
    return (1 + steps) + steps * candidates


def _positive(value) -> bool:
    try:
        return float(value) > 0
    except (TypeError, ValueError):
        return False


def fit_axes(method: str, request, axes: dict[str, list[str]], cap: int) -> tuple[dict[str, list[str]], list[str]]:
    """The LLM's `axes`, in its order, as long as the request's sets stay within `cap` images
    (what a public request with proposed axes was charged), and the axes left out."""
    fields = asdict(request) if is_dataclass(request) else dict(request)
    kept: dict[str, list[str]] = {}
    left_out = []
    for axis, cfs in axes.items():
        if estimate_images(method, {**fields, "axes": {**kept, axis: cfs}}) <= cap:
            kept[axis] = cfs
        else:
            left_out.append(axis)
    return kept, left_out


def estimate_llm_calls(method: str, request) -> int:
    """The LLM calls `request` implies when every reply is usable (re-asks add to them): checked
    up front against the hourly LLM budgets; each call is charged when it is made."""
    fields = asdict(request) if is_dataclass(request) else dict(request)
    if method == "single_prompt":
        return 1 if fields.get("gap", True) else 0
    if method == "mine":
        if fields.get("strategy") == "source":
            return 0
        iterations = _int(fields.get("iterations") or MINE_DEFAULT_ITERATIONS, "iterations")
        population = max(1, _int(fields.get("population") or 1, "population"))
        select = _int(fields.get("select") or 0, "select") if fields.get("strategy", "ga") == "ga" else 0
        return iterations * (population + 1 + select)   # a variation call per prompt, the population calls
    if method == "compare_models":
        child_method, child = str(fields.get("method")), dict(fields.get("request") or {})
        models = len({str(g).strip() for g in fields.get("generators") or [] if str(g).strip()})
        each = estimate_llm_calls(child_method, child)
        once = PROPOSE_CALLS if child_method in SET_METHODS and not child.get("axes") else 0  # proposed once
        return once + max(1, models) * (each - once)
    if method in SET_METHODS:
        axes = fields.get("axes")
        questions = len(axes) if method != "counterfactuals" and isinstance(axes, dict) else 0
        return (0 if isinstance(axes, dict) and axes else PROPOSE_CALLS) + questions
    return 0


def over_budget(what: str) -> OverBudgetError:
    """The refusal of a public request: what limit it hits, and what to do."""
    return OverBudgetError(f"over budget: {what} on this public GapLens; ask for less, or run GapLens on your "
                           f"own machine for larger audits")


def check_budget(method: str, request, budget: Budget, cost: int) -> None:
    """OverBudgetError when `request`, which can generate up to `cost` images, exceeds what one
    request of a public GapLens may ask for (`budget`); the hourly budgets are engine/hosting/spending.py's."""
    fields = asdict(request) if is_dataclass(request) else dict(request)
    if fields.get("steps") is not None and _int(fields["steps"], "steps") > budget.steps:
        raise over_budget(f"at most {budget.steps} steps are allowed (asked for {fields['steps']})")
    for name in ("width", "height"):
        if fields.get(name) is not None and _int(fields[name], name) > budget.size:
            raise over_budget(f"images are at most {budget.size} pixels wide and high (asked for {name} "
                              f"{fields[name]})")
    if method == "mine" and _int(fields.get("iterations") or 0, "iterations") > budget.ga_generations:
        raise over_budget(f"mining runs at most {budget.ga_generations} generations (asked for "
                          f"{fields['iterations']})")
    if method == "mitigate":
        wanted = len(fields.get("mitigate") or []) or len(fields.get("axes") or {}) or 0
        if wanted > budget.mitigation_steps:
            raise over_budget(f"a mitigation may mitigate at most {budget.mitigation_steps} axes (asked for {wanted})")
        if fields.get("export"):
            raise InputError("writing the mitigated prompt set to a file on the server is not available on a "
                             "public GapLens; download it from the Mitigate tab instead")
    if cost > budget.images:
        raise over_budget(f"one request may generate at most {budget.images} images (this one can generate up to "
                          f"{cost})")
