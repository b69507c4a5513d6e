"""What a trained student becomes: the exported folder (its checkpoint, teacher tokenizer, card,
record and staging), loading it, and what is done with it (score, generate, push)."""
