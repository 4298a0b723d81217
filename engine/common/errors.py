"""Errors a user can act on. Every one carries a message that names the problem, and a `title`
that says what kind of problem it is.

Tabs turn these into `gr.Error` titled `exc.title`; the CLI prints them and exits with status 2.
Anything else that escapes a method is a bug and is shown with its traceback.
"""


class GapLensError(Exception):
    """Base class: a problem the user can understand and fix."""

    title = "Error"


class InputError(GapLensError):
    """Bad request: empty or over-long prompt, N above the maximum, unknown option."""

    title = "Input error"


class ModelLoadError(GapLensError):
    """A model id is unknown, unreachable, or failed to load."""

    title = "Model load error"


class ApiError(GapLensError):
    """A remote API's call failed in a way the user must act on (server down, bad URL, quota,
    an HTTP 503 mid-run): the API's trouble, not a model that failed to load."""

    title = "API error"


class LLMOutputError(GapLensError):
    """The language model's reply could not be turned into the expected JSON."""

    title = "LLM output error"


class OutOfMemoryError(GapLensError):
    """The device ran out of memory; fewer images per batch or a smaller model may help."""

    title = "Out of memory"


class StoreError(GapLensError):
    """The data directory cannot be read or written."""

    title = "Store error"


class NotAllowedError(GapLensError):
    """A visitor of a public GapLens asked for something only the host may do."""

    title = "Not allowed"


class OverBudgetError(InputError):
    """A request of a public GapLens asks for more work than one request or one visitor's hour allows."""

    title = "Over budget"
