"""The store: one SQLite database plus image files, every artefact keyed by what determines it."""
