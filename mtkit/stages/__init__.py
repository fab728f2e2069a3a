"""The stages a run chains (`mtkit run`): the tokenizer, preprocessing, the pipeline itself,
and `explain`, which looks inside a model."""
