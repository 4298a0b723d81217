"""Stored runs: their history (list, compare, delete, scores), import of export zips and
read-only galleries."""
