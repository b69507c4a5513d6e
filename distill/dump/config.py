"""The settings of a dump (:class:`DumpConfig`, the ``dump`` flags); the dump itself is :mod:`distill.dump.run`.

The settings are grouped by the module that reads them, as ``TrainConfig``'s are: the teacher
(:class:`distill.teacher.source.TeacherSource`), the corpus (:class:`distill.corpus.spec.CorpusSpec`),
the teacher windows (:class:`distill.teacher.windows.TeacherWindows`), the batching of the teacher
pass (:class:`Batching`), the store written (:class:`StoreSettings`), conversations
(:class:`ChatSettings`, with :class:`distill.corpus.conversations.ConversationFields`) and the
teacher's answers (:class:`RespondSettings`); the flags and a file's keys stay flat
(:mod:`configs.fields`).

Importing it loads no torch: ``bytedistill dump --help`` builds its parser from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bytestream.stream_kind import AUTO_STREAM, StreamKind
from common.errors import UserError
from configs.fields import flat_values, from_flat, leaves
from configs.ranges import COUNT, NON_NEGATIVE, range_problem
from distill.corpus.conversations import ConversationFields
from distill.corpus.spec import CorpusSpec
from distill.teacher.source import TeacherSource
from distill.teacher.windows import TeacherWindows
from logit_store.encodings import DEFAULT_ENCODING, ENCODINGS
from logit_store.file_names import SKIP_LIST

DEFAULT_MAX_MESSAGES = 256  # the most messages of a conversation dump --chat renders (each prefix is rendered)


@dataclass
class Batching:
    """How the teacher pass batches its work (:mod:`distill.dump.plan`, :mod:`distill.dump.teacher_pass`)
    and where the conversion runs."""

    batch_tokens: int = field(
        default=8192, metadata={"help": "padded tokens per teacher forward batch", "range": COUNT}
    )
    group_tokens: int = field(
        default=32768,
        metadata={
            "help": "tokens read and ordered by length together "
            "(their converted values wait for their documents to be complete)",
            "range": COUNT,
        },
    )
    head_rows: int = field(
        default=1024,
        metadata={
            "help": "teacher rows whose float32 logits exist at once: the LM head and the conversion run in chunks "
            "of this many rows (the logits' memory, independent of batch, group and document size)",
            "range": COUNT,
        },
    )
    conversion: str = field(
        default="auto",
        metadata={
            "help": "auto: on the device next to the forward on CUDA, Numba in a background thread on CPU; "
            "torch: the device path on any device (as CUDA runs it)",
            "choices": ["auto", "numba", "torch"],
        },
    )


@dataclass
class StoreSettings:
    """The store a dump writes: its stream, writers and encoding (:mod:`distill.dump.settle`, the store
    writers)."""

    stream: str = field(
        default=AUTO_STREAM,
        metadata={
            "help": "the stream the store holds: fused (one symbol per text byte that says whether the teacher's "
            "token ends with it; the flat student learns more from it at equal training FLOPs and takes a step "
            "per byte), eot (bytes and an <eot> after each teacher token; the patched student's better stream "
            "at equal FLOPs) or auto: the stream of the store a dump resumes, else fused; recorded in the "
            "store, and a student trains on stores of its stream",
            "choices": [AUTO_STREAM, *(kind.value for kind in StreamKind.stored_kinds())],
        },
    )
    writers: int | None = field(
        default=None,
        metadata={
            "help": "fixed number of store writers the documents are dealt to, recorded in the store "
            "(default: the store's own on resume, else processes × --num-shards); "
            "any number of processes up to it can resume",
            "range": COUNT,
        },
    )
    encoding: str = field(
        default=DEFAULT_ENCODING,
        metadata={
            "help": "value encoding of the store: pow8-ans (the pow8 codes entropy-coded: a third smaller), pow8 "
            "(faster to read), log8, float16, pow12, pow16 (see logit_store/FORMAT.md)",
            "choices": list(ENCODINGS),
        },
    )
    chunk_bytes: int | None = field(
        default=None,
        metadata={
            "help": "raw bytes of a store chunk, which each writer holds until it is full "
            "(default: the encoding's, 16 MiB for pow8-ans)",
            "range": COUNT,
        },
    )
    encode_threads: int | None = field(
        default=None,
        metadata={
            "help": "threads per store writer that encode and compress its documents and chunks while the teacher "
            "runs; the store's bytes are the same for any count (default: 4 where the conversion runs on the "
            "device, whose dump the encoding would otherwise hold back, else 1: the Numba conversion is "
            "the host's work there; see the README)",
            "range": COUNT,
        },
    )
    docs_per_shard: int | None = field(  # a shard: one of the store's files
        default=None, metadata={"help": "close a shard after this many documents (default: by size)", "range": COUNT}
    )


@dataclass
class ChatSettings:
    """A corpus read as conversations (``--chat``): where a record's conversation is, and how the
    teacher's chat template renders it (:mod:`distill.teacher.chat`)."""

    enabled: bool = field(
        default=False,
        metadata={
            "flag": "chat",
            "help": "read the corpus as conversations, rendered by the teacher's chat template: the specials it "
            "writes become reserved symbols of the stream and each position records who speaks "
            "(docs/DESIGN.md, Conversations)",
        },
    )
    fields: ConversationFields = field(default_factory=ConversationFields)  # --messages-field … --answer-field
    max_messages: int = field(
        default=DEFAULT_MAX_MESSAGES,
        metadata={
            "help": "with --chat: skip (and list) conversations of more messages than this (every prefix of a "
            "conversation is rendered to check that the template renders it as a prefix, a cost that grows with "
            "the square of the messages)",
            "range": COUNT,
        },
    )
    chat_template: str | None = field(
        default=None,
        metadata={"help": "with --chat: a Jinja chat template file (default: the teacher's own, or its GGUF's)"},
    )
    respond: bool = field(
        default=False,
        metadata={
            "help": "with --chat: the teacher writes the last assistant turn of every conversation (those that end "
            "with a user message always get one), kept beside the store as OUTPUT.answers.jsonl, which is dumped"
        },
    )


@dataclass(frozen=True)
class RespondSettings:
    """How the teacher writes the answers with ``--respond`` (:mod:`distill.dump.respond`; recorded in
    the partial file: a resumed run must match)."""

    max_tokens: int = field(
        default=256,
        metadata={"flag": "respond_tokens", "help": "the most tokens of an answer --respond writes", "range": COUNT},
    )
    temperature: float = field(
        default=0.0,
        metadata={
            "flag": "respond_temperature",
            "help": "--respond sampling temperature (0: greedy)",
            "range": NON_NEGATIVE,
        },
    )
    seed: int = field(
        default=0,
        metadata={
            "flag": "respond_seed",
            "help": "--respond sampling seed (a batch draws from it plus its first conversation's number)",
            "range": NON_NEGATIVE,
        },
    )
    batch: int = field(
        default=16,
        metadata={
            "flag": "respond_batch",
            "help": "--respond: the conversations the teacher answers at once (a stopped run resumes from its last whole batch)",
            "range": COUNT,
        },
    )


@dataclass
class DumpConfig:
    teacher: TeacherSource  # the flags --teacher … --dtype
    corpus: CorpusSpec  # the flags --corpus, --text-field … --max-bytes
    output: str = field(metadata={"help": "store directory to write (rerun the same command to resume)"})
    windows: TeacherWindows = field(default_factory=TeacherWindows)  # --max-length, --stride
    batching: Batching = field(default_factory=Batching)
    store: StoreSettings = field(default_factory=StoreSettings)
    # the jobs the work is split across; their flags say "shards", a name kept for the command line
    job_count: int = field(
        default=1,
        metadata={"flag": "num_shards", "help": "split the corpus across this many independent jobs", "range": COUNT},
    )
    job_index: int = field(
        default=0,
        metadata={"flag": "shard_index", "help": "which of --num-shards this job is (0-based)", "range": NON_NEGATIVE},
    )
    # set by the command line before the dump runs (common/threads.py), the one owner of the count
    threads: int | None = field(
        default=None,
        metadata={
            "help": "torch CPU threads (default: OMP_NUM_THREADS, else the CPUs other tasks leave free)",
            "range": COUNT,
        },
    )
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})
    strict: bool = field(
        default=False,
        metadata={
            "help": "refuse the first document the teacher cannot encode, instead of skipping it "
            f"(skipped documents are listed in the store's {SKIP_LIST.shown})"
        },
    )
    max_document_bytes: int | None = field(
        default=None, metadata={"help": "skip (and list) documents longer than this many bytes", "range": COUNT}
    )
    verbose: bool = field(default=False, metadata={"help": "name every corpus entry that is not read, and why"})
    chat: ChatSettings = field(default_factory=ChatSettings)
    answers: RespondSettings = field(default_factory=RespondSettings)  # --respond-tokens … --respond-batch

    def __post_init__(self) -> None:
        if problem := range_problem(type(self), flat_values(self)):  # a library caller gets the parser's checks too
            raise UserError(problem)

    @classmethod
    def of(cls, corpus: CorpusSpec, **settings) -> DumpConfig:
        """The config of ``corpus`` with the other settings by their flat names (the flags':
        ``teacher``, ``max_length``, ``respond_seed`` …), each group built from its own."""
        return from_flat(cls, flat_values(corpus) | settings)

    @classmethod
    def default(cls, name: str):
        """The default of the setting of flat name ``name``."""
        return next(leaf.field.default for leaf in leaves(cls) if leaf.name == name)
