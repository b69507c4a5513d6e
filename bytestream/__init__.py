"""The shared vocabulary of the byte stream: the alphabet, a teacher's vocabulary as byte strings, its
trie, the stream layout, the encoding rules (shipped with every export), the error for a user's
mistake and the opening of a command's own files.

It imports no other package of the project; every other package may import it.
"""
