"""`python -m engine languages --prompt P --languages en de fr ... [--translation CODE=TEXT ...] -n N
--axes ... [--json]`, or `--prompt-set magbig-direct [--occupations ...]` instead of --prompt."""
from ..common.errors import InputError
from ..methods.languages import LanguagesRequest
from .options import method_parser, request_from_args


def parse_translations(items) -> dict[str, str]:
    """{code: text} of CODE=TEXT items; InputError for an item without '='."""
    translations = {}
    for item in items or []:
        code, sep, text = str(item).partition("=")
        if not sep or not code.strip() or not text.strip():
            raise InputError(f"--translation '{item}' must look like CODE=TEXT, e.g. de=\"ein Foto von einem Arzt\"")
        translations[code.strip().lower()] = text.strip()
    return translations


def make_request(a) -> LanguagesRequest:
    return request_from_args(LanguagesRequest, a, translations=parse_translations(a.translation))


def add_parser(sub, common_arguments) -> None:
    p = method_parser(sub, common_arguments, "languages", "the same prompt in several languages on the same seeds: "
                      "each language's shares, their differences from the first, MAGBIG's metrics",
                      epilog="A language's prompt comes from --translation, else MAGBIG's prompt sets, else the LLM "
                             "(translated back into the first language beside it).")
    p.add_argument("--translation", action="extend", nargs="+", default=[], metavar="CODE=TEXT",
                   help="a language's prompt as you wrote it, e.g. --translation de=\"ein Foto von einem Arzt\" "
                        "(repeatable; wins over prompt sets and the LLM)")
    p.set_defaults(make_request=make_request)
