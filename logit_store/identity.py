"""What makes a store one store (:class:`StoreIdentity`): the values every writer of it must share,
which its manifest records and a resume compares (``IDENTITY_FIELDS``, FORMAT.md "manifest.json").

A writer is given the identity as one value; what differs between the writers of one store (the
writer id, the corpus pieces dealt to it, shard and chunk sizes) it is given beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bytestream.stream_kind import StreamKind
from bytestream.vocab import TeacherVocab
from logit_store.encodings import DEFAULT_ENCODING


@dataclass(frozen=True)
class StoreIdentity:
    vocab: TeacherVocab  # the teacher's vocabulary: the store's ids and their byte strings
    teacher: str = ""  # the teacher by what it is (default: the vocabulary's name)
    teacher_hash: str | None = None  # a hash of its weights files, or the Hub revision it loaded
    tokenizer_source: str | None = None  # where its tokenizer was read (recorded relative to the store)
    tokenizer_hash: str | None = None
    corpus_hash: str | None = None  # the corpus's fingerprint, from its listing
    settings: dict = field(default_factory=dict)  # what decides the values and who holds which document
    encoding: object = DEFAULT_ENCODING  # an encoding's name, or an Encoding (logit_store.encodings)
    encoding_params: dict | None = None  # with a name: its parameters
    stream: StreamKind = StreamKind.EOT  # the stream every document's values are over
    reserved_symbols: list[dict] | None = None  # a chat store's kept specials ([{"text", "teacher_id"}, ...])
    # how the teacher computed (device, dtype, CPU threads): recorded, not compared, so that a resume can
    # compute the same way (a CPU's float kernels round differently with another thread count)
    teacher_numerics: dict | None = None
