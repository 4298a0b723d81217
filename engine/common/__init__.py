"""What every layer shares, importing nothing else of the engine: the errors a user can act on,
the events a method yields, score rows, names that leave the engine, who is asking (the visitor of
a public GapLens) and the meta-prompts sent to language models."""
