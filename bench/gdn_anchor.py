#!/usr/bin/env python3
"""Anchor for the Gated DeltaNet prefill benchmark (hyserve-bench-gdn gdn_prefill rows): the
flash-linear-attention package's chunked kernel (fla.ops.gated_delta_rule.chunk_gated_delta_rule,
Triton) on Qwen3-Next's layer shape: 16 key heads, 32 value heads, K = V = 128, bf16 q, k, v
(q and k repeated to the 32 value heads, as transformers' Qwen3-Next does before calling it),
f32 gate g = -exp(A_log) * softplus(a + dt_bias) and beta = sigmoid(b), L2-normalised q and k
(use_qk_l2norm_in_kernel), an f32 initial and final state. Shapes: one sequence of T tokens and
T / 1024 sequences of 1024 (cu_seqlens), T = 16384 by default, as the benchmark's two prefill
shapes. Timed with CUDA events: median of --reps runs after --warmup runs.

Prints one line per shape, or one line saying why there is no anchor (the package is not
installed, no CUDA device), and exits 0 either way: the figure is reported beside the
benchmark's, never assumed.

  python3 bench/gdn_anchor.py [--tokens 16384] [--reps 20] [--warmup 5]
"""
import argparse
import statistics
import sys

HK, HV, DK, DV = 16, 32, 128, 128


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"gdn_anchor: no anchor: torch not importable ({e})")
        return 0
    if not torch.cuda.is_available():
        print("gdn_anchor: no anchor: no CUDA device")
        return 0
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as e:
        print(f"gdn_anchor: no anchor: flash-linear-attention not importable ({e})")
        return 0

    T = args.tokens
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(1, T, HK, DK, device=dev, generator=gen).to(torch.bfloat16)
    k = torch.randn(1, T, HK, DK, device=dev, generator=gen).to(torch.bfloat16)
    v = torch.randn(1, T, HV, DV, device=dev, generator=gen).to(torch.bfloat16)
    a = torch.randn(1, T, HV, device=dev, generator=gen)
    b = torch.randn(1, T, HV, device=dev, generator=gen)
    a_log = torch.log(torch.linspace(1.0, 16.0, HV, device=dev))
    dt_bias = torch.ones(HV, device=dev)

    def layer(cu_seqlens, n_seq):
        # The model's own steps around the kernel: gate, beta, q/k repeated to the value heads.
        g = -a_log.exp() * F.softplus(a + dt_bias)
        beta = b.sigmoid()
        qr = q.repeat_interleave(HV // HK, dim=2)
        kr = k.repeat_interleave(HV // HK, dim=2)
        h0 = torch.zeros(n_seq, HV, DK, DV, device=dev, dtype=torch.float32)
        o, ht = chunk_gated_delta_rule(qr, kr, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                                       cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=True)
        return o, ht

    def kernel_only(qr, kr, g, beta, h0, cu_seqlens):
        return chunk_gated_delta_rule(qr, kr, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                                      cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=True)

    def time_ms(fn):
        for _ in range(args.warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        return statistics.median(times)

    for n_seq in (1, T // 1024):
        cu = torch.arange(0, T + 1, T // n_seq, device=dev, dtype=torch.int32).to(torch.long)
        g = -a_log.exp() * F.softplus(a + dt_bias)
        beta = b.sigmoid()
        qr = q.repeat_interleave(HV // HK, dim=2)
        kr = k.repeat_interleave(HV // HK, dim=2)
        h0 = torch.zeros(n_seq, HV, DK, DV, device=dev, dtype=torch.float32)
        t_kernel = time_ms(lambda: kernel_only(qr, kr, g, beta, h0, cu))
        t_layer = time_ms(lambda: layer(cu, n_seq))
        shape = f"{T} tokens as {n_seq} x {T // n_seq}"
        print(f"gdn_anchor fla chunk_gated_delta_rule {shape}: kernel {t_kernel:.3f} ms, "
              f"with gate/beta/repeat {t_layer:.3f} ms ({T / t_kernel / 1e3:.1f} Mtok/s kernel)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
