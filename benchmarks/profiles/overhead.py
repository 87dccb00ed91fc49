"""Fixed per-call cost: forward and forward+backward on a 4 x 16 float32 tensor (where the row
work is negligible), per-thread CPU time (time.thread_time, less disturbed by other processes
than wall clock), best of 5 rounds of 2000 calls, one thread.

    python -m benchmarks.profiles.overhead     (from the repository root)
"""
import time

import torch

from sparsenorm import registry

torch.set_num_threads(1)
x = torch.randn(4, 16, requires_grad=True)
g = torch.randn(4, 16)


def t(fn, n=2000):
    for _ in range(50):
        y = fn(x)
        torch.autograd.grad(y, x, g)
    ts = []
    for _ in range(5):
        t0 = time.thread_time()
        for _ in range(n):
            y = fn(x)
            torch.autograd.grad(y, x, g)
        ts.append((time.thread_time() - t0) / n * 1e6)
    tf = []
    with torch.no_grad():
        for _ in range(5):
            t0 = time.thread_time()
            for _ in range(n):
                fn(x)
            tf.append((time.thread_time() - t0) / n * 1e6)
    return min(tf), min(ts)


print("softmax fwd %.1f us, fwd+bwd %.1f us" % t(lambda z: torch.softmax(z, -1)))
print("log_softmax fwd %.1f us, fwd+bwd %.1f us" % t(lambda z: torch.log_softmax(z, -1)))
for n in ["ev_softmax", "sparsemax", "entmax15", "entmax_bisect", "t_softmax", "r_softmax", "sparsehourglass"]:
    f = registry.get(n).forward
    print(n, "fwd %.1f us, fwd+bwd %.1f us" % t(lambda z: f(z, dim=-1)))
lp = registry.get("ev_softmax").log_prob
print("ev_softmax log fwd %.1f us, fwd+bwd %.1f us" % t(lambda z: lp(z, dim=-1)))
