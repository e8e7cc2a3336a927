"""Merges what tools/cuda/kernels_bench.sh measured into one report,
kernels_h200.json, with spill and PyTorch side by side:

  - attention forward + backward (spill_attn.json from gpubench -attn-sweep,
    torch_attn.json from kernels_ref.py): ratio = torch's fastest SDPA
    backend time over spill's (>= 1: spill as fast or faster);
  - GPT training steps (gpt.json from gpubench, torch_compile.json from
    torch_ref.py with SPILL_TORCH_COMPILE=1):
    ratio = spill tokens/s over torch.compile's, model TFLOP/s of both, and
    spill's host issue time per step;
  - GEMMs at the GPT shapes (gemm_default.json, gemm_reduced.json: gpubench
    -kernels-only, float32 and reduced-precision split-K reductions);
  - the Go benchmarks' lines (gobench.log).

    python3 tools/cuda/kernels_report.py DIR COMMIT COMMAND > DIR/kernels_h200.json
"""

import datetime
import json
import os
import re
import sys


def load(d, name):
    try:
        with open(os.path.join(d, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    d, commit, command = sys.argv[1], sys.argv[2], sys.argv[3]
    rep = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               commit=commit, command=command, machine={}, notes=[
                   "attention: bf16, causal, B = 16384 tokens / T sequences of 16 heads; spill's AttentionForward and "
                   "AttentionBackwardSet as the GPT block calls them (packed qkv (B,T,3C)), torch's "
                   "F.scaled_dot_product_attention on contiguous (B,NH,T,hs) tensors under each backend, the fastest "
                   "kept; both timed over >= 50 ms after warm-up on random data (spill: host clock around a "
                   "synchronised run; torch: CUDA events)",
                   "ratio_torch_over_spill >= 1 means spill is as fast or faster",
                   "spill_*: the default kernels, named in spill_kernels (AttentionKernels); spill_one_tile_*: "
                   "the same calls with SPILL_FLASH_FWD=1 (flash_fwd_bf16_hs64, the mma.sync one-tile forward); "
                   "the backward kernels are the same",
                   "gpt: whole training steps in VRAM, bf16, fp32 master weights, AdamW, grad clip; torch.compile "
                   "regional (each block and the head+loss compiled, torch_ref.py with SPILL_TORCH_COMPILE=1); "
                   "tokens/s over the steps after warm-up (compilation excluded); llama1b: spill's llama3.2-1b preset "
                   "(B 4, T 2048) against transformers' LlamaForCausalLM with each decoder layer compiled "
                   "(tools/bench/llama_ref.py bench, median step), its model TFLOP/s from the engine's FLOP count",
                   "host_issue_*: the spill queue goroutines' time issuing CUDA work per step (cuda.HostStats), "
                   "not counting host_wait_ms_per_step, the time they waited instead (cuda.HostWait: for the device, "
                   "which they run at most ~256 jobs ahead of, or for another queue's event); share_of_step well "
                   "below 1 means the host is not the bottleneck",
               ])
    sa, ta = load(d, "spill_attn.json"), load(d, "torch_attn.json")
    if sa:
        rep["machine"]["spill"] = sa.get("machine")
    if ta:
        rep["machine"]["torch"] = ta.get("machine")
    rows = []
    tmap = {(r["hs"], r["t"]): r for r in (ta or {}).get("attention", [])}
    one = {(r["hs"], r["t"]): r for r in (load(d, "spill_attn1.json") or {}).get("attention", [])}
    for s in (sa or {}).get("attention", []):
        t = tmap.get((s["hs"], s["t"]), {})
        row = dict(hs=s["hs"], t=s["t"], b=s["b"], nh=s["nh"], spill_fwd_ms=s["fwd_ms"], spill_bwd_ms=s["bwd_ms"],
                   spill_fwd_bwd_ms=s["fwd_ms"] + s["bwd_ms"], spill_kernels=s.get("kernels"))
        if "fwd_bwd_ms" in t:
            row.update(torch_backend=t["fastest"], torch_fwd_ms=t["fwd_ms"], torch_bwd_ms=t["bwd_ms"],
                       torch_fwd_bwd_ms=t["fwd_bwd_ms"],
                       ratio_fwd_torch_over_spill=t["fwd_ms"] / s["fwd_ms"],
                       ratio_bwd_torch_over_spill=t["bwd_ms"] / s["bwd_ms"],
                       ratio_torch_over_spill=t["fwd_bwd_ms"] / (s["fwd_ms"] + s["bwd_ms"]))
        for vf in sorted(os.listdir(d)):
            m = re.match(r"spill_attn_v_(.+)\.json$", vf)
            if not m:
                continue
            for va in (load(d, vf) or {}).get("attention", []):
                if (va["hs"], va["t"]) == (s["hs"], s["t"]):
                    row.setdefault("variants", {})[m.group(1)] = dict(
                        fwd_ms=va["fwd_ms"], bwd_ms=va["bwd_ms"], kernels=va.get("kernels"),
                        ratio_default_over_variant=(s["fwd_ms"] + s["bwd_ms"]) / (va["fwd_ms"] + va["bwd_ms"]))
        s1 = one.get((s["hs"], s["t"]))
        if s1:
            row.update(spill_one_tile_fwd_ms=s1["fwd_ms"], spill_one_tile_bwd_ms=s1["bwd_ms"],
                       ratio_fwd_one_tile_over_default=s1["fwd_ms"] / s["fwd_ms"])
        rows.append(row)
    rep["attention"] = rows
    gpt = load(d, "gpt.json")
    tcomp = dict((load(d, "torch_compile.json") or {}).get("shapes", {}))
    tl = load(d, "torch_llama.json")
    if tl and tl.get("tokens_per_sec"):
        tcomp["llama1b"] = dict(tokens_per_sec=tl["tokens_per_sec"], compiled=tl.get("compiled"), impl=tl.get("impl"),
                                peak_device_gib=(tl.get("peak_memory_bytes") or 0) / 2**30)
    grows = []
    for sh in (gpt or {}).get("shapes", []):
        sp, tc = sh.get("spill", {}), tcomp.get(sh["name"]) or sh.get("torch") or {}
        ratio = None
        if sp.get("tokens_per_sec") and tc.get("tokens_per_sec"):
            ratio = sp["tokens_per_sec"] / tc["tokens_per_sec"]
        row = dict(name=sh["name"], preset=sh.get("preset"), layers=sh.get("layers") or None,
                   embd=sh.get("embd") or None, heads=sh.get("heads") or None, t=sh["seq_len"],
                   batch=sh["batch"], params=sh.get("params") or None, spill_tokens_per_sec=sp.get("tokens_per_sec"),
                   spill_model_tflops=sp.get("model_tflops"), spill_step_ms_median=sp.get("step_ms_median"),
                   spill_peak_gib=sp.get("peak_device_gib"), spill_error=sp.get("error"),
                   host_jobs_per_step=sp.get("host_jobs_per_step"),
                   host_launches_per_step=sp.get("host_launches_per_step"),
                   host_issue_ms_per_step=sp.get("host_issue_ms_per_step"),
                   host_issue_ns_per_job=sp.get("host_issue_ns_per_job"),
                   host_issue_share_of_step=sp.get("host_issue_share_of_step"),
                   host_wait_ms_per_step=sp.get("host_wait_ms_per_step"),
                   torch_compile_tokens_per_sec=tc.get("tokens_per_sec"),
                   torch_compile_model_tflops=tc.get("model_tflops"), torch_compiled=tc.get("compiled"), torch_impl=tc.get("impl"),
                   torch_peak_gib=tc.get("peak_device_gib"),
                   ratio_spill_over_torch_compile=ratio)
        grows.append({k: v for k, v in row.items() if v is not None})
    rep["gpt"] = grows
    if gpt:
        rep["machine"]["gpubench"] = gpt.get("machine")
    for name in ("gemm_default", "gemm_reduced"):
        g = load(d, name + ".json")
        if g:
            rep[name] = dict(spill=g.get("spill_gemms"), ratio_spill_over_torch=g.get("gemm_ratio_spill_over_torch"),
                             torch=(g.get("torch_kernels") or {}).get("gemms"))
    try:
        with open(os.path.join(d, "gobench.log")) as f:
            rep["go_benchmarks"] = [l.rstrip() for l in f if re.match(r"^(Benchmark|ok|PASS|FAIL)", l)]
    except OSError:
        pass
    json.dump(rep, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
