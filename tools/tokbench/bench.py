"""Hugging Face side of the tokenizer benchmark (run by bench.sh).

  python3 bench.py corpus OUT.jsonl MB      generate a deterministic corpus
  python3 bench.py train CORPUS VOCAB OUT    train a byte-level BPE, save tokenizer.json
  python3 bench.py encode TOK CORPUS IDS     encode every document (threads from
                                             RAYON_NUM_THREADS), print JSON timing,
                                             write ids (uint32 LE, EOT between docs)
"""
import json
import random
import sys
import time

WORDS_SEED = 1234


def corpus(out, mb):
    rng = random.Random(WORDS_SEED)
    letters = "abcdefghijklmnopqrstuvwxyz"
    extra = ["naïve", "café", "Straße", "東京", "データ", "Привет", "мир", "ελληνικά", "مرحبا", "🙂", "—", "«quoted»"]
    vocab = ["".join(rng.choice(letters) for _ in range(rng.randint(1, 10))) for _ in range(20000)] + extra
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    punct = [",", ".", ";", ":", "!", "?", "'s", "'t", "'ll", " (", ")", " -", "...", "\"", " 42", " 3.14", " 2024"]
    target = mb * 1_000_000
    n = 0
    with open(out, "w", encoding="utf-8") as f:
        while n < target:
            words = rng.choices(vocab, weights, k=rng.randint(20, 400))
            parts = []
            for i, w in enumerate(words):
                if i and rng.random() < 0.9:
                    parts.append(" ")
                elif i:
                    parts.append(rng.choice(["\n", "\n\n", "  ", "\t", " \n"]))
                parts.append(w.capitalize() if rng.random() < 0.1 else w)
                if rng.random() < 0.12:
                    parts.append(rng.choice(punct))
            doc = "".join(parts)
            f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
            n += len(doc.encode("utf-8"))


def train(corpus_path, vocab, out):
    from tokenizers import ByteLevelBPETokenizer

    docs = [json.loads(l)["text"] for l in open(corpus_path, encoding="utf-8")]
    tok = ByteLevelBPETokenizer()
    t0 = time.time()
    try:
        tok.train_from_iterator(docs, vocab_size=vocab, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
    except AttributeError:  # an old tokenizers: train from files
        tok.train([corpus_path], vocab_size=vocab, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
    tok.save(out)
    print(json.dumps({"train_seconds": time.time() - t0, "vocab": tok.get_vocab_size()}))


def encode(tok_path, corpus_path, ids_path):
    import os
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tok_path)
    docs = [json.loads(l)["text"] for l in open(corpus_path, encoding="utf-8")]
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    tok.encode_batch(docs[:100], add_special_tokens=False)  # warm up the thread pool
    t0 = time.perf_counter()
    encs = tok.encode_batch(docs, add_special_tokens=False)
    secs = time.perf_counter() - t0
    eot = tok.token_to_id("<|endoftext|>")
    ntok = 0
    import array

    out = array.array("I")
    for i, e in enumerate(encs):
        if i:
            out.append(eot)
        out.extend(e.ids)
        ntok += len(e.ids)
    with open(ids_path, "wb") as f:
        out.tofile(f)
    print(json.dumps({"threads": int(os.environ.get("RAYON_NUM_THREADS", "0")), "docs": len(docs), "bytes": nbytes,
                      "tokens": ntok, "seconds": secs, "tokens_per_s": ntok / secs}))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "corpus":
        corpus(sys.argv[2], int(sys.argv[3]))
    elif cmd == "train":
        train(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif cmd == "encode":
        encode(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit("unknown command " + cmd)
