"""Readable Top-K concepts (issue 17): whole phrases, variants merged, shares in [0, 1]."""
from engine.metrics import tibet
from engine.metrics.concepts import phrase_shares, top_phrases, variant_key

CAPTIONS = [
    "a young slim light-skinned female doctor in formal attire working indoors who is serious",
    "a middle-aged slim light-skinned female doctor in formal attire working indoors who is serious",
    "an old average-build light-skinned male doctor in informal attire working outdoors who is happy",
    "an old averagebuild dark-skinned male doctor in informal attire working indoors who is happy",
]
ANSWERS = [["female", "young", "light"], ["female", "middle-aged", "light"], ["male", "old", "light"],
           ["male", "old", "dark"]]


def test_phrases_whole_and_variants_merged():
    shares = phrase_shares(ANSWERS, CAPTIONS, known=["photo", "doctor"])
    # counted by hand: 3 of 4 images are light ("light" answer and "light-skinned" caption are one concept)
    assert shares["light"] == 0.75 and "light-skinned" not in shares
    assert shares["dark"] == 0.25 and "dark-skinned" not in shares
    assert shares["formal attire"] == 0.5 and shares["informal attire"] == 0.5
    assert shares["working indoors"] == 0.75 and shares["working outdoors"] == 0.25
    assert shares["average-build"] == 0.5 and "averagebuild" not in shares
    assert shares["middle-aged"] == 0.25
    for fragment in ("attire", "working", "skin", "middleaged", "averagebuild", "indoors"):
        assert fragment not in shares
    assert all(0.0 <= v <= 1.0 for v in shares.values())


def test_qualifier_words_merge_and_free_text_answers_stay_whole():
    shares = phrase_shares([["light"], ["dark blue"]], ["a man with light skin", "a man with dark blue hair"])
    assert shares == {"man": 1.0, "dark blue": 0.5, "hair": 0.5, "light": 0.5}
    assert variant_key("Light-skinned") == "light" and variant_key("middle aged") == "middleaged"
    assert top_phrases([["yes"], ["no"]], None) == []


def test_tibet_unigram_histogram_unchanged():
    # CAS keeps the released code's unigrams: this is what the published numbers are tested on.
    assert tibet.concept_histogram([["formal attire"]]) == {"attire": 1.0, "formal": 1.0}
