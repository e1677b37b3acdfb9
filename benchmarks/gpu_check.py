"""Device check: the study's models, converted models and the posterior predictive on a GPU.

For each model group, on ``--device`` (default ``cuda``) in float32 and bfloat16, one process:

* **numerics**: every deterministic output (the baseline, and the Bayesian models in posterior-mean
  mode) against the same model's float32 output on the CPU: max ``|Δ|`` of the logits over
  ``1 + max |ref|`` must be below 1e-3 in float32 and 0.1 in bfloat16 (a loose bound: 8 bits of
  mantissa); every output finite; posterior-predictive probabilities (``S = 8`` draws, random, so
  not compared with the CPU) finite and summing to 1;
* **speed**: the candidates timed alternately (median ms, the device synchronised after each
  call), ratios against the group's deterministic/torch baseline (lower is better).

Groups: the study's digits ``VisionTransformer`` and MNIST-1D ``SignalTransformer``
(``bayesattn.study.config.MODEL_DEFAULTS``, random inputs of the data's shapes) with
``attention=None`` (baseline), ``AttentionConfig.last_layer()`` and Dirichlet attention in every
layer; a ``torch.nn.TransformerEncoder`` classifier before (baseline) and after
``bayesattn.convert``; a tiny Hugging Face BERT built from a config (no download) before
(baseline) and after ``bayesattn.interop.hf.convert_hf``. Predictives are
``bayesattn.uncertainty.predict`` with ``S = 8``.

Without CUDA the script says so and exits 0 (nothing written). ``--device cpu`` runs the same
checks on the CPU (a smoke run of the script; nothing written unless ``--out``). On a GPU the
results go to ``benchmarks/results/gpu_check.json`` (``--out DIR`` elsewhere). The exit status is
1 when a check failed or a candidate raised. Not in ``make bench`` (a CPU machine runs that).

Usage: python benchmarks/gpu_check.py [--device cuda|cpu] [--quick] [--repeats R] [--out DIR]
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from _results import table, write_results
from _timing import interleaved
from torch import Tensor, nn

import bayesattn
from bayesattn import attention_mode
from bayesattn.nn import AttentionConfig
from bayesattn.nn.networks import VisionTransformer
from bayesattn.study.config import MODEL_DEFAULTS
from bayesattn.study.datasets.mnist1d import SignalTransformer
from bayesattn.uncertainty import predict

S = 8  # posterior-predictive draws
TOL = {torch.float32: 1e-3, torch.bfloat16: 0.1}  # max |Δ| / (1 + max |ref|) vs CPU float32
Inputs = Tensor | dict[str, Tensor]


@dataclass
class Candidate:
    """``run(model, x)`` gives logits ``(B, C)`` (``deterministic``: compared with the CPU) or
    predictive probabilities ``(S, B, C)`` (checked finite and normalised)."""

    name: str
    model: str  # key into Group.models
    run: Callable[[nn.Module, Inputs], Tensor]
    deterministic: bool


@dataclass
class Group:
    name: str
    models: dict[str, nn.Module]  # CPU float32, eval
    x: Inputs  # CPU
    candidates: list[Candidate]
    baseline: str  # the candidate the ratios are against
    refs: dict[str, Tensor] = field(default_factory=dict)


def _logits(m: nn.Module, x: Inputs) -> Tensor:
    out = m(**x) if isinstance(x, dict) else m(x)
    return getattr(out, "logits", out)


def _mean(m: nn.Module, x: Inputs) -> Tensor:
    with attention_mode("mean"):
        return _logits(m, x)


def _predictive(m: nn.Module, x: Inputs) -> Tensor:
    return predict(m, x, num_samples=S, keep_attention=False).probs  # (S, B, C)


def study_group(dataset: str, batch: int) -> Group:
    """A study network (digits ViT or MNIST-1D transformer): deterministic, last-layer
    (``AttentionConfig.last_layer()``; rows named ``recommended``, as in the stored results),
    Dirichlet everywhere; the same trunk weights in all three."""
    m = MODEL_DEFAULTS[dataset]
    kw = dict(d_model=m["d_model"], nhead=m["nhead"], num_layers=m["num_layers"],
              dim_feedforward=m["dim_feedforward"], dropout=0.1)  # fmt: skip

    def net(attention: AttentionConfig | None) -> nn.Module:
        torch.manual_seed(0)
        if dataset == "digits":
            return VisionTransformer(
                10, image_size=8, patch_size=m["patch"], attention=attention, **kw
            )
        return SignalTransformer(10, length=40, patch=m["patch"], stride=m["stride"],
                                 attention=attention, **kw)  # fmt: skip

    models = {"det": net(None).eval(), "rec": net(AttentionConfig.last_layer()).eval(),
              "dir": net(AttentionConfig("dirichlet")).eval()}  # fmt: skip
    x = torch.randn(batch, 1, 8, 8) if dataset == "digits" else torch.randn(batch, 40)
    cands = [
        Candidate("deterministic (attention=None)", "det", _logits, True),
        Candidate("recommended, posterior mean", "rec", _mean, True),
        Candidate(f"recommended, predict S={S}", "rec", _predictive, False),
        Candidate("dirichlet everywhere, posterior mean", "dir", _mean, True),
        Candidate(f"dirichlet everywhere, predict S={S}", "dir", _predictive, False),
    ]
    title = "digits ViT" if dataset == "digits" else "MNIST-1D SignalTransformer"
    return Group(f"{title} (B={batch})", models, x, cands, cands[0].name)


class _EncoderClassifier(nn.Module):
    def __init__(self, d: int, h: int, layers: int) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, h, 4 * d, 0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, 10)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x).mean(-2))


def converted_group(quick: bool) -> Group:
    """A ``torch.nn.TransformerEncoder`` classifier before and after ``bayesattn.convert``."""
    B, T, D, H, L = (4, 16, 32, 4, 2) if quick else (32, 64, 64, 4, 4)
    torch.manual_seed(0)
    ref = _EncoderClassifier(D, H, L).eval()
    models = {"torch": ref, "det": bayesattn.convert(copy.deepcopy(ref)),
              "dir": bayesattn.convert(copy.deepcopy(ref), family="dirichlet")}  # fmt: skip
    cands = [
        Candidate("torch", "torch", _logits, True),
        Candidate("convert (deterministic)", "det", _logits, True),
        Candidate("convert dirichlet, posterior mean", "dir", _mean, True),
        Candidate(f"convert dirichlet, predict S={S}", "dir", _predictive, False),
    ]
    name = f"torch TransformerEncoder + convert (B={B}, T={T}, d={D}, layers={L})"
    return Group(name, models, torch.randn(B, T, D), cands, "torch")


def hf_group(quick: bool) -> Group | None:
    """A tiny BERT classifier from a config (no download) before and after ``convert_hf``."""
    try:
        import transformers
    except ImportError:
        print("transformers is not installed: the Hugging Face group is skipped")
        return None
    from bayesattn.interop.hf import convert_hf

    B, T, D, L = (4, 16, 32, 2) if quick else (32, 64, 64, 2)
    cfg = transformers.BertConfig(
        hidden_size=D, num_hidden_layers=L, num_attention_heads=4, intermediate_size=2 * D,
        vocab_size=100, num_labels=3, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    ref = transformers.BertForSequenceClassification(cfg).eval()
    models = {"hf": ref, "dir": convert_hf(copy.deepcopy(ref), family="dirichlet")}
    mask = torch.ones(B, T, dtype=torch.long)
    mask[B // 2 :, T // 2 :] = 0  # half the batch padded to half length
    x = {"input_ids": torch.randint(0, 100, (B, T)), "attention_mask": mask}
    cands = [
        Candidate("transformers (eager attention)", "hf", _logits, True),
        Candidate("convert_hf dirichlet, posterior mean", "dir", _mean, True),
        Candidate(f"convert_hf dirichlet, predict S={S}", "dir", _predictive, False),
    ]
    return Group(f"Hugging Face BERT + convert_hf (B={B}, T={T}, d={D}, layers={L})", models, x,
                 cands, cands[0].name)  # fmt: skip


def _to(x: Inputs, device: torch.device, dtype: torch.dtype) -> Inputs:
    def one(t: Tensor) -> Tensor:
        return t.to(device, dtype) if t.is_floating_point() else t.to(device)

    return {k: one(v) for k, v in x.items()} if isinstance(x, dict) else one(x)


def _check(c: Candidate, out: Tensor, ref: Tensor | None, dtype: torch.dtype) -> tuple[Any, str]:
    """``(relative max |Δ| or None, problem or "")`` of one output."""
    out = out.float().cpu()
    if not bool(torch.isfinite(out).all()):
        return None, "non-finite output"
    if not c.deterministic:
        err = float((out.sum(-1) - 1).abs().max())
        return None, "" if err < 1e-2 else f"probabilities sum to 1 ± {err:.2g}"
    assert ref is not None
    rel = float((out - ref).abs().max()) / (1 + float(ref.abs().max()))
    return rel, "" if rel <= TOL[dtype] else f"|Δ| vs CPU float32 {rel:.3g} > {TOL[dtype]}"


def run_group(g: Group, device: torch.device, dtype: torch.dtype, reps: int) -> tuple[dict, bool]:
    """One group on ``device`` in ``dtype``: its table and whether every check passed."""
    models = {k: copy.deepcopy(m).to(device, dtype).eval() for k, m in g.models.items()}
    x = _to(g.x, device, dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows, fns, ok = {}, {}, True
    with torch.no_grad():
        for c in g.candidates:
            try:
                out = c.run(models[c.model], x)
                rel, problem = _check(c, out, g.refs.get(c.name), dtype)
            except Exception as e:  # noqa: BLE001  # a device check reports every failure
                rel, problem = None, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            ok &= not problem
            rows[c.name] = [rel, "ok" if not problem else problem]
            if not problem:
                fns[c.name] = lambda c=c: (c.run(models[c.model], x), sync())
        ms = interleaved(fns, reps) if fns else {}
    base = ms.get(g.baseline)
    out_rows = []
    for c in g.candidates:
        t = ms.get(c.name)
        ratio = round(t / base, 3) if t is not None and base else None
        out_rows.append([c.name, None if t is None else round(t, 3), ratio, *rows[c.name]])
    for r in out_rows:
        print(f"  {r[0]:42s} {_fmt(r[1], 'ms'):>10s} {_fmt(r[2], 'x'):>8s}  "
              f"|Δ|={_fmt(r[3], '')}  {r[4]}")  # fmt: skip
    cols = ["candidate", "ms", f"ratio vs {g.baseline}", "max |Δ| / (1 + max |ref|) vs CPU fp32",
            "check"]  # fmt: skip
    title = f"{g.name}, {device.type} {str(dtype).removeprefix('torch.')}"
    return table(title, cols, out_rows), ok


def _fmt(v: Any, unit: str) -> str:
    if v is None:
        return "–"
    return f"{v:.3g}{unit}" if unit == "x" else f"{v:.3f}{(' ' + unit) if unit else ''}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu (smoke run)")
    p.add_argument("--quick", action="store_true", help="small shapes, few repeats")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats (default 30, 3 quick)")
    p.add_argument("--out", type=Path, default=None, help="write gpu_check.json here")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__}, "
              f"cuda build: {torch.version.cuda}); nothing checked, nothing written. "
              "Run it on a GPU machine, or with --device cpu for a smoke run of the checks.")  # fmt: skip
        return 0
    torch.set_num_threads(1) if device.type == "cpu" else None
    reps = args.repeats or (3 if args.quick else 30)
    batch = 16 if args.quick else 512
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    groups = [
        study_group("digits", batch),
        study_group("mnist1d", batch),
        converted_group(args.quick),
    ]
    groups += [g for g in [hf_group(args.quick)] if g is not None]
    tables, all_ok = [], True
    for g in groups:
        with torch.no_grad():  # the CPU float32 references
            g.refs = {c.name: c.run(g.models[c.model], g.x).float()
                      for c in g.candidates if c.deterministic}  # fmt: skip
        for dtype in (torch.float32, torch.bfloat16):
            print(f"\n{g.name}, {device} {dtype}:")
            t, ok = run_group(g, device, dtype, reps)
            tables.append(t)
            all_ok &= ok
    if device.type == "cuda" or args.out is not None:
        title = f"The study's and converted models on {device.type}: numerics and speed"
        path = write_results("gpu_check", title, tables, out_dir=args.out)
        print(f"\nwrote {path}")
    print("\nall checks passed" if all_ok else "\nSOME CHECKS FAILED (see the check column)")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
