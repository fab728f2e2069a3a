"""The bottom layer: errors, atomic writes and checksums, the typed config and its
checks, search options (no torch), devices and precision, vocabularies and language tags,
the run directory's lock, checkpoints, stop signals, text I/O and progress, and scores."""
