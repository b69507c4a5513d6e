"""Teacher side: vocabularies, the byte trie, exact token→byte conversion, the dump pass."""
