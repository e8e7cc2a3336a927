"""Writes ooc_h200.json from the runs of tools/bench/ooc_h200.sh: per run
the command, exit status, median tokens/s over the steady steps, model
TFLOP/s (6 x params x tokens/s), time to the first step, bytes moved per
step, peak host RSS against the planned host bytes and, with a trace, the
exposed transfer share; then the issue's targets as side-by-side ratios.

    python3 tools/bench/ooc_report.py RUNS_DIR OUT.json COMMIT MACHINE
"""

import datetime
import glob
import json
import os
import re
import statistics
import sys


def load_run(d, name):
    r = {"name": name}
    for ext, key in ((".cmd", "command"), (".rc", "exit")):
        p = os.path.join(d, name + ext)
        if os.path.exists(p):
            r[key] = open(p).read().strip()
    ms = []
    p = os.path.join(d, name + ".jsonl")
    if os.path.exists(p):
        for line in open(p):
            line = line.strip()
            if line:
                ms.append(json.loads(line))
    plan = None
    p = os.path.join(d, name + ".plan.json")
    if os.path.exists(p):
        plan = json.load(open(p))
    out = ""
    p = os.path.join(d, name + ".out")
    if os.path.exists(p):
        out = open(p).read()
    err = ""
    p = os.path.join(d, name + ".err")
    if os.path.exists(p):
        err = open(p).read()[-2000:]
    r["steps"] = len(ms)
    r["losses"] = [m["loss"] for m in ms]
    r["grad_norms"] = [m.get("grad_norm") for m in ms]
    steady = ms[2:] if len(ms) > 3 else ms[1:] if len(ms) > 1 else ms
    tps = [m["tokens_per_sec"] for m in steady if m.get("tokens_per_sec")]
    if tps:
        r["tokens_per_sec"] = statistics.median(tps)
    params = (plan or {}).get("params")
    if params and tps:
        r["params"] = params
        r["model_tflops"] = 6 * params * r["tokens_per_sec"] / 1e12
    for k in ("h2d_bytes", "d2h_bytes", "disk_bytes"):
        v = [m.get(k, 0) for m in steady]
        if v:
            r[k + "_per_step"] = statistics.median(v)
    rss = [m.get("host_rss_bytes", 0) for m in ms]
    if rss:
        r["host_rss_max_bytes"] = max(rss)
    m = re.search(r"first step\s+(\S+) after start(?: \(([^)]*)\))?", out)
    if m:
        r["first_step"] = m.group(1)
        if m.group(2):
            r["start_up"] = m.group(2)
    m = re.search(r"peak RSS ([^\n(]+)", out)
    if m:
        r["peak_rss"] = m.group(1).strip()
    if plan and plan.get("memory"):
        h = plan["memory"][1]
        r["planned_host_bytes"] = h["peak"] - h.get("reserve", 0)
        r["plan"] = {k: plan.get(k) for k in ("micro_batch", "accum", "group", "weights", "grads", "optimizer",
                                               "prefetch_depth", "act_keep", "act_offload", "act_recompute", "optimizer_layers", "checkpoints_on_host", "notes",
                                               "step_time_s", "tokens_per_s", "bottleneck")}
        if r.get("host_rss_max_bytes") and r["planned_host_bytes"] > 0:
            r["rss_over_planned_host"] = r["host_rss_max_bytes"] / r["planned_host_bytes"]
    tw = [m for m in ms if "trace_wall_s" in m and m.get("step", 0) >= 2]  # timed steps (every run samples some)
    if tw:
        r["exposed_transfer_share"] = statistics.median(m["trace_exposed_transfer_s"] / m["trace_wall_s"] for m in tw)
        r["trace_compute_share"] = statistics.median(m["trace_compute_s"] / m["trace_wall_s"] for m in tw)
        r["trace_optimizer_s"] = statistics.median(m["trace_optimizer_s"] for m in tw)
        if all("trace_exposed_optimizer_s" in m for m in tw):
            r["exposed_optimizer_share"] = statistics.median(m["trace_exposed_optimizer_s"] / m["trace_wall_s"] for m in tw)
    r["summary"] = out[-1500:]
    if r.get("exit") not in (None, "0"):
        r["stderr_tail"] = err
    return r


def main():
    d, path, commit, machine = sys.argv[1:5]
    runs = {}
    for p in sorted(glob.glob(os.path.join(d, "*.cmd"))):
        name = os.path.basename(p)[:-4]
        if name.startswith("fsdp"):
            continue
        runs[name] = load_run(d, name)
    fsdp = None
    p = os.path.join(d, "fsdp-1.3b-8.json")
    if os.path.exists(p):
        try:
            fsdp = json.loads(open(p).read().strip().splitlines()[-1])
        except Exception as e:  # the reference failed: say so
            fsdp = {"error": str(e), "stderr_tail": open(os.path.join(d, "fsdp-1.3b-8.err")).read()[-2000:]}
        fsdp["command"] = open(os.path.join(d, "fsdp-1.3b-8.cmd")).read().strip()

    def tps(n):
        return runs.get(n, {}).get("tokens_per_sec")

    targets = []
    v, o = tps("vram-1.3b-64"), tps("ooc-1.3b-64-8g")
    if v and o:
        targets.append({"what": "gpt2-1.3b, 64 seq/step, 8 GiB vs in VRAM (same call)", "ratio": o / v, "target": 0.9,
                        "met": o / v >= 0.9, "ooc_tokens_per_sec": o, "vram_tokens_per_sec": v})
    fu = tps("ooc-1.3b-64-8g-full")
    if v and fu:
        targets.append({"what": "gpt2-1.3b, 64 seq/step, 8 GiB, whole-block recomputation only (--activations recompute-full) vs in VRAM",
                        "ratio": fu / v, "target": 0.9, "met": fu / v >= 0.9,
                        "selective_gain": (o / fu) if o else None})
    ce = tps("ceil-1.3b-64-sel")
    if v and ce:
        targets.append({"what": "ceiling: gpt2-1.3b, 64 seq/step, the same selective recomputation with everything else on the device (40 GiB) vs in VRAM",
                        "ratio": ce / v, "ooc_over_ceiling": (o / ce) if o else None})
    nc = tps("ooc-1.3b-64-8g-noclip")
    if v and nc:
        targets.append({"what": "gpt2-1.3b, 64 seq/step, 8 GiB, --grad-clip 0 (no update waits for the norm) vs in VRAM",
                        "ratio": nc / v, "target": 0.9, "met": nc / v >= 0.9})
    dl = tps("ooc-1.3b-64-8g-delayed")
    if v and dl:
        targets.append({"what": "gpt2-1.3b, 64 seq/step, 8 GiB, --delayed-update vs in VRAM", "ratio": dl / v, "target": 0.9,
                        "met": dl / v >= 0.9})
    s8 = tps("ooc-1.3b-8-8g")
    if s8 and fsdp and fsdp.get("tokens_per_sec"):
        r = s8 / fsdp["tokens_per_sec"]
        targets.append({"what": "gpt2-1.3b, 8 seq/step, 8 GiB vs PyTorch FSDP2 CPUOffloadPolicy(pin_memory=True)",
                        "ratio": r, "target": 5, "met": r >= 5, "spill_tokens_per_sec": s8,
                        "fsdp_tokens_per_sec": fsdp["tokens_per_sec"]})
    r67 = runs.get("ooc-6.7b-64-16g", {})
    if r67.get("model_tflops"):
        targets.append({"what": "gpt2-6.7b, 64 seq/step, 16 GiB, default budgets: model TFLOP/s", "value": r67["model_tflops"],
                        "target": 300, "met": r67["model_tflops"] >= 300})
    a, b = runs.get("vram-1.3b-64", {}).get("losses"), runs.get("ooc-1.3b-64-8g", {}).get("losses")
    if a and b:
        n = min(len(a), len(b))
        d = max(abs(a[i] - b[i]) / abs(a[i]) for i in range(n))
        targets.append({"what": f"losses out of core vs in VRAM over {n} steps (bf16)", "max_relative_difference": d,
                        "target": "within bf16 noise (< 1e-2)", "met": d < 1e-2})
    doc = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit, "machine": machine, "script": "bash tools/bench/ooc_h200.sh",
        "targets": targets, "runs": runs, "fsdp": fsdp,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(targets, indent=1))


if __name__ == "__main__":
    main()
