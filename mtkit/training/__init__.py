"""Training: the loop, the run's state and its choices decided once, the optimizer and
its schedule, and the metrics log."""
