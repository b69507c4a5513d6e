"""The student's 260-symbol alphabet (docs/DESIGN.md, "Alphabet")."""

NUM_BYTES = 256
EOT = 256  # end of the teacher's current token
BOS = 257  # start of document
EOS = 258  # end of document; the teacher's end-of-text mass maps here
PAD = 259  # padding, never a target
ALPHABET_SIZE = 260

SPECIAL_NAMES = {EOT: "<eot>", BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}
