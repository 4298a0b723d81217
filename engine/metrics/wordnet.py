"""Synonyms from a WordNet 3.0 database directory, read directly (no NLTK download).

TIBET merges synonymous concepts with WordNet (thesis Alg. 3; docs/spec/thesis-tibet-biasconnect-intermit.md
§2.16). Debian's `wordnet-base` package installs the database under /usr/share/wordnet: `index.<pos>` maps
a lemma to synset byte offsets, `data.<pos>` holds one synset per line at that offset,
`<pos>.exc` lists irregular inflections. NLTK's reader refuses paths outside its data
directories, so this module parses the files itself (format: wndb(5WN)).

The synonyms of a word are the lemma names of every synset of every base form of the word
(all parts of speech), as `{l.name() for s in wordnet.synsets(w) for l in s.lemmas()}` in
NLTK, lower-cased, multi-word lemmas left out (concepts are single words).

`released_synonyms` is the released TIBET code's `get_syn` exactly (reference mode): NLTK's
morphy, which takes a word found in an exception list (`men`, `bed`, `axes`) to its listed
base forms only, and the lemma names as they are, the word itself only when it is one.
"""
from __future__ import annotations

import functools
import os
import re
import warnings

URL = "https://wordnet.princeton.edu/"
CITATION = """\
@article{miller1995wordnet,
  title={WordNet: A Lexical Database for English},
  author={Miller, George A.},
  journal={Communications of the ACM},
  volume={38},
  number={11},
  pages={39--41},
  year={1995}
}
"""

DEFAULT_WORDNET_DIR = "/usr/share/wordnet"

_POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
# WordNet's detachment rules (morphy(7WN)): (suffix, replacement) per part of speech
_SUFFIX_RULES = {
    "n": (("s", ""), ("ses", "s"), ("ves", "f"), ("xes", "x"), ("zes", "z"), ("ches", "ch"),
          ("shes", "sh"), ("men", "man"), ("ies", "y")),
    "v": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"),
          ("ing", "")),
    "a": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
    "r": (),
}
# The released TIBET code adds these two pairs by hand (spec §2.16).
MANUAL_SYNONYMS = {"male": {"man"}, "female": {"woman"}}


class WordNet:
    """Read-only access to a WordNet database directory."""

    def __init__(self, root: str = DEFAULT_WORDNET_DIR):
        missing = [f"{kind}.{name}" for name in _POS_FILES.values() for kind in ("index", "data")
                   if not os.path.isfile(os.path.join(root, f"{kind}.{name}"))]
        if missing:
            raise FileNotFoundError(f"no WordNet database in {root!r}: missing {', '.join(missing)}")
        self.root = root
        self._indexes: dict[str, dict[str, list[int]]] = {}
        self._exceptions: dict[str, dict[str, list[str]]] = {}

    def _index(self, pos: str) -> dict[str, list[int]]:
        if pos not in self._indexes:
            index = {}
            with open(os.path.join(self.root, f"index.{_POS_FILES[pos]}"), encoding="utf-8") as f:
                for line in f:
                    if line.startswith(" "):  # licence header
                        continue
                    fields = line.split()
                    n_synsets = int(fields[2])
                    index[fields[0]] = [int(offset) for offset in fields[-n_synsets:]]
            self._indexes[pos] = index
        return self._indexes[pos]

    def _exception_forms(self, pos: str) -> dict[str, list[str]]:
        if pos not in self._exceptions:
            exceptions = {}
            path = os.path.join(self.root, f"{_POS_FILES[pos]}.exc")
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    for line in f:
                        inflected, *bases = line.split()
                        exceptions[inflected] = bases
            self._exceptions[pos] = exceptions
        return self._exceptions[pos]

    def base_forms(self, word: str, pos: str, nltk_morphy: bool = False) -> list[str]:
        """Return the forms of `word` that are lemmas of `pos` (WordNet's morphy, one rule pass).

        `nltk_morphy`: as NLTK's `WordNetCorpusReader._morphy` (3.9), where a word with an
        entry in the exception list gets only its listed forms, no suffix rule ("bed" stays
        "bed"; without it the verb rule also gives "be").
        """
        index = self._index(pos)
        exceptions = self._exception_forms(pos).get(word)
        candidates = [word, *(exceptions or [])]
        if not (nltk_morphy and exceptions is not None):
            candidates += [word[: -len(suffix)] + replacement
                           for suffix, replacement in _SUFFIX_RULES[pos] if word.endswith(suffix)]
        return list(dict.fromkeys(form for form in candidates if form in index))

    def nltk_lemma_names(self, word: str) -> set[str]:
        """Return `{l.name().lower() for s in nltk wordnet.synsets(word) for l in s.lemmas()}`:
        NLTK's morphy (`base_forms(..., nltk_morphy=True)`), multi-word names kept, `word`
        itself only when it is a lemma of one of the synsets."""
        word = word.lower()
        return {name for pos in _POS_FILES for form in self.base_forms(word, pos, nltk_morphy=True)
                for offset in self._index(pos)[form] for name in self._lemma_names(pos, offset)}

    @functools.lru_cache(maxsize=65536)
    def _lemma_names(self, pos: str, offset: int) -> tuple[str, ...]:
        with open(os.path.join(self.root, f"data.{_POS_FILES[pos]}"), "rb") as f:
            f.seek(offset)
            fields = f.readline().decode("utf-8").split()
        n_words = int(fields[3], 16)
        words = fields[4: 4 + 2 * n_words: 2]
        # adjectives may carry a syntactic marker: "galore(ip)"
        return tuple(re.sub(r"\(.*\)$", "", w).lower() for w in words)

    def synonyms(self, word: str) -> set[str]:
        """Return the single-word lemma names of all synsets of `word`, `word` included."""
        word = word.lower()
        names = {word}
        for pos in _POS_FILES:
            for form in self.base_forms(word, pos):
                for offset in self._index(pos)[form]:
                    names.update(name for name in self._lemma_names(pos, offset) if "_" not in name)
        return names


@functools.lru_cache(maxsize=4)
def load_wordnet(root: str = DEFAULT_WORDNET_DIR) -> WordNet | None:
    """Return the WordNet database at `root`, or None (with a warning) when it is absent."""
    try:
        return WordNet(root)
    except FileNotFoundError as error:
        warnings.warn(f"{error}; synonyms are not merged (install Debian's wordnet-base)", stacklevel=2)
        return None


def missing_note(root: str = DEFAULT_WORDNET_DIR) -> str:
    """Returns "" when the WordNet database at `root` is there, else the sentence a user needs
    beside the "merge synonyms" option (without it only male→man and female→woman merge)."""
    try:
        WordNet(root)
        return ""
    except FileNotFoundError:
        return (f"WordNet is not installed (no database in {root}): only male/man and female/woman are merged. "
                "Install Debian's wordnet-base (apt-get install wordnet-base) and restart to merge synonyms.")


def wordnet_synonyms(word: str, root: str = DEFAULT_WORDNET_DIR) -> set[str]:
    """Return WordNet synonyms of `word` plus TIBET's manual pairs (male→man, female→woman).

    Without a database only `word` and the manual pairs are returned (a warning is issued
    once), so synonym merging degrades to a near no-op instead of failing.
    """
    word = word.lower()
    database = load_wordnet(root)
    names = database.synonyms(word) if database is not None else {word}
    return names | MANUAL_SYNONYMS.get(word, set())


@functools.lru_cache(maxsize=65536)
def released_synonyms(word: str, root: str = DEFAULT_WORDNET_DIR) -> frozenset[str]:
    """Return the released TIBET code's synonyms of `word` (tibet/metrics/concept_matching.py
    L6-20, `get_syn`): every lemma name of every NLTK `wordnet.synsets(word)`, lower-cased,
    multi-word names included, plus "man" for "male" and "woman" for "female" (only those
    exact words, not lower-cased first). `word` is in it only when it is a lemma ("men" is
    not). Without a database: the manual pair only (a warning is issued once).
    """
    database = load_wordnet(root)
    names = database.nltk_lemma_names(word) if database is not None else set()
    return frozenset(names | MANUAL_SYNONYMS.get(word, set()))
