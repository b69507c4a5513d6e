"""The settings of a dump (:class:`DumpConfig`, the ``dump`` flags); the dump itself is :mod:`distill.dump.run`.

Importing it loads no torch: ``bytedistill dump --help`` builds its parser from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bytestream.stream_kind import AUTO_STREAM, StreamKind
from common.errors import UserError
from configs.fields import flat_values
from configs.ranges import COUNT, NON_NEGATIVE, at_least, range_problem
from distill.corpus.conversations import DEFAULT_ANSWER_FIELD, DEFAULT_MESSAGES_FIELD
from distill.corpus.spec import CorpusSpec
from logit_store.encodings import DEFAULT_ENCODING, ENCODINGS
from logit_store.file_names import SKIP_LIST

DEFAULT_MAX_MESSAGES = 256  # the most messages of a conversation dump --chat renders (each prefix is rendered)


@dataclass
class DumpConfig:
    teacher: str = field(metadata={"help": "teacher: a model folder, a Hub id, or a .gguf file"})
    corpus: CorpusSpec  # the flags --corpus, --text-field … --max-bytes
    output: str = field(metadata={"help": "store directory to write (rerun the same command to resume)"})
    tokenizer: str | None = field(
        default=None, metadata={"help": "tokenizer source if not the teacher's own (folder, tokenizer.json, .gguf)"}
    )
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file name inside a teacher folder"})
    end_of_text: list[str] | None = field(
        default=None,
        metadata={
            "help": "end-of-text token(s) whose mass becomes <eos> (default: the usual names + the tokenizer's eos)"
        },
    )
    max_length: int = field(
        default=2048, metadata={"help": "teacher window length in tokens, its BOS included", "range": at_least(2)}
    )
    stride: int = field(
        default=512,
        metadata={
            "help": "overlap between windows: every prediction sees at least this many earlier tokens of its document "
            "(or all of them)",
            "range": NON_NEGATIVE,
        },
    )
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
    conversion: str = field(
        default="auto",
        metadata={
            "help": "auto: on the device next to the forward on CUDA, Numba in a background thread on CPU; "
            "torch: the device path on any device (as CUDA runs it)",
            "choices": ["auto", "numba", "torch"],
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
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:N or auto (the accelerate device)"})
    dtype: str = field(
        default="auto",
        metadata={
            "help": "teacher dtype: auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16, float16",
            "choices": ["auto", "float32", "bfloat16", "float16"],
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
    chat: bool = field(
        default=False,
        metadata={
            "help": "read the corpus as conversations, rendered by the teacher's chat template: the specials it "
            "writes become reserved symbols of the stream and each position records who speaks "
            "(docs/DESIGN.md, Conversations)"
        },
    )
    messages_field: str = field(
        default=DEFAULT_MESSAGES_FIELD,
        metadata={"help": "with --chat: record field holding a conversation's messages (a list of {role, content})"},
    )
    prompt_field: str | None = field(
        default=None,
        metadata={"help": "with --chat: read prompt/answer pairs instead, the prompt from this field"},
    )
    answer_field: str = field(
        default=DEFAULT_ANSWER_FIELD,
        metadata={"help": "with --prompt-field: the field holding the answer (missing or empty: --respond writes it)"},
    )
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
    respond_tokens: int = field(
        default=256, metadata={"help": "the most tokens of an answer --respond writes", "range": COUNT}
    )
    respond_temperature: float = field(
        default=0.0, metadata={"help": "--respond sampling temperature (0: greedy)", "range": NON_NEGATIVE}
    )
    respond_seed: int = field(
        default=0,
        metadata={
            "help": "--respond sampling seed (a batch draws from it plus its first conversation's number)",
            "range": NON_NEGATIVE,
        },
    )
    respond_batch: int = field(
        default=16,
        metadata={
            "help": "--respond: the conversations the teacher answers at once (a stopped run resumes from its last whole batch)",
            "range": COUNT,
        },
    )

    def __post_init__(self) -> None:
        if problem := range_problem(type(self), flat_values(self)):  # a library caller gets the parser's checks too
            raise UserError(problem)
