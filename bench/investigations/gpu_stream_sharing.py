"""Checks two assumptions of the sim backend's cost model on a real GPU (needs torch with CUDA).

1. Kernels on two streams of one GPU share it: two large GEMMs issued on two streams take about as long
   as the same two run back to back (the sim runs k concurrent kernels at 1/k speed each).
2. A host-to-device copy from pinned memory overlaps a GEMM on another stream at full speed (the sim
   gives the host link its own rate, independent of the compute streams).

Run on the GPU machine: python3 bench/investigations/gpu_stream_sharing.py  (prints a markdown table)
"""

from __future__ import annotations

import statistics

import torch


def timed(fn, repeats: int = 7) -> float:
    """Median wall seconds of `fn`, measured with CUDA events after a warm-up."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)


def main() -> None:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    host = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
    dev = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")

    def one():
        torch.matmul(a, b, out=outs[0])

    def sequential():
        torch.matmul(a, b, out=outs[0])
        torch.matmul(a, b, out=outs[1])

    def two_streams():
        main = torch.cuda.current_stream()
        for s, out in ((s1, outs[0]), (s2, outs[1])):
            s.wait_stream(main)
            with torch.cuda.stream(s):
                torch.matmul(a, b, out=out)
        main.wait_stream(s1)
        main.wait_stream(s2)

    def copy():
        dev.copy_(host, non_blocking=True)

    def copy_and_gemms():
        main = torch.cuda.current_stream()
        s1.wait_stream(main)
        with torch.cuda.stream(s1):
            dev.copy_(host, non_blocking=True)
        for _ in range(8):
            torch.matmul(a, b, out=outs[0])
        main.wait_stream(s1)

    def gemms8():
        for _ in range(8):
            torch.matmul(a, b, out=outs[0])

    flops = 2 * n**3
    t_one, t_seq, t_two = timed(one), timed(sequential), timed(two_streams)
    t_copy, t_g8, t_both = timed(copy), timed(gemms8), timed(copy_and_gemms)
    print(f"device: {torch.cuda.get_device_name()}")
    print("| measurement | seconds | derived |")
    print("| --- | --- | --- |")
    print(f"| one bf16 GEMM {n}^3 | {t_one:.5f} | {flops / t_one / 1e12:.0f} TFLOP/s |")
    print(f"| two GEMMs back to back | {t_seq:.5f} | {t_seq / t_one:.2f}x one |")
    print(f"| two GEMMs on two streams | {t_two:.5f} | {t_two / t_seq:.2f}x back to back (sim assumes 1.00) |")
    print(f"| 1 GiB pinned H2D copy | {t_copy:.5f} | {(1 << 30) / t_copy / 1e9:.1f} GB/s |")
    print(f"| 8 GEMMs | {t_g8:.5f} | |")
    print(f"| 1 GiB copy beside 8 GEMMs | {t_both:.5f} | {t_both / max(t_copy, t_g8):.2f}x the longer alone (sim assumes 1.00) |")


if __name__ == "__main__":
    main()
