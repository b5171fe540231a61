#!/usr/bin/env python3
"""Anchor for the MoE layer benchmark (hyserve-bench-cuda moe): the same Qwen3-Next shape
(hidden 2048, 512 experts, top 10, expert width 512, shared expert 512 with a sigmoid gate,
bf16 weights) at 1, 64 and 8192 tokens, in PyTorch, two ways:

  per_expert  router, softmax top-k (renormalised), tokens grouped by expert (torch.sort),
              then a loop over the experts that received tokens: gate/up GEMM, SiLU-gated
              product, down GEMM, weighted index_add_ into the output (cuBLAS per expert;
              the host reads the counts, as a per-expert loop must);
  grouped_mm  the same routing and permutation, the experts as two torch._grouped_mm calls
              over all experts (offsets on the device), then the weighted combine.

Both add the shared expert and its gate. Timed with CUDA events: median of --reps runs after
--warmup runs. "experts" columns time the routed experts alone (from given logits), "layer"
adds router and shared expert, as hyserve-bench-cuda's moe_experts / moe_layer rows do.

  python3 bench/moe_anchor.py [--tokens 1 64 8192] [--reps 20] [--warmup 5]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F

H, E, K, I, IS = 2048, 512, 10, 512, 512


def route(logits):
    p = torch.softmax(logits.float(), dim=-1)
    w, ids = torch.topk(p, K, dim=-1)  # ties: torch's order; timing only
    w = w / w.sum(dim=-1, keepdim=True)
    return w, ids


def permute(ids):
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    return order, counts


def experts_per_expert(x, logits, gate_up, down):
    T = x.shape[0]
    w, ids = route(logits)
    order, counts = permute(ids)
    tok = order // K
    xs = x[tok].to(torch.bfloat16)
    out = torch.zeros(T, H, device=x.device, dtype=torch.float32)
    wf = w.reshape(-1)[order]
    start = 0
    for e, c in enumerate(counts.tolist()):
        if c == 0:
            continue
        xe = xs[start:start + c]
        gu = xe @ gate_up[e].t()
        a = F.silu(gu[:, :I]) * gu[:, I:]
        y = (a @ down[e].t()).float()
        out.index_add_(0, tok[start:start + c], y * wf[start:start + c, None])
        start += c
    return out


def experts_grouped(x, logits, gate_up_t, down_t):
    T = x.shape[0]
    w, ids = route(logits)
    order, counts = permute(ids)
    tok = order // K
    xs = x[tok].to(torch.bfloat16)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    gu = torch._grouped_mm(xs, gate_up_t, offs=offs)
    a = F.silu(gu[:, :I]) * gu[:, I:]
    y = torch._grouped_mm(a, down_t, offs=offs).float()
    out = torch.zeros(T, H, device=x.device, dtype=torch.float32)
    out.index_add_(0, tok, y * w.reshape(-1)[order][:, None])
    return out


def layer(x, router, experts_fn, shared):
    logits = (x.to(torch.bfloat16) @ router.t()).float()
    out = experts_fn(x, logits)
    sg, su, sd, gw = shared
    xb = x.to(torch.bfloat16)
    ys = (F.silu(xb @ sg.t()) * (xb @ su.t())) @ sd.t()
    gate = torch.sigmoid((xb @ gw.t()).float())
    return out + gate * ys.float()


def time_ms(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 64, 8192])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    s = H ** -0.5
    gate_up = (torch.randn(E, 2 * I, H, device=dev) * s).to(torch.bfloat16)
    down = (torch.randn(E, H, I, device=dev) * s).to(torch.bfloat16)
    router = (torch.randn(E, H, device=dev) * s).to(torch.bfloat16)
    shared = tuple((torch.randn(*shape, device=dev) * s).to(torch.bfloat16)
                   for shape in [(IS, H), (IS, H), (H, IS), (1, H)])
    gate_up_t, down_t = gate_up.transpose(-2, -1), down.transpose(-2, -1)  # [E, H, 2I], [E, I, H]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'tokens':>7} {'variant':>11} {'experts_ms':>11} {'layer_ms':>9} {'TFLOP/s':>8}")
    for T in args.tokens:
        x = torch.rand(T, H, device=dev) * 2 - 1
        logits = (x.to(torch.bfloat16) @ router.t()).float()
        flops = 2.0 * T * K * 3 * H * I
        variants = {
            "per_expert": lambda xx, ll: experts_per_expert(xx, ll, gate_up, down),
            "grouped_mm": lambda xx, ll: experts_grouped(xx, ll, gate_up_t, down_t),
        }
        best = None
        for name, fn in variants.items():
            try:
                e_ms = time_ms(lambda: fn(x, logits), args.reps, args.warmup)
                l_ms = time_ms(lambda: layer(x, router, fn, shared), args.reps, args.warmup)
            except Exception as ex:  # e.g. torch._grouped_mm missing or refusing the shapes
                print(f"{T:>7} {name:>11} failed: {type(ex).__name__}: {ex}")
                continue
            print(f"{T:>7} {name:>11} {e_ms:>11.4f} {l_ms:>9.4f} {flops / (e_ms * 1e-3) / 1e12:>8.1f}")
            if best is None or e_ms < best[1]:
                best = (name, e_ms, l_ms)
        if best:
            print(f"{T:>7} {'anchor':>11} {best[1]:>11.4f} {best[2]:>9.4f}  ({best[0]}, the faster)")


if __name__ == "__main__":
    main()
