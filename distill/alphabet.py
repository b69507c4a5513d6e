"""The student's 260-symbol alphabet (docs/DESIGN.md, "Alphabet")."""

NUM_BYTES = 256
EOT = 256  # end of the teacher's current token
BOS = 257  # start of document
EOS = 258  # end of document; the teacher's end-of-text mass maps here
PAD = 259  # padding, never a target
ALPHABET_SIZE = 260

SPECIAL_NAMES = {EOT: "<eot>", BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}


def symbol_name(symbol: int) -> str:
    """A printable name for one symbol: the special's name or the byte as ``0xNN``."""
    return SPECIAL_NAMES.get(symbol, f"0x{symbol:02X}")
