"""Serving GapLens to others: request bounds and public budgets (`limits`), hourly spending,
each visitor's share of the store (`storage`), which backends a request may name
(`backend_choices`) and start-up on a Hugging Face Space (`space`)."""
