"""Serving a student: the decode engine (continuous batching over slots allocated once, the step
and the choice of the next symbols as one graph) and the OpenAI-compatible HTTP server over it."""
