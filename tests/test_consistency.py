"""Issue 24: one check of N, with one message, for every method (a bad N leaves no run); the store's
one chunked `IN (...)` helper."""
import numpy as np
import pytest

from engine.common.errors import InputError
from engine.methods import METHODS
from engine.store.schema import MAX_IN_VALUES, in_chunks
from engine.store.store import Store, content_key

# a valid request of every method with an image count, but for N
REQUESTS = {
    "single_prompt": dict(prompt="a photo of a doctor", gap=False),
    "generate": dict(prompt="a photo of a doctor"),
    "counterfactuals": dict(prompt="a photo of a doctor", axes={"gender": ["a photo of a male doctor",
                                                                           "a photo of a female doctor"]}),
    "intersectional": dict(prompt="a photo of a doctor", axes={"gender": ["a photo of a male doctor",
                                                                          "a photo of a female doctor"]}),
    "mine": dict(),
    "mitigate": dict(prompt="a photo of a doctor", axes={"gender": ["a photo of a male doctor",
                                                                    "a photo of a female doctor"]}),
}


@pytest.mark.parametrize("method", sorted(REQUESTS))
@pytest.mark.parametrize("n, words", [(2.5, "the number of images must be a whole number, not 2.5"),
                                      (True, "the number of images must be a whole number, not True"),
                                      ("many", "the number of images must be a whole number, not 'many'"),
                                      (0, "the number of images must be at least 1 (got 0)"),
                                      (10**6, "the number of images is 1000000, above this server's maximum of 256")])
def test_a_bad_n_gets_one_sentence_from_every_method_and_leaves_no_run(engine, method, n, words):
    row = METHODS[method]
    request = row.request(**REQUESTS[method], n=n)
    with pytest.raises(InputError) as raised:
        list(row.run(request, engine))
    assert str(raised.value).startswith(words)
    with pytest.raises(InputError) as checked:         # what a tab checks before the run streams
        row.run.preflight(request, engine)
    assert str(checked.value) == str(raised.value)
    assert engine.store.list_runs() == []


def test_a_whole_float_n_is_that_number(engine):
    assert engine.check_n(4.0) == 4 and engine.check_n("4") == 4


def test_the_store_reads_more_keys_than_sqlite_binds_in_one_statement(tmp_path):
    keys = [content_key("text-embedding", "e", i) for i in range(3 * MAX_IN_VALUES + 1)]
    assert [len(chunk) for _, chunk in in_chunks(keys)] == [MAX_IN_VALUES] * 3 + [1]
    store = Store(tmp_path)
    store.put_embeddings([(k, f"text {i}", "e", np.full(2, i, np.float32)) for i, k in enumerate(keys)])
    found = store.get_embeddings(keys)
    assert len(found) == len(keys) and found[keys[-1]].tolist() == [len(keys) - 1] * 2
    assert len(store.embedding_rows([f"text {i}" for i in range(len(keys))])) == len(keys)
