"""The teacher: loading it, naming it, its tokenizer's encoding of documents and its windows."""
