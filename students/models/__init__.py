"""The students themselves: each architecture (its object, its model, its presets), the registry of
them, the shape training sets, and what a student costs and how fast it generates."""
