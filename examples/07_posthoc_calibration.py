"""Post-hoc calibration of models trained elsewhere: Bayesian attention fitted on a calibration split.

Two models that know nothing about bayesattn are trained the ordinary way (cross-entropy, Adam):

* ``torch``: a plain PyTorch classifier built on ``nn.TransformerEncoder`` (rows of the 8x8 digits
  as tokens; digits 8 and 9 held out as out-of-distribution inputs);
* ``hf``: a tiny Hugging Face ``BertForSequenceClassification`` (random init, no download) on a
  synthetic task (does token 5 occur at least twice? 10 % of labels flipped), with sequences of
  never-seen tokens as out-of-distribution inputs (needs ``bayesattn[hf]``).

Then, post hoc: ``bayesattn.convert`` / ``bayesattn.interop.hf.convert_hf`` make their attention
Bayesian (Dirichlet posteriors, same weights, identical mean-mode outputs),
``bayesattn.posthoc.AttentionRead`` freezes every weight and fits only the attention
posteriors and a temperature by SVI on the validation split, and its ``predict`` draws the
posterior predictive ``(S, B, C)``. Beside them, ``bayesattn.posthoc.GPRead``
fits the post-hoc GP read of the features the classification head reads, without converting
anything (its samples, and its mean-field predictive: a temperature that grows with the GP
variance). Test-set accuracy, ECE, NLL, Brier and OOD AUROC (predictive entropy) are printed
before (the trained model), with temperature scaling only, and after.

Writes ``posthoc_<model>_reliability.png`` and ``posthoc_<model>_ood_entropy.png``.

Run: ``python examples/07_posthoc_calibration.py [--quick] [--out DIR] [--model torch|hf|both]``

Prints (the full run, without ``--quick``: about 198 s on one thread of a shared 2-core machine)::


    [torch] test n=288, OOD n=354, S=64
                                          acc    ECE    NLL  Brier  AUROC
    before                              0.986  0.011  0.058  0.022  0.924
    temperature only (T=1.35)           0.986  0.009  0.052  0.022  0.925
    posteriors + T (T=1.17)             0.990  0.014  0.054  0.022  0.925
    GP read, 64 samples                 0.990  0.013  0.053  0.022  0.931
    GP read, mean-field (a=8.7e+05)     0.986  0.013  0.059  0.022  0.934

    [hf] test n=1000, OOD n=1000, S=64
                                          acc    ECE    NLL  Brier  AUROC
    before                              0.905  0.016  0.316  0.173  0.627
    temperature only (T=0.93)           0.905  0.001  0.314  0.172  0.627
    posteriors + T (T=0.92)             0.905  0.013  0.316  0.173  0.564
    GP read, 64 samples                 0.905  0.003  0.314  0.172  0.254
    GP read, mean-field (a=9.7e-05)     0.905  0.001  0.314  0.172  0.627

    figures in OUT
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
from pathlib import Path

import matplotlib
import torch
from torch import nn

import bayesattn
from bayesattn import calibration as C
from bayesattn.plots import plot_reliability_diagram, plot_uncertainty_histograms
from bayesattn.posthoc import AttentionRead, GPRead
from bayesattn.posthoc import _svi_core as posthoc  # mean_probs, evaluate
from bayesattn.predictive.foreign import input_batch_size, take_rows

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


class DigitsEncoder(nn.Module):
    """A plain torch encoder classifier: the 8 rows of an image are its tokens."""

    def __init__(self, d_model: int = 32, nhead: int = 4, layers: int = 2, classes: int = 8):
        super().__init__()
        self.embed = nn.Linear(8, d_model)
        self.pos = nn.Parameter(torch.zeros(8, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead, 2 * d_model, 0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 8, 8) → (B, C)
        h = self.encoder(self.embed(x) + self.pos)  # (…, B, 8, E)
        return self.head(h.mean(-2))


def train(model: nn.Module, x, y, forward, epochs: int, lr: float = 3e-3, bs: int = 64) -> None:
    """Ordinary maximum-likelihood training (this is the part 'done elsewhere')."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    n = input_batch_size(x)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(n).split(bs):
            loss = nn.functional.cross_entropy(forward(model, take_rows(x, idx)), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()


def digits_setup(quick: bool, seed: int):
    from bayesattn.data import load_digits_data

    d = load_digits_data(seed=seed)
    model = DigitsEncoder(classes=d.num_classes)
    def fwd(m, x):
        return m(x)
    n = 256 if quick else len(d.y_train)
    train(model, d.x_train[:n], d.y_train[:n], fwd, epochs=2 if quick else 40)
    return model, fwd, (d.x_val, d.y_val), (d.x_test, d.y_test), d.x_ood_classes


VOCAB, LENGTH = 20, 10  # ids 0 pad, 1 cls, 5..14 in distribution, 15..19 only out of it


def token_task(n: int, seed: int, low: int = 5, high: int = 15):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, high, (n, LENGTH), generator=g)
    ids[:, 0] = 1  # [CLS]
    y = ((ids == 5).sum(1) >= 2).long()
    flip = torch.rand(n, generator=g) < 0.1
    y = torch.where(flip, 1 - y, y)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, y


def hf_setup(quick: bool, seed: int):
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=LENGTH, num_labels=2,
        attn_implementation="eager",
    )  # fmt: skip
    model = BertForSequenceClassification(cfg)
    def fwd(m, x):
        return m(**x).logits
    n = 128 if quick else 3000
    x_tr, y_tr = token_task(n, seed)
    train(model, x_tr, y_tr, fwd, epochs=2 if quick else 15, lr=1e-3)
    cal = token_task(64 if quick else 600, seed + 1)
    test = token_task(64 if quick else 1000, seed + 2)
    x_ood, _ = token_task(64 if quick else 1000, seed + 3, low=10, high=20)
    return model, fwd, cal, test, x_ood


def run(name: str, quick: bool, seed: int, out: Path) -> dict[str, dict[str, float]]:
    torch.manual_seed(seed)
    model, fwd, (x_cal, y_cal), (x_test, y_test), x_ood = (
        digits_setup if name == "torch" else hf_setup
    )(quick, seed)
    S = 4 if quick else 64
    # before: the trained model as it is
    before = posthoc.mean_probs(model, x_test, forward=fwd)
    before_ood = posthoc.mean_probs(model, x_ood, forward=fwd)
    # temperature scaling only (the usual post-hoc fix), fitted on the same calibration split
    with torch.no_grad():
        t_only = C.fit_temperature(fwd(model, x_cal), y_cal)
    ts = posthoc.mean_probs(model, x_test, forward=fwd, temperature=t_only)
    ts_ood = posthoc.mean_probs(model, x_ood, forward=fwd, temperature=t_only)
    # the post-hoc GP read of the features the head reads (no conversion; one forward pass)
    head = model.head if name == "torch" else model.classifier
    gp = GPRead(model, head=head, forward=fwd, seed=seed).fit(x_cal, y_cal)
    draws = lambda x, s: gp.predict(x, S, seed=s).probs  # noqa: E731
    gp_rows = {
        f"GP read, {S} samples": posthoc.evaluate(
            draws(x_test, seed), y_test, draws(x_ood, seed + 1)
        ),
        f"GP read, mean-field (a={gp.mean_field[1]:.2g})": posthoc.evaluate(
            gp.predict(x_test).probs, y_test, gp.predict(x_ood).probs
        ),
    }
    # after: Bayesian attention posteriors + temperature, fitted by SVI with frozen weights
    if name == "torch":
        bayesattn.convert(model, family="dirichlet")
    else:
        from bayesattn.interop.hf import convert_hf

        convert_hf(model, family="dirichlet")
    with torch.no_grad():  # mean mode is still the trained model
        assert torch.allclose(posthoc.mean_probs(model, x_test, forward=fwd), before, atol=1e-5)
    cal = AttentionRead(
        model, forward=fwd, steps=10 if quick else 300, seed=seed, progress=not quick
    ).fit(x_cal, y_cal)
    after = cal.predict(x_test, S).probs  # (S, B, C)
    after_ood = cal.predict(x_ood, S).probs
    rows = {
        "before": posthoc.evaluate(before, y_test, before_ood),
        f"temperature only (T={t_only:.2f})": posthoc.evaluate(ts, y_test, ts_ood),
        f"posteriors + T (T={cal.temperature:.2f})": posthoc.evaluate(after, y_test, after_ood),
        **gp_rows,
    }
    print(f"\n[{name}] test n={len(y_test)}, OOD n={input_batch_size(x_ood)}, S={S}")
    print(f"{'':34s} {'acc':>6s} {'ECE':>6s} {'NLL':>6s} {'Brier':>6s} {'AUROC':>6s}")
    for k, r in rows.items():
        print(
            f"{k:34s} {r['accuracy']:6.3f} {r['ece']:6.3f} {r['nll']:6.3f} {r['brier']:6.3f} "
            f"{r['ood_auroc']:6.3f}"
        )
    t_mf, a = gp.mean_field
    t_eff = t_mf * (1 + a * gp.score(x_test)).sqrt()  # (B,): the mean-field temperature per input
    print(f"GP mean-field temperature T_mf*sqrt(1 + a v(x)): T_mf = {t_mf:.3g}, a = {a:.3g}, on the "
          f"test inputs {t_eff.min():.2f}-{t_eff.max():.2f} (a ~ 0: the GP variance v does not predict "
          "the calibration errors, so the read is temperature scaling; a v >> 1: the temperature is "
          f"T_mf*sqrt(a)*sqrt(v) = {t_mf * a**0.5:.3g}*sqrt(v), only that product matters)")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    plot_reliability_diagram(before.mean(0), y_test, ax=axes[0], title=f"{name}: before")
    plot_reliability_diagram(after.mean(0), y_test, ax=axes[1], title=f"{name}: after")
    fig.savefig(out / f"posthoc_{name}_reliability.png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    h_in = C.predictive_entropy(after.mean(0))
    h_out = C.predictive_entropy(after_ood.mean(0))
    fig = plot_uncertainty_histograms(h_in, h_out, title=f"{name}: after post-hoc calibration")
    fig.savefig(out / f"posthoc_{name}_ood_entropy.png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", "--smoke", action="store_true", help="tiny sizes, a few seconds")
    p.add_argument("--out", type=Path, default=None, help="folder for PNGs (default: a temp dir)")
    p.add_argument("--model", choices=["torch", "hf", "both"], default="both")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    if args.quick:
        print("smoke run (--quick): tiny sizes that only check the script runs; "
              "its numbers are not results")
    out = args.out or Path(tempfile.mkdtemp(prefix="bayesattn-example-"))
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    names = ["torch", "hf"] if args.model == "both" else [args.model]
    for name in names:
        if name == "hf" and importlib.util.find_spec("transformers") is None:
            print("transformers is not installed (pip install 'bayesattn[hf]'): skipping hf")
            continue
        run(name, args.quick, args.seed, out)
    print(f"\nfigures in {out}")


if __name__ == "__main__":
    main()
