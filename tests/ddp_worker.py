"""Run under torchrun by tests/unit/test_train.py: train, then save this rank's weights."""

import sys

import torch

from mtkit.config import load_config
from mtkit.train import train

config, out = sys.argv[1], sys.argv[2]
result = train(load_config(config))
rank = torch.distributed.get_rank()
torch.save(result.model.state_dict(), f"{out}/rank{rank}.pt")
torch.distributed.destroy_process_group()
