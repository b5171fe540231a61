#!/usr/bin/env python3
"""Scaling model of a decode step under tensor parallelism (docs/SCALING.md).

For the Bamba-9B shape (configs/bamba-9b-synthetic-cuda.yaml) and the Qwen3-Next-80B-A3B shape,
per rank and decode step at TP 1/2/4/8: the bytes read (weights, recurrent state read and
written, KV pages read), the all-reduces (count and size) and all-gathers, and a predicted step
time on NVLink-connected H200s:

    t_step = bytes / hbm_bw + n_allreduce * (alpha + 2 (t-1)/t * size / busbw) + gather

Inputs and assumptions are printed with the table; change them on the command line.
"""
import argparse

BF16, F32 = 2, 4


def bamba_9b(t, batch, ctx):
    H, V, L, attn = 4096, 128256, 32, 3
    mamba = L - attn
    Di, Hm, P, N, G = 8192, 128, 64, 128, 1
    Hq, Hkv, D, I = 32, 8, 128, 14336
    w = V * H * BF16 / t  # lm_head (vocab-parallel); the embedding reads `batch` rows only
    w += mamba * (H * (2 * Di / t + 2 * G * N + Hm / t) + Di / t * H) * BF16  # in/out proj (1 group replicated)
    w += attn * (H * (Hq * D + 2 * max(1, Hkv // t) * D * (t if Hkv >= t else 1)) / t + Hq * D / t * H) * BF16
    w += L * 3 * H * I / t * BF16  # MLP gate, up, down
    state = batch * mamba * (Hm / t) * P * N * F32 * 2  # SSM state read + written (f32)
    kv = batch * attn * ctx * 2 * max(1, Hkv // t) * D * BF16  # K and V pages read
    n_ar = 2 * L + 1  # mixer + MLP per layer, the vocab-parallel embedding
    return dict(weights=w, state=state, kv=kv, n_allreduce=n_ar, ar_bytes=batch * H * F32,
                gather_bytes=batch * V * F32)


def qwen3_next_80b(t, batch, ctx):
    H, V, L, attn = 2048, 151936, 48, 12
    gdn = L - attn
    Hk, Hv, K, Dv = 16, 32, 128, 128
    Hq, Hkv, D = 16, 2, 256
    E, topk, Ie, Is = 512, 10, 512, 512
    w = V * H * BF16 / t
    w += gdn * (H * (2 * Hk * K + 2 * Hv * Dv + 2 * Hv) / t + Hv * Dv / t * H) * BF16  # qkvz, ba, out
    kvh = max(1, Hkv // t)
    w += attn * (H * (2 * Hq * D) / t + H * 2 * kvh * D + Hq * D / t * H) * BF16  # q+gate, k, v, o
    touched = E * (1 - (1 - topk / E) ** batch)  # distinct experts a batch routes to (uniform)
    w += L * (touched * 3 * H * Ie / t + 3 * H * Is / t + H * E + H) * BF16  # experts, shared, router, gate
    state = batch * gdn * (Hv / t) * K * Dv * F32 * 2
    kv = batch * attn * ctx * 2 * kvh * D * BF16
    n_ar = 2 * L + 1
    return dict(weights=w, state=state, kv=kv, n_allreduce=n_ar, ar_bytes=batch * H * F32,
                gather_bytes=batch * V * F32, touched=touched)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hbm-tbs", type=float, default=4.0, help="achieved HBM bandwidth, TB/s")
    ap.add_argument("--busbw-gbs", type=float, default=460.0, help="NCCL all-reduce bus bandwidth, GB/s")
    ap.add_argument("--alpha-us", type=float, default=15.0, help="latency of one small all-reduce, us")
    ap.add_argument("--ctx", type=int, default=1024, help="context length of every row")
    a = ap.parse_args()
    print(f"assumptions: HBM {a.hbm_tbs} TB/s achieved, all-reduce busbw {a.busbw_gbs} GB/s, "
          f"alpha {a.alpha_us} us per all-reduce, context {a.ctx}, bf16 weights and KV, f32 recurrent state\n")
    for name, fn in (("Bamba-9B", bamba_9b), ("Qwen3-Next-80B-A3B", qwen3_next_80b)):
        print(f"### {name}\n")
        print("| batch | TP | weights / rank | state / rank | KV / rank | all-reduces × size | "
              "memory time | collective time | predicted step |")
        print("|---|---|---|---|---|---|---|---|---|")
        for batch in (1, 64):
            for t in (1, 2, 4, 8):
                m = fn(t, batch, a.ctx)
                byts = m["weights"] + m["state"] + m["kv"]
                mem_ms = byts / (a.hbm_tbs * 1e12) * 1e3
                if t == 1:
                    coll_ms = 0.0
                else:
                    per = a.alpha_us * 1e-6 + 2 * (t - 1) / t * m["ar_bytes"] / (a.busbw_gbs * 1e9)
                    gather = a.alpha_us * 1e-6 + (t - 1) / t * m["gather_bytes"] / (a.busbw_gbs * 1e9)
                    coll_ms = (m["n_allreduce"] * per + gather) * 1e3
                print(f"| {batch} | {t} | {m['weights'] / 1e9:.2f} GB | {m['state'] / 1e9:.3f} GB | "
                      f"{m['kv'] / 1e9:.3f} GB | {m['n_allreduce'] if t > 1 else 0} × {m['ar_bytes'] / 1024:.0f} KiB | "
                      f"{mem_ms:.2f} ms | {coll_ms:.2f} ms | {mem_ms + coll_ms:.2f} ms |")
        print()


if __name__ == "__main__":
    main()
