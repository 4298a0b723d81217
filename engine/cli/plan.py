"""`python -m engine plan --preset NAME [--gpu-memory GB] [--json]`: what will be resident, evicted
or offloaded, the peak memory, and whether it fits, without downloading any weights."""
from __future__ import annotations

import json


def add_parser(sub, common_arguments) -> None:
    p = sub.add_parser("plan", help="print the memory plan of a preset (no weights are downloaded)")
    p.add_argument("--preset", default="auto", help="sd-turbo, sd15, sdxl-turbo, flux-schnell, ... or auto")
    p.add_argument("--gpu-memory", type=float, default=None, metavar="GB",
                   help="plan for a GPU with this much memory (default: this machine's device)")
    p.add_argument("--online", action="store_true",
                   help="read sizes from the hub's safetensors headers when not cached (default: cache or table)")
    p.add_argument("--no-bf16", action="store_true",
                   help="plan for a GPU without native bf16 (T4, V100): Qwen2-VL models then run in fp32")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(method=None, handler=run)


def run(args) -> int:
    from ..backends.device import default_budget_bytes, DeviceMemory
    from ..models.plan import format_plan, plan
    from ..models.presets import resolve_preset

    preset, _ = resolve_preset(args.preset)
    if args.gpu_memory:
        result = plan(preset, args.gpu_memory, online=args.online, bf16=not args.no_bf16)
    else:
        from ..backends.device import pick_device

        device = pick_device()
        total = DeviceMemory().total_bytes(device)
        result = plan(preset, round(total / 2**30, 1) if total else None,
                      budget_bytes=default_budget_bytes(device), device=device, online=args.online,
                      bf16=not args.no_bf16 and DeviceMemory().native_bf16(device))
    print(json.dumps(result.as_json(), indent=2) if args.json else format_plan(result))
    return 0
