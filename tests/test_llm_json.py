"""ask_json and its validators against canned good and bad LLM replies (no model needed)."""
from __future__ import annotations

import pytest

from engine.backends.llm_json import as_axis_dict, as_string_list, ask_json, extract_json, normalise_key
from engine.common.errors import LLMOutputError


class FakeLLM:
    """Replies from a script, one per call, and records what it was asked."""

    id = "fake-llm"

    def __init__(self, *replies: str):
        self.replies = list(replies)
        self.calls: list[dict] = []

    def chat(self, messages, *, temperature=1.0, max_tokens=1024, seed=0):
        self.calls.append({"messages": [dict(m) for m in messages], "temperature": temperature, "seed": seed})
        return self.replies[min(len(self.calls) - 1, len(self.replies) - 1)]


ASK = [{"role": "user", "content": "Return only a JSON list of 3 strings."}]
AXES = {"gender": ["a photo of a male doctor", "a photo of a female doctor"],
        "age": ["a photo of a young doctor", "a photo of an old doctor"],
        "ethnicity": ["a photo of an Asian doctor", "a photo of a Black doctor"]}


# --- extraction ----------------------------------------------------------------------------------

@pytest.mark.parametrize("reply, expected", [
    ('["a", "b", "c"]', ["a", "b", "c"]),
    ('Sure! Here is the list:\n```json\n["a", "b", "c"]\n```\nHope this helps.', ["a", "b", "c"]),
    ('```\n{"x": [1, 2]}\n```', {"x": [1, 2]}),
    ('Here you go: ["a", "b", "c",]', ["a", "b", "c"]),
    ("['a', 'b', \"c's\"]", ["a", "b", "c's"]),
    ('{"ok": True, "missing": None, "no": False}', {"ok": True, "missing": None, "no": False}),
    ('{"a": [1, 2,], "b": {"c": 3,},}', {"a": [1, 2], "b": {"c": 3}}),
    ('[\n  "one"\n  "two"\n]', ["one", "two"]),                                    # missing commas
    ('{"a": "x", // a comment\n "b": "y"}', {"a": "x", "b": "y"}),
    ('\u201cnot json\u201d then [\u201ca\u201d, \u201cb\u201d]', ["a", "b"]),          # smart quotes
    ('I count [3] options: ["red car", "blue car", "green car"]', ["red car", "blue car", "green car"]),
    ('<think>the user wants [x]</think>["a", "b"]', ["a", "b"]),
    ('["first prompt", "second prompt", "third pro', ["first prompt", "second prompt"]),   # truncated
    ('```json\n{"gender": ["a man", "a woman"], "age": ["a chi', {"gender": ["a man", "a woman"]}),
])
def test_extract_json_repairs(reply, expected):
    assert extract_json(reply) == expected


def test_extract_json_numbered_and_bulleted_lists():
    reply = "Here are three variations:\n1. A nurse at night\n2) **A nurse in the rain**\n3. \"A nurse, smiling\",\n"
    assert as_string_list(3)(extract_json(reply)) == ["A nurse at night", "A nurse in the rain", "A nurse, smiling"]
    assert extract_json("- red\n* blue\n• green") == ["red", "blue", "green"]


def test_extract_json_headings_with_bullets_become_a_dict():
    reply = ("Sure, these are the axes.\n\n**Gender:**\n- a photo of a male doctor\n- a photo of a female doctor\n"
             "### Age\n1. a photo of a young doctor\n2. a photo of an old doctor\n"
             "- Ethnicity:\n  - a photo of an Asian doctor\n  - a photo of a Black doctor\n")
    assert as_axis_dict(3, 2)(extract_json(reply)) == AXES


@pytest.mark.parametrize("reply", ["", "   ", "I cannot help with that.", "The axes are gender and age."])
def test_extract_json_no_json(reply):
    with pytest.raises(ValueError):
        extract_json(reply)


# --- validators ----------------------------------------------------------------------------------

@pytest.mark.parametrize("obj", [
    ["a", "b", "c"],
    {"prompts": ["a", "b", "c"]},
    {"variations": ["a", "b", "c"]},
    {"result": {"prompts": ["a", "b", "c"]}},
    {"anything": ["a", "b", "c"]},
    [{"prompt": "a"}, {"prompt": "b"}, {"text": "c"}],
    ["a", 7, None, "b", "", "  ", "A", "c"],           # non-strings, empties and duplicates dropped
    {"1": "a", "2": "b", "3": "c"},
    [["a", "b"], ["c"]],
    ["1. a", "2. b", '"c"'],
])
def test_as_string_list_shapes(obj):
    assert as_string_list(3)(obj) == ["a", "b", "c"]


def test_as_string_list_bounds_and_word_limit():
    validate = as_string_list(2, 3, max_words=4)
    assert validate(["one two", "three four", "five", "six seven"]) == ["one two", "three four", "five"]
    with pytest.raises(ValueError, match="at least 2 strings, found 1 usable .1 more were longer than 4 words"):
        validate(["short one", "this one is far too long to keep"])
    with pytest.raises(ValueError):
        as_string_list(1)({"axes": {}})


@pytest.mark.parametrize("obj", [
    AXES,
    {"axes": AXES},
    {"prompt": "a photo of a doctor", "biases": AXES},
    {"Biases": AXES},
    {"a photo of a doctor": AXES},
    {"Gender": AXES["gender"], "AGE ": AXES["age"], "Ethnicity": AXES["ethnicity"], "Height": ["a tall doctor"]},
    [{"axis": "gender", "counterfactuals": AXES["gender"]}, {"axis": "age", "counterfactuals": AXES["age"]},
     {"axis": "ethnicity", "counterfactuals": AXES["ethnicity"]}],
    [{"gender": AXES["gender"]}, {"age": AXES["age"]}, {"ethnicity": AXES["ethnicity"]}],
    {"axes": ["gender", "age", "ethnicity"], **AXES},
    {"gender": {"male": AXES["gender"][0], "female": AXES["gender"][1]},
     "age": [{"prompt": p} for p in AXES["age"]], "ethnicity": AXES["ethnicity"] + [3, None]},
    {"gender": AXES["gender"][:1], "Gender": AXES["gender"], "age": AXES["age"], "ethnicity": AXES["ethnicity"]},
])
def test_as_axis_dict_shapes(obj):
    assert as_axis_dict(3, 2)(obj) == AXES


def test_as_axis_dict_normalises_keys():
    obj = {"Gender Bias": ["a", "b"], "Socio-economic status": ["c", "d"], "race/ethnicity": ["e", "f"]}
    assert list(as_axis_dict(3, 2)(obj)) == ["gender_bias", "socio_economic_status", "race_ethnicity"]
    assert normalise_key("  Age  group ") == "age_group"


@pytest.mark.parametrize("obj, reason", [
    ({}, "found 0"),
    ({"axes": {}}, "found 0"),
    ({"gender": ["only one"], "age": ["a", "b"], "race": ["c", "d"]}, "too few counterfactuals in: gender .1."),
    (["a photo of a male doctor", "a photo of a female doctor"], "got a list of 2 items"),
    ("just text", "got str"),
])
def test_as_axis_dict_rejects(obj, reason):
    with pytest.raises(ValueError, match=reason):
        as_axis_dict(3, 2)(obj)


# --- ask_json ------------------------------------------------------------------------------------

def test_ask_json_first_reply_good():
    llm = FakeLLM('```json\n["a", "b", "c"]\n```')
    assert ask_json(llm, ASK, validate=as_string_list(3), seed=7, temperature=0.5) == ["a", "b", "c"]
    assert len(llm.calls) == 1 and llm.calls[0]["seed"] == 7 and llm.calls[0]["temperature"] == 0.5
    assert llm.calls[0]["messages"] == ASK


def test_ask_json_retries_with_reason_and_next_seed():
    llm = FakeLLM("I'd be happy to help, but first: what style?", '["a", "b"]', '["a", "b", "c"]')
    assert ask_json(llm, ASK, validate=as_string_list(3), seed=10, retries=2) == ["a", "b", "c"]
    assert [c["seed"] for c in llm.calls] == [10, 11, 12]
    retry = llm.calls[1]["messages"]
    assert retry[:1] == ASK and retry[1] == {"role": "assistant", "content": llm.replies[0]}
    assert "no JSON found" in retry[2]["content"] and retry[2]["role"] == "user"
    third = llm.calls[2]["messages"]
    assert len(third) == 3 and third[1]["content"] == '["a", "b"]' and "at least 3 strings" in third[2]["content"]


def test_ask_json_gives_up_with_reason_and_reply():
    bad = "The main axes are gender, age and ethnicity; each could be varied in many ways. " * 5
    llm = FakeLLM(bad)
    with pytest.raises(LLMOutputError) as info:
        ask_json(llm, ASK, validate=as_axis_dict(3, 2), retries=1)
    message = str(info.value)
    assert len(llm.calls) == 2
    assert "fake-llm" in message and "2 attempt(s)" in message and "no JSON found" in message
    assert "The main axes are gender, age and ethnicity" in message
    assert len(message) < 400  # the reply is quoted, not dumped


def test_ask_json_empty_axes_then_good():
    llm = FakeLLM('{"axes": {}}', '{"axes": ' + __import__("json").dumps(AXES) + "}")
    assert ask_json(llm, ASK, validate=as_axis_dict(3, 2)) == AXES


def test_ask_json_validator_reason_is_quoted():
    def one_word(obj):
        if not isinstance(obj, list) or any(" " in s for s in obj):
            raise ValueError("every item must be one word")
        return obj

    llm = FakeLLM('["two words"]', '["one"]')
    assert ask_json(llm, ASK, validate=one_word) == ["one"]
    assert "every item must be one word" in llm.calls[1]["messages"][-1]["content"]
