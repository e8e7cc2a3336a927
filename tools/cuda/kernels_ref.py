"""PyTorch reference for tools/cuda/kernels_bench.sh: causal attention
forward and backward through F.scaled_dot_product_attention, timed with
CUDA events under each SDPA backend that runs (cuDNN, flash, memory
efficient), at the same head sizes, lengths, batch and heads as
`gpubench -attn-sweep`, on random bf16 data in (B, NH, T, hs) layout.

    python3 tools/cuda/kernels_ref.py OUT.json 64:1024,128:2048 [tokens] [heads]
"""

import json
import platform
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(f):
    """ms per call of f: warm-up, then enough calls for at least 50 ms."""
    for _ in range(3):
        f()
    reps = 10
    for _ in range(2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        for _ in range(reps):
            f()
        b.record()
        torch.cuda.synchronize()
        total = a.elapsed_time(b)
        if total >= 50:
            break
        reps = min(2000, int(50 / (total / reps)) + 1)
    return total / reps


def main():
    out, spec = sys.argv[1], sys.argv[2]
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 16384
    heads = int(sys.argv[4]) if len(sys.argv) > 4 else 16
    props = torch.cuda.get_device_properties(0)
    rep = dict(machine=dict(device=torch.cuda.get_device_name(0), sms=props.multi_processor_count,
                            torch=torch.__version__, cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                            python=platform.python_version()),
               attention=[])
    for p in spec.split(","):
        hs, T = (int(v) for v in p.split(":"))
        B, NH = max(1, tokens // T), heads
        q, k, v = (torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16)
        fl = 3.5 * 4 * B * NH * T * T / 2 * hs
        backends = {}
        for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
            try:
                with sdpa_kernel(be):
                    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                    # autograd.grad: no accumulation into q.grad between calls
                    both = timed(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                                             (q, k, v), do))
            except RuntimeError as e:
                backends[be.name] = dict(error=str(e).splitlines()[0][:200])
                continue
            backends[be.name] = dict(fwd_ms=fwd, bwd_ms=both - fwd, fwd_bwd_ms=both,
                                     tflops_fwd_bwd_causal=fl / (both / 1e3) / 1e12)
        ok = {n: r for n, r in backends.items() if "fwd_bwd_ms" in r}
        best = min(ok, key=lambda n: ok[n]["fwd_bwd_ms"]) if ok else None
        r = dict(hs=hs, t=T, b=B, nh=NH, fastest=best, backends=backends)
        if best:
            r.update(fwd_ms=ok[best]["fwd_ms"], bwd_ms=ok[best]["bwd_ms"], fwd_bwd_ms=ok[best]["fwd_bwd_ms"])
            print(f"   torch attention hs{hs} T{T} B{B} NH{NH}: fastest {best}: fwd {r['fwd_ms']:.3f} ms, "
                  f"bwd {r['bwd_ms']:.3f} ms", flush=True)
        rep["attention"].append(r)
        del q, k, v, do
        torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump(rep, f, indent=1)


if __name__ == "__main__":
    main()
