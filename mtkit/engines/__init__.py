"""The engines that run a search: `pytorch` (checkpoints, in PyTorch) and `ct2` (an
exported folder, in CTranslate2, without torch). Neither knows the other; `loader`
chooses one from what `-m` names."""
