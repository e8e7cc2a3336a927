"""The PyTorch side of tools/bench/llama_h200.sh (issue 11's verification).

    python3 llama_ref.py make OUT_DIR
        transformers builds small random-initialised models and saves them
        with save_pretrained: OUT_DIR/llama (LlamaForCausalLM: GQA, untied
        head, llama3 RoPE scaling, sharded at 1MB so spill reads an index)
        and OUT_DIR/gpt2 (GPT2LMHeadModel); and the tokens: OUT_DIR/fixed.bin
        (the fixed batch, B x T+1 windows of one stream, as spill convert
        cuts them: row j is tokens [j*T, j*T+T+1)) and OUT_DIR/train.bin
        (a learnable stream for the fine-tune). Prints the shapes as JSON.
    python3 llama_ref.py loss MODEL_DIR FIXED_BIN B T
        from_pretrained(MODEL_DIR) in fp32 on the CPU (no TF32), the mean
        cross-entropy of the fixed batch, as JSON {"loss": ...}.
    python3 llama_ref.py bench B T STEPS
        LlamaForCausalLM at llama3.2-1b's shape, PyTorch eager (SDPA,
        bf16 autocast, fused AdamW, fp32 master weights) on the GPU:
        tokens/s over STEPS steps after 2 warm-up steps, as JSON. With
        SPILL_TORCH_COMPILE=1, each decoder layer through torch.compile.
    python3 llama_ref.py report RUNS_DIR OUT.json COMMIT MACHINE
        gathers the runs' JSON into llama_h200.json with the checks.

Only the standard library, torch, transformers and safetensors are used;
nothing is downloaded.
"""

import datetime
import glob
import json
import os
import random
import statistics
import sys
import time

VOCAB = 512  # both small models
B, T = 4, 128  # the fixed batch


def tokens_bin(path, tokens):
    import array

    array.array("H", tokens).tofile(open(path, "wb"))


def read_bin(path):
    import array

    a = array.array("H")
    a.frombytes(open(path, "rb").read())
    return list(a)


def from_pretrained(cls, path, **kw):
    import torch

    try:
        return cls.from_pretrained(path, dtype=torch.float32, **kw)
    except TypeError:  # transformers 4
        return cls.from_pretrained(path, torch_dtype=torch.float32, **kw)


def llama_config(kw, theta, scaling):
    """A LlamaConfig with rope_theta and rope_scaling in the spelling of the
    installed transformers (5: rope_parameters; 4: rope_theta, rope_scaling)."""
    import inspect

    from transformers import LlamaConfig

    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:
        return LlamaConfig(**kw, rope_parameters=dict(scaling, rope_theta=theta))
    return LlamaConfig(**kw, rope_theta=theta, rope_scaling=scaling)


def save(model, path, **kw):
    try:
        model.save_pretrained(path, safe_serialization=True, **kw)
    except TypeError:  # transformers 5 always writes safetensors
        model.save_pretrained(path, **kw)


def cmd_make(out):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaForCausalLM

    torch.manual_seed(0)
    lc = llama_config(
        dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
             rms_norm_eps=1e-5, tie_word_embeddings=False),
        500000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    llama = LlamaForCausalLM(lc).float().eval()
    # Random-initialised norms are all ones: perturb them so that a norm
    # loaded in the wrong place shows.
    with torch.no_grad():
        for n, p in llama.named_parameters():
            if n.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    save(llama, os.path.join(out, "llama"), max_shard_size="1MB")
    gc = GPT2Config(vocab_size=VOCAB, n_embd=256, n_layer=4, n_head=8, n_positions=256,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    gpt2 = GPT2LMHeadModel(gc).float().eval()
    with torch.no_grad():
        for n, p in gpt2.named_parameters():
            if ".ln_" in n or n.startswith("transformer.ln_f"):
                p.add_(0.1 * torch.randn_like(p))
    save(gpt2, os.path.join(out, "gpt2"))
    r = random.Random(1)
    tokens_bin(os.path.join(out, "fixed.bin"), [r.randrange(VOCAB) for _ in range(B * T + 1)])
    train, tok = [], 1
    for _ in range(200 * T):
        train.append(tok)
        tok = r.randrange(VOCAB) if r.random() < 0.1 else (tok * 7 + 3) % VOCAB
    tokens_bin(os.path.join(out, "train.bin"), train)
    print(json.dumps({"llama": lc.to_dict(), "gpt2": gc.to_dict(),
                      "files": sorted(os.path.relpath(p, out) for p in glob.glob(os.path.join(out, "*", "*")))},
                     default=str))


def cmd_loss(model_dir, fixed, b, t):
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    b, t = int(b), int(t)
    toks = read_bin(fixed)
    rows = [toks[j * t: j * t + t + 1] for j in range(b)]
    x = torch.tensor([r[:-1] for r in rows])
    y = torch.tensor([r[1:] for r in rows])
    model = from_pretrained(AutoModelForCausalLM, model_dir).eval()
    with torch.no_grad():
        logits = model(x).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    print(json.dumps({"loss": loss.item(), "model": model_dir, "class": type(model).__name__, "rows": b, "seq_len": t,
                      "logits_abs_mean": logits.abs().mean().item()}))


def cmd_bench(b, t, steps):
    import torch
    from transformers import AutoModelForCausalLM

    b, t, steps = int(b), int(t), int(steps)
    cfg = llama_config(  # llama3.2-1b
        dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
             num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
             rms_norm_eps=1e-5, tie_word_embeddings=True),
        500000.0, {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    try:
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    except TypeError:
        cfg._attn_implementation = "sdpa"
        model = AutoModelForCausalLM.from_config(cfg)
    model = model.float().cuda().train()
    compiled = os.environ.get("SPILL_TORCH_COMPILE") == "1"
    if compiled:  # regional: each decoder layer (identical layers share one graph), the final norm
        for layer in model.model.layers:
            layer.compile()
        model.model.norm.compile()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95), fused=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randint(0, 50000, (b, t), device="cuda", generator=g)
    times = []
    for i in range(steps + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    tps = b * t / statistics.median(times)
    impl = "pytorch eager, sdpa, bf16 autocast, fused AdamW"
    if compiled:
        impl = "torch.compile (regional: each decoder layer), sdpa, bf16 autocast, fused AdamW; compilation in the 2 warm-up steps, excluded"
    print(json.dumps({"impl": impl, "compiled": compiled, "torch": torch.__version__,
                      "params": params, "batch": b, "seq_len": t, "steps": steps,
                      "step_times_s": times, "tokens_per_sec": tps,
                      "peak_memory_bytes": torch.cuda.max_memory_allocated(), "loss": loss.item()}))


def load_json(p):
    try:
        return json.load(open(p))
    except Exception as e:  # noqa: BLE001 - a missing or failed part is reported, not fatal
        return {"error": f"{p}: {e}"}


def metrics(p):
    ms = []
    if os.path.exists(p):
        for line in open(p):
            if line.strip():
                ms.append(json.loads(line))
    return ms


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def cmd_report(runs, out, commit, machine):
    r = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
         "machine": machine, "commands": {}, "checks": {}}
    for p in sorted(glob.glob(os.path.join(runs, "*.cmd"))):
        r["commands"][os.path.basename(p)[:-4]] = open(p).read().strip()
    for p in sorted(glob.glob(os.path.join(runs, "*.rc"))):
        r.setdefault("exit", {})[os.path.basename(p)[:-3]] = open(p).read().strip()
    r["make"] = load_json(os.path.join(runs, "make.json"))
    tol = 1e-4
    for fam in ("llama", "gpt2"):
        ref = load_json(os.path.join(runs, f"ref-loss-{fam}.json"))
        for dev in ("cpu", "cuda"):
            c = {"torch_loss": ref.get("loss")}
            ev = load_json(os.path.join(runs, f"eval-{fam}-{dev}.json"))
            c["spill_loss"] = ev.get("loss")
            if isinstance(c["spill_loss"], float) and isinstance(c["torch_loss"], float):
                c["rel_diff"] = rel(c["spill_loss"], c["torch_loss"])
                c["pass"] = c["rel_diff"] <= tol
            # Fine-tune 20 steps, export, transformers reloads the export.
            ms = metrics(os.path.join(runs, f"ft-{fam}-{dev}.jsonl"))
            ft = {"steps": len(ms), "losses": [m["loss"] for m in ms]}
            evs = [m["eval_loss"] for m in ms if m.get("eval_loss") is not None]
            if evs:
                ft["spill_eval_loss_after"] = evs[-1]
            ex = load_json(os.path.join(runs, f"ref-export-{fam}-{dev}.json"))
            ft["torch_loss_of_export"] = ex.get("loss")
            se = load_json(os.path.join(runs, f"eval-export-{fam}-{dev}.json"))
            ft["spill_loss_of_export"] = se.get("loss")
            if isinstance(ft.get("spill_eval_loss_after"), float) and isinstance(ft["torch_loss_of_export"], float):
                ft["rel_diff"] = rel(ft["torch_loss_of_export"], ft["spill_eval_loss_after"])
                ft["pass"] = ft["rel_diff"] <= tol and len(ms) == 20
            c["finetune"] = ft
            r["checks"][f"{fam}-{dev}"] = c
    # Throughput: llama3.2-1b in VRAM beside PyTorch eager.
    tp = {}
    ms = metrics(os.path.join(runs, "tp-1b.jsonl"))
    steady = ms[2:] if len(ms) > 3 else ms
    tps = [m["tokens_per_sec"] for m in steady if m.get("tokens_per_sec")]
    if tps:
        tp["spill_tokens_per_sec"] = statistics.median(tps)
        fpt = steady[-1].get("model_flops_per_token")
        if fpt:
            tp["spill_model_tflops"] = fpt * tp["spill_tokens_per_sec"] / 1e12
    tp["torch"] = load_json(os.path.join(runs, "torch-1b.json"))
    if tps and isinstance(tp["torch"].get("tokens_per_sec"), float):
        tp["ratio_vs_torch"] = tp["spill_tokens_per_sec"] / tp["torch"]["tokens_per_sec"]
        tp["pass"] = tp["ratio_vs_torch"] >= 1.0
    r["throughput_llama3.2-1b"] = tp
    # llama3.1-8b out of core under 24 GiB.
    o = {}
    ms = metrics(os.path.join(runs, "ooc-8b.jsonl"))
    steady = ms[1:] if len(ms) > 1 else ms
    tps = [m["tokens_per_sec"] for m in steady if m.get("tokens_per_sec")]
    if tps:
        o["steps"] = len(ms)
        o["tokens_per_step"] = ms[0]["tokens"] if ms else None
        o["tokens_per_sec"] = statistics.median(tps)
        fpt = steady[-1].get("model_flops_per_token")
        if fpt:
            o["model_tflops"] = fpt * o["tokens_per_sec"] / 1e12
            o["pass"] = o["model_tflops"] >= 300
        o["peak_device_bytes"] = max(m.get("peak_device_bytes", 0) for m in ms)
    r["ooc_llama3.1-8b_24GiB"] = o
    json.dump(r, open(out, "w"), indent=2)
    print(json.dumps(r["checks"], indent=1))
    print(json.dumps({k: r[k] for k in ("throughput_llama3.2-1b", "ooc_llama3.1-8b_24GiB")}, indent=1, default=str))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"make": cmd_make, "loss": cmd_loss, "bench": cmd_bench, "report": cmd_report}[cmd](*args)
