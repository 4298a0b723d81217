"""Errors a user can act on. Every one carries a message that names the problem.

Tabs turn these into `gr.Error`; the CLI prints them and exits with status 2. Anything
else that escapes a method is a bug and is shown with its traceback.
"""


class GapLensError(Exception):
    """Base class: a problem the user can understand and fix."""


class InputError(GapLensError):
    """Bad request: empty or over-long prompt, N above the maximum, unknown option."""


class ModelLoadError(GapLensError):
    """A model id is unknown, unreachable, or failed to load."""


class LLMOutputError(GapLensError):
    """The language model's reply could not be turned into the expected JSON."""


class OutOfMemoryError(GapLensError):
    """The device ran out of memory; fewer images per batch or a smaller model may help."""


class StoreError(GapLensError):
    """The data directory cannot be read or written."""


class NotAllowedError(GapLensError):
    """A visitor of a public GapLens asked for something only the host may do."""


class OverBudgetError(InputError):
    """A request of a public GapLens asks for more work than one request or one visitor's hour allows."""
