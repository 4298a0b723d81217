"""`python -m engine doctor [--preset NAME]`: is this machine ready for a real preset (engine/tools/doctor.py)?
Prints a pass/fail table with what to do; exits 1 when a check failed."""
from __future__ import annotations


def add_parser(sub, common_arguments) -> None:
    p = sub.add_parser("doctor", help="check torch/CUDA, memory, hub and token, cached weights, WordNet; self-test")
    common_arguments(p)
    p.add_argument("--gpu-memory", type=float, default=None, metavar="GB", help="check the plan for this much GPU memory")
    p.add_argument("--no-self-test", action="store_true", help="skip the self-test even when the weights are cached")
    p.set_defaults(method=None, handler=run)


def run(args) -> int:
    import json

    from ..tools.doctor import diagnose, format_table

    from . import first_vqa

    overrides = {role: getattr(args, role) for role in ("generator", "embedder", "llm")} | {"vqa": first_vqa(args)}
    checks = diagnose(args.preset, gpu_memory_gb=args.gpu_memory, self_test=not args.no_self_test,
                      device=args.device, **overrides)
    print(json.dumps([c.__dict__ for c in checks], indent=2) if args.json else format_table(checks))
    return 0 if all(c.status != "fail" for c in checks) else 1
