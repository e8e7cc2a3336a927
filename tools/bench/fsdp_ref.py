"""PyTorch FSDP2 CPU-offload reference for tools/bench/ooc_h200.sh: the
same GPT (tools/gpubench/torch_ref.py's model, nanoGPT-style, tied head)
sharded with fully_shard on one GPU with CPUOffloadPolicy(pin_memory=True)
(parameters, gradients and AdamW on the host), bf16 compute through
MixedPrecisionPolicy, one micro-batch per step. Prints one JSON line.

    python3 tools/bench/fsdp_ref.py SHAPE BATCH STEPS WARMUP
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "gpubench"))
from torch_ref import GPT, SHAPES  # noqa: E402


def main():
    shape, batch, steps, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    s = dict(SHAPES[shape])
    torch.manual_seed(0)
    t0 = time.time()
    model = GPT(s)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    off = CPUOffloadPolicy(pin_memory=True)
    for b in model.h:
        fully_shard(b, mp_policy=mp, offload_policy=off)
    fully_shard(model, mp_policy=mp, offload_policy=off)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    T = s["seq_len"]
    g = torch.Generator(device="cuda").manual_seed(1)
    times, losses = [], []
    first = None
    for i in range(warmup + steps):
        idx = torch.randint(0, s["vocab"], (batch, T), device="cuda", generator=g)
        tgt = torch.randint(0, s["vocab"], (batch, T), device="cuda", generator=g)
        torch.cuda.synchronize()
        a = time.time()
        loss = model(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.time() - a
        if first is None:
            first = time.time() - t0
        losses.append(loss.item())
        if i >= warmup:
            times.append(dt)
    times.sort()
    med = times[len(times) // 2]
    print(json.dumps({"shape": shape, "batch": batch, "seq_len": T, "tokens_per_sec": batch * T / med,
                      "step_s_median": med, "first_step_s": first, "losses": losses,
                      "torch": torch.__version__, "peak_device_bytes": torch.cuda.max_memory_allocated()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
