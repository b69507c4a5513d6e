"""The dump: its settings, plan, memory terms, writers and the pass that runs the teacher into the store."""
