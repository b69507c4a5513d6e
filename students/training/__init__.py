"""Training a student on logit stores: the trainer, its config, the batches, the loss, the
optimiser, evaluation, checkpoints and the run directory."""
