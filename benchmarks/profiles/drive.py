"""Loop one normalizer's forward (or forward+backward) at one shape, for `perf record`.

    python -m benchmarks.profiles.drive NAME ROWS K [--scale S] [--mode fwd|fwdbwd|bwd] [--seconds T]
NAME is a registry name, NAME:log (its log_prob) or `softmax` / `log_softmax`; one thread (torch.set_num_threads(1)).
Prints the median time per call (loaded machine: relative figures only).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import sparsenorm
from sparsenorm import registry


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("rows", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--mode", default="fwdbwd", choices=("fwd", "fwdbwd", "bwd"))
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--reference", action="store_true", help="sparsenorm.kernels.disabled()")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = (torch.randn(a.rows, a.k) * a.scale).requires_grad_(a.mode != "fwd")
    if a.name == "softmax":
        fn = lambda t: torch.softmax(t, -1)
    elif a.name == "log_softmax":
        fn = lambda t: torch.log_softmax(t, -1)
    elif a.name.endswith(":log"):  # the registry's log_prob (ev_softmax: the log of Eq. 10)
        log_prob = registry.get(a.name[:-4]).log_prob
        fn = lambda t: log_prob(t, dim=-1)
    else:
        forward = registry.get(a.name).forward
        fn = lambda t: forward(t, dim=-1)
    g = torch.randn(a.rows, a.k)
    ctx = sparsenorm.kernels.disabled() if a.reference else _null()
    with ctx:
        y0 = fn(x) if a.mode == "bwd" else None

        def call():
            if a.mode == "fwd":
                with torch.no_grad():
                    fn(x)
            elif a.mode == "fwdbwd":
                y = fn(x)
                torch.autograd.grad(y, x, g)
            else:
                torch.autograd.grad(y0, x, g, retain_graph=True)

        for _ in range(3):
            call()
        _perf_control("enable")  # profile the timed loop only, not the imports and warm-up
        times = []
        end = time.perf_counter() + a.seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        _perf_control("disable")
    print(f"{a.name} {a.rows}x{a.k} scale {a.scale} {a.mode}: median {statistics.median(times) * 1e3:.3f} ms "
          f"over {len(times)} calls (loaded machine)")


def _perf_control(command: str) -> None:
    """Tell `perf record -D -1 --control fifo:CTL,ACK` (see record.sh) to start or stop sampling."""
    ctl, ack = os.environ.get("PERF_CTL_FIFO"), os.environ.get("PERF_ACK_FIFO")
    if not ctl:
        return
    with open(ctl, "w") as f:
        f.write(command + "\n")
    if ack:
        with open(ack) as f:
            f.readline()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
