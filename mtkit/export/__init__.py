"""Exporting a checkpoint to other inference engines: `ct2` (CTranslate2) and
`huggingface` (a Marian model that `transformers` loads)."""
