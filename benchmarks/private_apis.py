"""What the two private torch functions we keep buy, against their public equivalents, in one process.

Prints ratios (private / public, lower is better; < 1 means the private call is faster):
  * ``torch._softmax(x, -1, False, out=x)`` (in-place softmax over fresh scores, the inference
    path of ``BayesianMultiheadAttention`` and ``kernels``) vs ``torch.softmax(x, -1)``;
  * ``torch._standard_gamma(c)`` (the Dirichlet/Gamma draws in ``families``) vs the public
    ``torch.distributions.Gamma(c, 1).rsample()``, forward and forward+backward.

``tests/cross_cutting/test_private_apis.py`` checks that both private functions still exist with the signature
we call and give the public path's numbers, so a torch upgrade that changes them fails loudly.

Usage: python benchmarks/private_apis.py [--quick] [--threads N]
"""

from __future__ import annotations

import argparse

import torch
from _timing import interleaved


def softmax_case(shape: tuple[int, ...], repeats: int) -> dict:
    scale = shape[-1] ** -0.5
    q = torch.randn(shape[:-1] + (64,))
    k = torch.randn(shape[:-2] + (shape[-1], 64))

    def private():  # what attention.py does: fresh scores, softmax in place
        a = q @ k.transpose(-1, -2) * scale
        return torch._softmax(a, -1, False, out=a)

    def public():
        a = q @ k.transpose(-1, -2) * scale
        return torch.softmax(a, -1)

    with torch.no_grad():
        return interleaved({"private": private, "public": public}, repeats)


def gamma_case(shape: tuple[int, ...], repeats: int, backward: bool) -> dict:
    c = (torch.rand(shape) * 20 + 0.1).requires_grad_(backward)

    def private():
        g = torch._standard_gamma(c)
        if backward:
            g.sum().backward()

    def public():
        g = torch.distributions.Gamma(c, torch.ones(()), validate_args=False).rsample()
        if backward:
            g.sum().backward()

    return interleaved({"private": private, "public": public}, repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, smaller shapes")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    reps = 7 if args.quick else 25
    lengths = (128, 512) if args.quick else (128, 512, 1024)
    print(f"torch {torch.__version__}, {args.threads} thread(s); ratio = private / public")
    for t in lengths:
        r = softmax_case((2, 8, t, t), reps)
        print(
            f"softmax  (2, 8, {t}, {t}) in place: private {r['private']:.2f} ms, "
            f"public {r['public']:.2f} ms, ratio {r['private'] / r['public']:.2f}"
        )
    for shape in [(8, 4, 16, 16), (8, 4, 64, 64)] + ([] if args.quick else [(8, 4, 256, 256)]):
        for bwd in (False, True):
            r = gamma_case(shape, reps, bwd)
            what = "fwd+bwd" if bwd else "fwd    "
            print(
                f"gamma    {shape} {what}: private {r['private']:.2f} ms, "
                f"public {r['public']:.2f} ms, ratio {r['private'] / r['public']:.2f}"
            )


if __name__ == "__main__":
    main()
