"""Exporting a checkpoint to other inference engines: `ct2` (CTranslate2)."""
