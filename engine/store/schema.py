"""The store's database: its tables (and the columns added to older stores when they are
opened), its indexes, the sizes it accepts, and `in_chunks`, the one way to bind many values
in an `IN (...)` clause under SQLite's limit on bound variables."""
from __future__ import annotations

from typing import Iterator, Sequence

SCHEMA = """
CREATE TABLE IF NOT EXISTS images (
    key TEXT PRIMARY KEY,
    generator TEXT NOT NULL, prompt TEXT NOT NULL, negative_prompt TEXT NOT NULL,
    seed INTEGER NOT NULL, steps INTEGER NOT NULL, guidance REAL NOT NULL,
    width INTEGER NOT NULL, height INTEGER NOT NULL, scheduler TEXT NOT NULL,
    path TEXT NOT NULL, sha256 TEXT NOT NULL, nsfw INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS embeddings (
    key TEXT PRIMARY KEY, subject TEXT NOT NULL, evaluator TEXT NOT NULL,
    dim INTEGER NOT NULL, vector BLOB NOT NULL, created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS answers (
    key TEXT PRIMARY KEY, image_key TEXT NOT NULL, evaluator TEXT NOT NULL,
    question TEXT NOT NULL, choices TEXT NOT NULL, answer TEXT NOT NULL, created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS answers_by_image ON answers(image_key);
CREATE TABLE IF NOT EXISTS llm_replies (
    key TEXT PRIMARY KEY, model TEXT NOT NULL, request TEXT NOT NULL,
    reply TEXT NOT NULL, created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, method TEXT NOT NULL, status TEXT NOT NULL,
    request TEXT NOT NULL, results TEXT NOT NULL DEFAULT '{}', summary TEXT NOT NULL DEFAULT '{}',
    models TEXT NOT NULL DEFAULT '{}', version TEXT NOT NULL, error TEXT,
    created REAL NOT NULL, updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS refusals (
    key TEXT PRIMARY KEY, generator TEXT NOT NULL, prompt TEXT NOT NULL, seed INTEGER NOT NULL,
    message TEXT NOT NULL, created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS run_images (
    run_id TEXT NOT NULL, image_key TEXT NOT NULL, label TEXT NOT NULL DEFAULT '',
    position INTEGER NOT NULL,
    PRIMARY KEY (run_id, image_key, label)
);
"""
# spot-check labels (issue 16): a person's label of one image on one axis, kept with the run it
# was checked in; looked up by image key too, so a later run over the same images reuses them
SCHEMA += """
CREATE TABLE IF NOT EXISTS labels (
    run_id TEXT NOT NULL, image_key TEXT NOT NULL, axis TEXT NOT NULL, label TEXT NOT NULL,
    who TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (run_id, image_key, axis, who)
);
CREATE INDEX IF NOT EXISTS labels_by_image ON labels(image_key);
"""
# what public visitors spent (issue 27): images, LLM calls and export bytes charged, by visitor
# and client address; kept apart from the runs, so deleting a run gives nothing back (engine/hosting/spending.py)
SCHEMA += """
CREATE TABLE IF NOT EXISTS charges (
    created REAL NOT NULL, visitor TEXT NOT NULL, address TEXT NOT NULL,
    images INTEGER NOT NULL, llm_calls INTEGER NOT NULL, export_bytes INTEGER NOT NULL, what TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS charges_by_created ON charges(created);
CREATE INDEX IF NOT EXISTS charges_by_visitor ON charges(visitor, created);
CREATE INDEX IF NOT EXISTS charges_by_address ON charges(address, created);
"""

# the distilled evaluator's probes (issue 46): per (teacher, embedder, question, choices) a logistic-regression
# probe on stored image embeddings with its provenance (JSON: weights, classes, the teacher's sample, held-out
# agreement), reused across runs of the same embedder and teacher (engine/core/distilled.py)
SCHEMA += """
CREATE TABLE IF NOT EXISTS probes (
    key TEXT PRIMARY KEY, teacher TEXT NOT NULL, embedder TEXT NOT NULL, question TEXT NOT NULL,
    choices TEXT NOT NULL, record TEXT NOT NULL, created REAL NOT NULL
);
"""

# Columns added after the first release (added to older stores when they are opened):
# images.provenance 'local' (generated here) or 'imported' (from an archive: never a cache hit
# for a new generation), images.used (last use, for LRU clean-up), images.bytes (file size);
# answers.probs (JSON {class: probability} of an evaluator that scores the classes, '' otherwise) and
# answers.text (the evaluator's own words beside the chosen class, '' when it wrote none; issue 35);
# runs.owner (the public-mode visitor, '' = the host), runs.published (shown read-only to every
# visitor), runs.pid/host (the process running it, to spot runs a dead process left
# 'running'), runs.cost (images the request was budgeted for), runs.ended (when the process running it
# ended it, done, failed or stopped; NULL while one runs it: what a Stop pressed elsewhere waits for).
COLUMNS = {
    "images": [("provenance", "TEXT NOT NULL DEFAULT 'local'"), ("used", "REAL"), ("bytes", "INTEGER")],
    "answers": [("probs", "TEXT NOT NULL DEFAULT ''"), ("text", "TEXT NOT NULL DEFAULT ''")],
    "runs": [("owner", "TEXT NOT NULL DEFAULT ''"), ("published", "INTEGER NOT NULL DEFAULT 0"),
             ("pid", "INTEGER"), ("host", "TEXT"), ("cost", "INTEGER NOT NULL DEFAULT 0"), ("ended", "REAL")],
}
INDEXES = """
CREATE INDEX IF NOT EXISTS runs_by_created ON runs(created);
CREATE INDEX IF NOT EXISTS runs_by_owner ON runs(owner, created);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs(status);
CREATE INDEX IF NOT EXISTS run_images_by_image ON run_images(image_key);
CREATE INDEX IF NOT EXISTS images_by_used ON images(used);
CREATE INDEX IF NOT EXISTS embeddings_by_subject ON embeddings(subject);
CREATE INDEX IF NOT EXISTS answers_by_question ON answers(evaluator, question);
"""
MAX_REQUEST_BYTES = 64 * 1024   # a run's stored request (validated requests are far smaller)
MAX_PUBLIC_RESULTS_BYTES = 8 * 2**20   # a visitor's run's stored results (a full public request's are < 1 MiB)

# bound variables per statement: SQLite builds before 3.32 allow 999; room is left for a few more
MAX_IN_VALUES = 500


def in_chunks(values: Sequence) -> Iterator[tuple[str, list]]:
    """`values` in chunks of at most MAX_IN_VALUES: yields ("?,?,…", chunk) for one statement's
    `IN (...)` clause per chunk."""
    values = list(values)
    for i in range(0, len(values), MAX_IN_VALUES):
        chunk = values[i:i + MAX_IN_VALUES]
        yield ",".join("?" * len(chunk)), chunk
