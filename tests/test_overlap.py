"""Evaluation overlaps generation: the VQA of batch k runs while batch k+1 generates, on another thread,
and the results and cache keys are exactly those of the sequential run."""
import threading

from engine.core.engine import Engine
from engine.common.events import Done
from engine.methods.single_prompt import SinglePromptRequest, run as single_prompt

REQUEST = dict(prompt="a photo of a doctor", n=12, gap=False, n_boot=100)


def results(engine):
    done = [e for e in single_prompt(SinglePromptRequest(**REQUEST), engine) if isinstance(e, Done)][0]
    answers = sorted(tuple(r) for r in engine.store._read("SELECT key, answer FROM answers"))
    return done.results, answers


def test_vqa_of_one_batch_runs_while_the_next_batch_generates(data_dir):
    engine = Engine("synthetic", data_dir=data_dir)
    assert not engine.overlap_evaluation        # default: only on a GPU, where it pays
    engine.overlap_evaluation = True
    gen = engine.models.get(engine.preset.generator)
    vqa = engine.models.get(engine.preset.vqa)
    gen.batch_size = 4
    vqa_started, waited, calls = threading.Event(), [], []
    real_generate, real_answer, real_classes = gen.generate, vqa.answer, vqa.answer_classes
    real_questions = vqa.answer_questions

    def generate(prompt, seeds, settings):
        if len(calls) == 1:
            # batch 2 does not finish until the VQA of batch 1 has started: only another thread can start it
            waited.append(vqa_started.wait(30))
        calls.append(len(seeds))
        return real_generate(prompt, seeds, settings)

    def answer(images, question, choices=None):
        vqa_started.set()
        return real_answer(images, question, choices)

    def answer_classes(images, question, choices):   # questions with classes are scored (issue 35)
        vqa_started.set()
        return real_classes(images, question, choices)

    def answer_questions(images, asks):   # every closed-set question of a batch at once (issue 46)
        vqa_started.set()
        return real_questions(images, asks)

    gen.generate, vqa.answer, vqa.answer_classes = generate, answer, answer_classes   # these instances only
    vqa.answer_questions = answer_questions
    overlapped, overlapped_answers = results(engine)
    assert waited == [True]

    sequential = Engine("synthetic", data_dir=data_dir + "-seq")
    sequential.overlap_evaluation = False
    plain, plain_answers = results(sequential)
    assert overlapped_answers == plain_answers        # same cache keys, same answers
    for key in ("axes", "diversity", "top_concepts", "captions", "answers"):
        assert overlapped[key] == plain[key]
    assert engine.stats.answers_computed == sequential.stats.answers_computed  # nothing computed twice


def test_counterfactual_sets_give_the_same_results_with_and_without_overlap(data_dir):
    import json

    from engine.methods.counterfactuals import CounterfactualsRequest, run as counterfactuals

    request = CounterfactualsRequest("a photo of a doctor", axes={"gender": ["a photo of a female doctor"]},
                                     n=8, n_boot=100)
    out = []
    for overlap in (True, False):
        engine = Engine("synthetic", data_dir=f"{data_dir}-{overlap}")
        engine.models.get(engine.preset.generator).batch_size = 4
        engine.overlap_evaluation = overlap
        done = [e for e in counterfactuals(request, engine) if isinstance(e, Done)][0]
        text = json.dumps(done.results, sort_keys=True, default=str).replace(str(engine.store.data_dir), "STORE")
        out.append((text, engine.stats.answers_computed))
    assert out[0] == out[1]
