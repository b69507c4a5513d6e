"""Byte students, in three rooms (docs/DESIGN.md, "Layout"): ``models`` (the architectures and their
registry), ``training`` (the trainer and what it reads) and ``release`` (export, loading, score,
generate, push); a room imports only the rooms below it."""
