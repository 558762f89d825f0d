"""Training on Ray Train: the plan a job resolves, the loop every task shares, checkpoints, optimizers, precision, the
feed of batches and the driver's run lock."""
