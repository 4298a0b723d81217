"""GapLens engine: backends, store, metrics and methods. Never imports gradio."""

__version__ = "0.1.0"


def __getattr__(name):  # lazy: `from engine import Engine` without importing torch/diffusers early
    if name == "Engine":
        from .core.engine import Engine

        return Engine
    raise AttributeError(name)
