"""`python -m engine explore --prompt ... [--concepts A B] [--versus C D] [--inverse T ...] [--json]`: without
--json it prints the lean in words (issue 42), as the tab says it."""
from ..methods.explore import lean_sentence
from .options import method_parser


def done_text(done) -> str:
    """The finished step in sentences: the set's lean (or that it has no clear one), the second axis', each
    inverse query's, and the node's id."""
    results = done.results
    prompt = results.get("prompt", "")
    scored = f" (scored from run {results['source_run']})" if results.get("source_run") else ""
    lines = [f"run {done.run_id} done{scored}.",
             (lean_sentence(results.get("lean") or {}, f"The set of '{prompt}'") or "No image was measured") + "."]
    if results.get("versus"):
        lines.append(lean_sentence(results.get("versus_lean") or {}, "On the second axis, the set") + ".")
    for test, lean in (results.get("inverse") or {}).items():
        lines.append(lean_sentence(lean, f"The set of '{test}'") + ".")
    if results.get("excluded"):
        lines.append(f"{results['excluded']} flagged or refused image(s) were left out.")
    return "\n".join(lines)


def add_parser(sub, common_arguments) -> None:
    p = method_parser(sub, common_arguments, "explore",
                      "Place a prompt's images (or a stored run's) on concept strips, with the lean and inverse "
                      "queries.")
    p.set_defaults(done_text=done_text)
