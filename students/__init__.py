"""Byte students: models, the distillation loss, the training dataset and trainer, export and inference."""
