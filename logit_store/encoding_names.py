"""The names of the value encodings a store may use (``logit_store/FORMAT.md``), and the default.

Their code is :mod:`logit_store.encodings`; the names are here so that a config's choices
(``dump --encoding``) are read without loading it.
"""

ENCODINGS = ("float16", "log8", "pow8", "pow8-ans", "pow12", "pow16")
DEFAULT_ENCODING = "pow8-ans"
