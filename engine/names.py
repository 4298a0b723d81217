"""Names that leave the engine: file names made from run ids, and labels without host paths.

Run ids and export stems reach the file system; model labels, data directories and reasons
reach pages, status lines and exported files. Both come from input GapLens does not control
(imported archives, visitors, model paths), so they pass through here.
"""
from __future__ import annotations

import re
import unicodedata

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# an absolute POSIX path inside a longer text (not a URL or ~/...): keep only its last component
_ABSOLUTE = re.compile(r"(?<![\w.~/])(?:~|/)(?:[^\s:,;'\"()<>/]+/)+([^\s:,;'\"()<>/]+)/?")


def safe_stem(text: str, fallback: str = "gaplens", limit: int = 80) -> str:
    """A file-name stem made from `text`: only letters, digits, '.', '_' and '-', no leading
    dot, at most `limit` characters (`fallback` when nothing is left). Never a path."""
    text = unicodedata.normalize("NFKD", str(text)).encode("ascii", "ignore").decode("ascii")
    stem = _UNSAFE.sub("-", text).strip("-.")[:limit].strip("-.")
    return stem or fallback


def short_label(text: str) -> str:
    """`text` with absolute host paths cut to their last component:
    'synthetic_generator:/a/b/synthetic_world.json' -> 'synthetic_generator:synthetic_world.json'."""
    return _ABSOLUTE.sub(lambda m: m.group(1), str(text))
