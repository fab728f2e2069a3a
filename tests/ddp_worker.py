"""Run under torchrun by tests/unit/test_training.py: train, then save this rank's weights
(only rank 0 writes checkpoints, so the worker keeps a hand on each rank's model)."""

import os
import sys

import torch

import mtkit.training.loop as train_module
from mtkit.core.config import load_config

config, out = sys.argv[1], sys.argv[2]
models = []
real_loop = train_module._loop


def loop(state, view, signals):
    models.append(state.model)
    return real_loop(state, view, signals)


train_module._loop = loop
train_module.train(load_config(config))  # (which ends the process group it started)
torch.save(models[0].state_dict(), f"{out}/rank{os.environ['RANK']}.pt")
