"""Teacher side: the corpus, the teacher, exact token→byte conversion, the dump pass."""
