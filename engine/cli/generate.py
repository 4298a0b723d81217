"""`python -m engine generate --prompt ... -n 8 [--json]` (or --prompts-file FILE: N images per line)."""
from ..methods.generate import GenerateRequest, read_prompts_file
from .options import method_parser, request_from_args


def add_parser(sub, common_arguments) -> None:
    p = method_parser(sub, common_arguments, "generate", "generate N images for a prompt and store them as a run")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--prompt")
    which.add_argument("--prompts-file", metavar="FILE", help="one prompt per line: N images of each, one run")
    p.set_defaults(make_request=lambda a: request_from_args(
        GenerateRequest, a, prompt=a.prompt or "", prompts=read_prompts_file(a.prompts_file) if a.prompts_file else []))
