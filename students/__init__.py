"""Byte students: models, the distillation loss, the trainer, export."""
