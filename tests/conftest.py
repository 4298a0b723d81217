"""Test setup: offline, no analytics, a fresh store per test, the synthetic world by default."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items):
    """Browser and real-model tests are slow by definition: `-m "not slow"` leaves them out too."""
    for item in items:
        if item.get_closest_marker("browser") or item.get_closest_marker("real_model"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def data_dir(tmp_path):
    return str(tmp_path / "store")


@pytest.fixture
def engine(data_dir):
    from engine.core.engine import Engine

    return Engine("synthetic", data_dir=data_dir, max_images=256)


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory):
    """One folder per session for tests/tiny_models.py: each tiny model is built there once, on first
    use, and every test loads it back with from_pretrained. Read-only: a test that changes a model's
    files builds its own copy in tmp_path."""
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tiny(tiny_root):
    """Every tiny model (tests/tiny_models.build_all), by role: {"generator": ModelSpec, ...}."""
    from tests import tiny_models

    return tiny_models.build_all(tiny_root)
