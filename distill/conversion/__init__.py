"""The exact conversion of teacher rows into byte-stream distributions (Numba on the CPU, torch on any device)."""
