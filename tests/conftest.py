"""Test setup: offline, no analytics, a fresh store per test, the synthetic world by default."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture
def data_dir(tmp_path):
    return str(tmp_path / "store")


@pytest.fixture
def engine(data_dir):
    from engine.core.engine import Engine

    return Engine("synthetic", data_dir=data_dir, max_images=256)
