"""The model manager: load once, LRU eviction under a memory budget, one lock per model, unload."""
import threading

import pytest

from engine.models import manager as models_module
from engine.backends.base import ModelSpec
from engine.models.manager import ModelManager


class FakeBackend:
    def __init__(self, spec):
        self.spec, self.closed, self.active, self.max_active = spec, False, 0, 0

    def memory_bytes(self):
        return self.spec.options["bytes"]

    def close(self):
        self.closed = True


@pytest.fixture
def loads(monkeypatch):
    calls = []

    def fake_load(spec, device="cpu", **context):
        calls.append(spec.model)
        return FakeBackend(spec)

    monkeypatch.setattr(models_module, "load_backend", fake_load)
    return calls


def spec(name, mb):
    return ModelSpec("fake", name, {"bytes": mb * 2**20})


@pytest.mark.slow
def test_loads_once_and_evicts_least_recently_used_under_budget(loads):
    manager = ModelManager("cpu", budget_bytes=250 * 2**20)
    a = manager.get(spec("a", 100))
    assert manager.get(spec("a", 100)) is a and loads == ["a"]
    manager.get(spec("b", 100))
    manager.get(spec("a", 100))          # a is now the most recently used
    manager.get(spec("c", 100))          # over budget: b goes, a stays
    assert [m["model"] for m in manager.loaded()] == ["fake:a", "fake:c"]
    assert loads == ["a", "b", "c"]
    gone = manager.unload()
    assert sorted(gone) == ["fake:a", "fake:c"] and a.closed and manager.loaded() == []


def test_a_busy_model_is_never_evicted(loads):
    manager = ModelManager("cpu", budget_bytes=150 * 2**20)
    with manager.use(spec("a", 100)):
        manager.get(spec("b", 100))      # a is in use: stay over budget rather than pull it away
        assert len(manager.loaded()) == 2


def test_one_call_at_a_time_per_model(loads):
    manager = ModelManager("cpu")
    first_in, release, second_in = threading.Event(), threading.Event(), threading.Event()

    def first():
        with manager.use(spec("a", 1)):
            first_in.set()
            release.wait(30)

    def second():
        with manager.use(spec("a", 1)):
            second_in.set()

    a = threading.Thread(target=first)
    a.start()
    assert first_in.wait(30)
    b = threading.Thread(target=second)
    b.start()
    assert not second_in.wait(0.3)   # blocked while the first call holds the model
    release.set()
    assert second_in.wait(30)        # and let in as soon as it is released
    a.join(), b.join()
