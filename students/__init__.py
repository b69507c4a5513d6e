"""Byte students, in four rooms (docs/DESIGN.md, "Layout"): ``models`` (the architectures and their
registry), ``training`` (the trainer and what it reads), ``release`` (export, loading, score,
generate, push) and ``serving`` (the decode engine and the HTTP server over it); a room imports only
the rooms below it."""
