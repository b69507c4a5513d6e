"""The corpus: its files and formats, its pieces, and each writer's share of them."""
