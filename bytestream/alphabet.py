"""The student's 260-symbol alphabet (docs/DESIGN.md, "Alphabet")."""

NUM_BYTES = 256
EOT = 256  # end of the teacher's current token
BOS = 257  # start of document
EOS = 258  # end of document; the teacher's end-of-text mass maps here
PAD = 259  # padding, never a target
ALPHABET_SIZE = 260

SPECIAL_NAMES = {EOT: "<eot>", BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}

# The fused stream (docs/DESIGN.md, "The fused stream"): one symbol per text byte that also says
# whether the teacher's token ends with it, so no <eot> symbol is needed.
FUSED_ENDS = 256  # byte b that ends its token is FUSED_ENDS + b; byte b inside a token is b
FUSED_BOS = 512
FUSED_EOS = 513
FUSED_PAD = 514
FUSED_ALPHABET_SIZE = 515

FUSED_SPECIAL_NAMES = {FUSED_BOS: "<bos>", FUSED_EOS: "<eos>", FUSED_PAD: "<pad>"}

# The bytes stream (docs/DESIGN.md, "The bytes stream"): plain text bytes, no boundary of the
# teacher's, read by a tokenizer-free student. Its target is the fused row with each byte's two
# halves summed.
BYTES_BOS = 256
BYTES_EOS = 257
BYTES_PAD = 258
BYTES_ALPHABET_SIZE = 259

BYTES_SPECIAL_NAMES = {BYTES_BOS: "<bos>", BYTES_EOS: "<eos>", BYTES_PAD: "<pad>"}
