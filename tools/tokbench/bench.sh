#!/usr/bin/env bash
# Tokenizer benchmark: spill's tokenizer.json reader against Hugging Face
# tokenizers on the same text, on this machine's cores.
#
#   bash tools/tokbench/bench.sh BIN_DIR OUT.json [MB]
#
# BIN_DIR holds spill and tokbench built for this machine, and a file
# "commit" with the commit they were built from: build them on the dev box
#   CGO_ENABLED=0 go build -ldflags=-s\ -w -o tools/tokbench/bin/spill ./cmd/spill
#   CGO_ENABLED=0 go build -ldflags=-s\ -w -o tools/tokbench/bin/tokbench ./tools/tokbench
#   git rev-parse HEAD > tools/tokbench/bin/commit
# (the GPU machine has no network to fetch modules) and carry the folder. Generates a
# corpus of MB megabytes (default 30), trains a byte-level BPE with
# tokenizers, encodes the corpus with both on 1 thread and on every core,
# checks that the ids are identical (tokbench's and spill convert's against
# tokenizers'), and writes OUT.json.
set -euo pipefail
bin=$(cd "$1" && pwd)
out=$2
mb=${3:-30}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cores=$(nproc)
[ "$(uname -m)" = x86_64 ] || { echo "bench.sh: binaries are linux/amd64, this is $(uname -m)" >&2; exit 1; }

python3 "$here/bench.py" corpus "$work/docs.jsonl" "$mb"
train=$(python3 "$here/bench.py" train "$work/docs.jsonl" 32000 "$work/tokenizer.json")
echo "train: $train"
cp "$work/tokenizer.json" "$(dirname "$out")/tokenizer_trained.json"  # kept for a look if a step below fails

hf1=$(RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=true python3 "$here/bench.py" encode "$work/tokenizer.json" "$work/docs.jsonl" "$work/hf.ids")
hfN=$(RAYON_NUM_THREADS=$cores TOKENIZERS_PARALLELISM=true python3 "$here/bench.py" encode "$work/tokenizer.json" "$work/docs.jsonl" "$work/hfN.ids")
echo "hf 1: $hf1"; echo "hf $cores: $hfN"
sp1=$("$bin/tokbench" encode -tokenizer "$work/tokenizer.json" -in "$work/docs.jsonl" -threads 1 -out "$work/spill.ids")
spN=$("$bin/tokbench" encode -tokenizer "$work/tokenizer.json" -in "$work/docs.jsonl" -threads "$cores")
echo "spill 1: $sp1"; echo "spill $cores: $spN"
same=$("$bin/tokbench" compare "$work/hf.ids" "$work/spill.ids")
sameN=$("$bin/tokbench" compare "$work/hf.ids" "$work/hfN.ids")

t0=$(date +%s.%N)
"$bin/spill" convert --quiet --out "$work/ds" --tokenizer "$work/tokenizer.json" --seq-len 1024 "$work/docs.jsonl"
t1=$(date +%s.%N)
"$bin/tokbench" dump "$work/ds" "$work/convert.ids"
sameConv=$("$bin/tokbench" compare "$work/hf.ids" "$work/convert.ids")
echo "identical: $same; convert: $sameConv"

python3 - "$out" "$mb" "$cores" "$t0" "$t1" <<PY
import json, sys, datetime, platform, subprocess
out, mb, cores, t0, t1 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
hf1, hfN, sp1, spN = json.loads('''$hf1'''), json.loads('''$hfN'''), json.loads('''$sp1'''), json.loads('''$spN''')
same, sameN, sameConv, train = json.loads('''$same'''), json.loads('''$sameN'''), json.loads('''$sameConv'''), json.loads('''$train''')
import tokenizers
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
res = {
  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
  "commit": "$(cat "$bin/commit" 2>/dev/null || echo unknown)",
  "machine": {"cpu": cpu, "cores": cores},
  "command": "bash tools/tokbench/bench.sh BIN_DIR OUT.json $mb",
  "corpus": {"bytes": hf1["bytes"], "docs": hf1["docs"], "generator": "tools/tokbench/bench.py corpus (zipf words, punctuation, unicode, mixed whitespace)"},
  "tokenizer": {"trained_with": "tokenizers.ByteLevelBPETokenizer " + tokenizers.__version__, "vocab": train["vocab"], "train_seconds": train["train_seconds"]},
  "ids_identical": {"spill_vs_hf": same["identical_ids"] == same["len_a"] == same["len_b"],
                    "hf_all_cores_vs_1_thread": sameN["identical_ids"] == sameN["len_a"] == sameN["len_b"],
                    "spill_convert_is_prefix_of_hf": sameConv["identical_ids"] == sameConv["len_b"],
                    "hf_ids": same["len_a"], "spill_ids": same["len_b"], "convert_ids": sameConv["len_b"],
                    "first_difference": same["first_difference"] or sameConv["first_difference"] or None},
  "tokens_per_s": {
    "hf_1_thread": hf1["tokens_per_s"], "spill_1_thread": sp1["tokens_per_s"],
    "hf_all_cores": hfN["tokens_per_s"], "spill_all_cores": spN["tokens_per_s"],
    "hf_per_core_all_cores": hfN["tokens_per_s"] / cores, "spill_per_core_all_cores": spN["tokens_per_s"] / cores,
  },
  "ratio_spill_over_hf": {"1_thread": sp1["tokens_per_s"] / hf1["tokens_per_s"], "all_cores": spN["tokens_per_s"] / hfN["tokens_per_s"]},
  "target": "spill >= 0.5x tokenizers tokens/s per core",
  "spill_convert": {"seconds": t1 - t0, "tokens_per_s": same["len_a"] / (t1 - t0), "note": "end to end: read JSONL, tokenize on all cores, write and fsync the dataset"},
  "notes": "Encoding time only for both libraries (documents in memory; tokenizers' encode_batch, tokbench's goroutines over tokenize.Encoder). ids compared as uint32 with EOT between documents.",
}
json.dump(res, open(out, "w"), indent=2)
print(json.dumps(res["ratio_spill_over_hf"]), json.dumps(res["ids_identical"]))
PY
