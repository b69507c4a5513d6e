import time, numpy as np, sys, tempfile, zstandard
from benchmarks.common import kjv_chapters, llama3_tokenizer_json
from bytestream.vocab import load_teacher_tokenizer, vocab_from_tokenizer
from bytestream.trie import build_trie
from bytestream.stream_kind import StreamKind
from bytestream.stream import target_values, log_likelihood
from distill.teacher.encode import DocumentEncoder
from logit_store.encodings import get_encoding
from logit_store import rans
from logit_store.chunk import build_chunk, EncodedDocument
t=time.time()
tok = load_teacher_tokenizer(str(llama3_tokenizer_json()))
vocab = vocab_from_tokenizer(tok, name="llama3")
trie = build_trie(vocab)
enc = DocumentEncoder(tok, vocab)
chapters = kjv_chapters()[:int(sys.argv[1]) if len(sys.argv)>1 else 40]
ids = [enc.encode(text) for _, text in chapters]
stream = StreamKind.FUSED
layouts = [stream.layout(trie, i) for i in ids]
rng = np.random.default_rng(0)
def values_of(layout):
    z = np.exp(rng.standard_normal(layout.num_values) * 4.0)
    sums = np.add.reduceat(z, layout.offsets[:-1])
    return z / np.repeat(sums, np.diff(layout.offsets))
vals = [values_of(l) for l in layouts]
encoding = get_encoding("pow8-ans")
print("setup", time.time()-t, flush=True)
from logit_store.writer import StoreWriter
T = {}
def tick(name, t0):
    T[name] = T.get(name, 0) + time.thread_time() - t0
    return time.thread_time()
for rep in range(2):
    T.clear()
    docs=[]; ctxs=[]
    for i,(l,v,x) in enumerate(zip(layouts, vals, ids)):
        t0 = time.thread_time()
        l2 = stream.layout(trie, x); t0 = tick("layout rebuild", t0)
        vb, pb = encoding.encode(v, l.offsets); t0 = tick("quantise (pow8 codes)", t0)
        dec = encoding.decode(vb, pb, l.offsets); t0 = tick("nll: decode", t0)
        nll = log_likelihood(target_values(l, dec)); t0 = tick("nll: target+log", t0)
        c = encoding.contexts(l2); t0 = tick("context groups", t0)
        e = -log_likelihood(target_values(l, v)); t0 = tick("exact nll (sink)", t0)
        docs.append(EncodedDocument(x.astype(np.uint32), vb, pb, np.zeros(len(x)+1, np.float32), 0, None)); ctxs.append(c)
    t0 = time.thread_time()
    contexts = np.concatenate(ctxs)
    codes = np.concatenate([d.value_bytes for d in docs]).reshape(-1)
    full, counts = rans.chained_contexts(contexts, 5, encoding.PREVIOUS, codes, encoding.num_contexts, out=contexts); t0=tick("rans: chain+counts", t0)
    used = np.flatnonzero(counts.sum(axis=1)); freq = rans.quantise(counts[used]); t0=tick("rans: tables", t0)
    dense = np.zeros((encoding.num_contexts, 256), np.uint16); dense[used] = freq
    words = rans.encode(codes, full, dense); t0=tick("rans: encode", t0)
    contexts = np.concatenate(ctxs)
    raw = build_chunk(docs, encoding, 3, contexts); t0=tick("build_chunk (all)", t0)
    frame = zstandard.ZstdCompressor(level=9, write_checksum=True, threads=0).compress(raw); t0=tick("zstd", t0)
    ntok = sum(map(len, ids))
    print(f"rep {rep}: {ntok} tokens, {len(raw)/2**20:.1f} MiB raw")
    for k,v in T.items(): print(f"  {k:<28}{v/ntok*1e6:8.2f} us/token")
