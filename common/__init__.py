"""The project's common pieces: the user-error type, safe file writes and locks."""
