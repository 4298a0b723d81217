"""`python -m engine doctor [--preset NAME]`: checks this machine for a real preset (see engine/doctor.py)."""
from __future__ import annotations


def add_parser(sub, common_arguments) -> None:
    p = sub.add_parser("doctor", help="check torch/CUDA, memory, hub access, cached weights, WordNet; self-test")
    p.add_argument("--preset", default="sd-turbo", help="the real preset to check (default sd-turbo)")
    p.add_argument("--gpu-memory", type=float, default=None, metavar="GB", help="plan for this much GPU memory")
    p.add_argument("--no-self-test", action="store_true", help="skip the self-test even when weights are cached")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(method=None, handler=run)


def run(args) -> int:
    import json

    from ..doctor import diagnose, format_table

    checks = diagnose(args.preset, gpu_memory_gb=args.gpu_memory, self_test=not args.no_self_test)
    print(json.dumps([c.__dict__ for c in checks], indent=2) if args.json else format_table(checks))
    return 0 if all(c.status != "fail" for c in checks) else 1
