"""The logit store: compressed, checksummed shards of exact next-byte distributions."""
