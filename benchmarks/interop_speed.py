"""Speed of a torch model after ``bayesattn.convert``, against the same model unconverted.

One process, candidates timed alternately (median ms), ratios against torch (lower is better):

* ``convert`` (deterministic drop-in, uniform prior): torch's encoder layers keep their fused fast
  path in eval under ``no_grad``; with gradients both run the ordinary path;
* ``convert(family="dirichlet")`` in ``"mean"`` mode: the layer computes exactly torch's
  attention there, so torch's fast path stays on (goal: within 1.05x of torch), with and without
  a padding mask;
* the same in ``"guide"`` mode, and the posterior predictive of ``S`` samples by batched
  repetition vs vectorised (``bayesattn.num_samples``), each against ``S`` torch passes;
* the last-layer recipe (``convert(model, config=AttentionConfig.last_layer())``: the last
  layer Bayesian) and its 8-sample predictive (``bayesattn.uncertainty.predict``, folded: the
  layers before the last run once) against ONE torch forward (goal: within 2x), with the full
  batched repetition (every layer on ``8·B`` rows) for reference; the same for a small
  Hugging Face BERT (``convert_hf``; skipped without transformers) against its eager forward.

Usage: python benchmarks/interop_speed.py [--quick] [--threads N] [--repeats R] [--inference-only]
"""

from __future__ import annotations

import argparse
import copy

import torch
from _results import table, write_results
from _timing import interleaved
from torch import nn

import bayesattn
from bayesattn import AttentionConfig, attention_mode
from bayesattn.posthoc import _svi_core as posthoc
from bayesattn.predictive.foreign import sample_foreign
from bayesattn.uncertainty import predict


class Classifier(nn.Module):
    def __init__(self, d: int, h: int, layers: int) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, h, 4 * d, 0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.encoder(x, src_key_padding_mask=pad).mean(-2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=None, help="timed repeats (default 30, 5 quick)")
    p.add_argument("--inference-only", action="store_true", help="skip backward and predictive (prints only; results/*.json keeps the full run)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    B, T, D, H, L, S = (8, 16, 32, 4, 2, 8) if args.quick else (32, 64, 64, 4, 4, 16)
    reps = args.repeats or (5 if args.quick else 30)
    ref = Classifier(D, H, L).eval()
    det = bayesattn.convert(copy.deepcopy(ref))
    bay = bayesattn.convert(copy.deepcopy(ref), family="dirichlet")
    x = torch.randn(B, T, D)
    print(f"B={B} T={T} d={D} heads={H} layers={L} S={S} threads={args.threads}")

    tables: list[dict] = []
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[B // 2 :, T // 2 :] = True  # half the batch padded to half length
    for label, kpm in (("no padding", None), ("padding", pad)):
        with torch.no_grad():
            def bay_mean(kpm=kpm):
                with attention_mode("mean"):
                    bay(x, kpm)

            def bay_draw(kpm=kpm):  # eval() alone gives the posterior mean (torch's eval)
                with attention_mode("guide"):
                    bay(x, kpm)

            r = interleaved(
                {"torch": lambda kpm=kpm: ref(x, kpm), "convert": lambda kpm=kpm: det(x, kpm),
                 "bayes mean": bay_mean, "bayes posterior": bay_draw},
                reps,
            )  # fmt: skip
        print(f"\ninference (eval, no_grad, {label}), ms and ratio to torch:")
        for k, v in r.items():
            print(f"  {k:18s} {v:8.3f} ms  x{v / r['torch']:.2f}")
        tables.append(_table(f"Inference (eval, no_grad, {label})", r, "torch"))

    shapes = f"B={B}, T={T}, d={D}, heads={H}, layers={L}"
    if args.inference_only:  # a partial run: printed, not written over the full results file
        return

    def fb(m):
        return lambda: m(x).sum().backward()

    r = interleaved({"torch": fb(ref), "convert": fb(det)}, reps)
    print("\nforward+backward (ordinary path for both):")
    for k, v in r.items():
        print(f"  {k:18s} {v:8.3f} ms  x{v / r['torch']:.2f}")
    tables.append(_table("Forward+backward (the ordinary path for both)", r, "torch"))

    with torch.no_grad():

        def torch_s():
            for _ in range(S):
                ref(x)

        r = interleaved(
            {"torch x S": torch_s,
             "repeat": lambda: posthoc.sample_probs(bay, x, S, method="repeat"),
             "vectorised": lambda: posthoc.sample_probs(bay, x, S, method="vectorised")},
            max(3, reps // 3),
        )  # fmt: skip
    print(f"\nposterior predictive, {S} samples (vs {S} deterministic torch passes):")
    for k, v in r.items():
        print(f"  {k:18s} {v:8.3f} ms  x{v / r['torch x S']:.2f}")
    tables.append(
        _table(f"Posterior predictive of {S} samples against {S} torch passes", r, "torch x S")
    )
    tables += _last_layer(ref, x, reps, D, H, L)
    _write(tables, shapes)


def _last_layer(ref: nn.Module, x: torch.Tensor, reps: int, D: int, H: int, L: int) -> list:
    """The last-layer recipe's 8-sample predictive against one torch forward (torch and HF)."""
    S, out = 8, []
    rec = bayesattn.convert(copy.deepcopy(ref), config=AttentionConfig.last_layer())
    models = [("torch encoder", ref, rec, x, None)]
    try:
        import transformers

        from bayesattn.interop.hf import convert_hf

        cfg = transformers.BertConfig(
            hidden_size=D, num_hidden_layers=L, num_attention_heads=H, intermediate_size=4 * D,
            vocab_size=100, max_position_embeddings=x.shape[1], num_labels=10,
            attn_implementation="eager",
        )  # fmt: skip
        bert = transformers.BertForSequenceClassification(cfg).eval()
        ids = {"input_ids": torch.randint(0, 100, x.shape[:2])}
        hf = convert_hf(copy.deepcopy(bert), config=AttentionConfig.last_layer())
        models.append(("HF BERT", bert, hf, ids, lambda m, v: m(**v).logits))
    except ImportError:
        print("(transformers not installed: the HF BERT row is skipped)")
    for name, base, conv, inp, fwd in models:
        with torch.no_grad():
            r = interleaved(
                {"torch x 1": lambda b=base, i=inp, f=fwd: f(b, i) if f else b(i),
                 "folded (predict)": lambda c=conv, i=inp, f=fwd: predict(c, i, S, forward=f),
                 "full repetition": lambda c=conv, i=inp, f=fwd: sample_foreign(
                     c, i, S, None, "guide", f, 1.0, False, fold=False)},
                max(3, reps // 3),
            )  # fmt: skip
        print(f"\n{name}, last-layer recipe, {S}-sample predictive vs ONE forward:")
        for k, v in r.items():
            print(f"  {k:18s} {v:8.3f} ms  x{v / r['torch x 1']:.2f}")
        title = f"Recommended recipe ({name}): {S}-sample predictive against one torch forward"
        out.append(_table(title, r, "torch x 1"))
    return out


def _write(tables: list[dict], shapes: str) -> None:
    for t in tables:
        t["title"] += f" ({shapes})"
    path = write_results(
        "interop_speed", "A torch model after bayesattn.convert against itself", tables
    )
    print(f"wrote {path}")


def _table(title: str, r: dict[str, float], base: str) -> dict:
    rows = [[k, round(v, 3), round(v / r[base], 3)] for k, v in r.items()]
    return table(title, ["candidate", "ms", f"ratio vs {base}"], rows)


if __name__ == "__main__":
    main()
