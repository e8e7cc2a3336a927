"""PyTorch reference for tools/gpubench: the same GPT shapes trained the way
nanoGPT trains them (eager mode, bf16 autocast, fp32 weights, fused AdamW,
F.scaled_dot_product_attention, grad clip 1.0), plus the same GEMMs and
attention timed alone. Writes one JSON file that gpubench merges.

    python3 tools/gpubench/torch_ref.py OUT.json [124m,1.3b]

With SPILL_TORCH_COMPILE=1 the model is trained through torch.compile
(regional: each transformer block, and the head with its loss, compiled;
identical blocks share one compiled graph), compile time excluded by the
warm-up steps.
"""

import json
import math
import os
import platform
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {
    "124m": dict(layers=12, embd=768, heads=12, vocab=50304, max_seq=1024, seq_len=1024, batch=16, steps=30, warmup=5),
    "1.3b": dict(layers=24, embd=2048, heads=16, vocab=50304, max_seq=2048, seq_len=1024, batch=8, steps=15, warmup=4),
    "2.7b": dict(layers=32, embd=2560, heads=20, vocab=50304, max_seq=2048, seq_len=2048, batch=4, steps=12, warmup=4),
}


class Attention(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        k = k.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        v = v.view(B, T, self.nh, C // self.nh).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c)
        self.attn = Attention(c, nh)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, s):
        super().__init__()
        c = s["embd"]
        self.wte = nn.Embedding(s["vocab"], c)
        self.wpe = nn.Embedding(s["max_seq"], c)
        self.h = nn.ModuleList([Block(c, s["heads"]) for _ in range(s["layers"])])
        self.ln_f = nn.LayerNorm(c)
        self.lm_head = nn.Linear(c, s["vocab"], bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in nanoGPT
        for n, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * s["layers"]) if n.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        return self.head(x, targets)

    def head(self, x, targets):
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def train(name, s, compiled=False):
    torch.manual_seed(1337)
    dev = "cuda"
    model = GPT(s).to(dev)
    if compiled:
        for b in model.h:
            b.compile()
        model.head = torch.compile(model.head)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    B, T, V = s["batch"], s["seq_len"], 50257
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, V, (s["steps"] + 2, B, T + 1), generator=g, dtype=torch.int64).pin_memory()
    losses = []
    torch.cuda.reset_peak_memory_stats()
    step_times = []
    t_start = None
    for step in range(s["steps"]):
        if step == s["warmup"]:
            torch.cuda.synchronize()
            t_start = time.perf_counter()
        t0 = time.perf_counter()
        batch = data[step].to(dev, non_blocking=True)
        x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        step_times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t_start
    tok = (s["steps"] - s["warmup"]) * B * T / wall
    peak = torch.cuda.max_memory_allocated()
    res = dict(tokens_per_sec=tok, model_tflops=6 * nparams * tok / 1e12, params=nparams,
               step_ms_mean=wall * 1e3 / (s["steps"] - s["warmup"]), peak_device_bytes=peak,
               peak_device_gib=peak / 2**30, losses=[float(l) for l in losses],
               compiled=compiled,
               note="no host sync per step (nanoGPT syncs only at log intervals); one sync at the end")
    print(f"== torch{' compiled' if compiled else ''} {name}: {tok:.0f} tok/s, {res['model_tflops']:.1f} TFLOP/s, {res['step_ms_mean']:.1f} ms/step, "
          f"peak {res['peak_device_gib']:.2f} GiB, loss {res['losses'][0]:.3f} -> {res['losses'][-1]:.3f}", flush=True)
    del model, opt, data
    torch.cuda.empty_cache()
    return res


def timed(f, reps):
    for _ in range(3):
        f()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(reps):
        f()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def kernels(name, s):
    dev, dt = "cuda", torch.bfloat16
    C, BT = s["embd"], s["batch"] * s["seq_len"]
    gemms = {}
    for g, c, oc in [("qkv", C, 3 * C), ("proj", C, C), ("fc", C, 4 * C), ("fcproj", 4 * C, C), ("lmhead", C, s["vocab"])]:
        x = torch.randn(BT, c, device=dev, dtype=dt)
        w = torch.randn(oc, c, device=dev, dtype=dt) * 0.02
        dy = torch.randn(BT, oc, device=dev, dtype=dt)
        fwd = timed(lambda: x @ w.t(), 20)
        bwd = timed(lambda: (dy @ w, dy.t() @ x), 20)
        tf = 6 * BT * c * oc / ((fwd + bwd) / 1e3) / 1e12
        gemms[f"{name}/{g}"] = dict(bt=BT, c=c, oc=oc, fwd_ms=fwd, bwd_ms=bwd, tflops_fwd_bwd=tf)
        print(f"   torch gemm {name}/{g:8s} BT{BT} C{c} OC{oc}: fwd {fwd:.3f} ms, bwd {bwd:.3f} ms, {tf:.0f} TFLOP/s", flush=True)
        del x, w, dy
    B, T, NH = s["batch"], s["seq_len"], s["heads"]
    hs = C // NH
    q, k, v = (torch.randn(B, NH, T, hs, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    do = torch.randn(B, NH, T, hs, device=dev, dtype=dt)
    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 10)
    both = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do), 10)
    fl = 3.5 * 4 * B * NH * T * T / 2 * hs
    att = dict(b=B, t=T, c=C, nh=NH, fwd_ms=fwd, bwd_ms=both - fwd, tflops_causal_3_5x_fwd=fl / (both / 1e3) / 1e12)
    print(f"   torch attention {name}: fwd {fwd:.3f} ms, bwd {both - fwd:.3f} ms, {att['tflops_causal_3_5x_fwd']:.0f} TFLOP/s", flush=True)
    return gemms, {name: att}


def main():
    out = sys.argv[1]
    names = (sys.argv[2] if len(sys.argv) > 2 else "124m,1.3b").split(",")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    props = torch.cuda.get_device_properties(0)
    rep = dict(machine=dict(device=torch.cuda.get_device_name(0), sms=props.multi_processor_count,
                            memory_gib=props.total_memory / 2**30, torch=torch.__version__, cuda=torch.version.cuda,
                            python=platform.python_version(), host_nproc=os.cpu_count()),
               shapes={}, kernels=dict(gemms={}, attention={}))
    for n in names:
        if os.environ.get("SPILL_TRAIN_ONLY"):  # profiling the training steps alone
            break
        g, a = kernels(n, SHAPES[n])
        rep["kernels"]["gemms"].update(g)
        rep["kernels"]["attention"].update(a)
    for n in names:
        if os.environ.get("SPILL_KERNELS_ONLY"):  # the kernel benchmarks alone
            break
        rep["shapes"][n] = train(n, SHAPES[n], compiled=os.environ.get("SPILL_TORCH_COMPILE") == "1")
        with open(out, "w") as f:  # after each shape: a run cut short keeps what it measured
            json.dump(rep, f, indent=1)
    with open(out, "w") as f:
        json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
