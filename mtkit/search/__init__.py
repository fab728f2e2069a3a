"""Searches over a step function: greedy and beam search, sampling, lexical
constraints, ensembles, word alignments."""
