"""Translate with an encoder-decoder whose cross-attention is Bayesian, with per-token uncertainty.

``bayesattn.data.make_translation_task`` is a tiny English→German grammar that forces reordering
("i can see the house tomorrow" → "ich kann morgen das haus sehen") and comes with gold word
alignments. A ``bayesattn.Seq2Seq`` whose decoder cross-attention has a posterior over its weights
(``AttentionConfig(family=..., which=("cross",))``) is trained with ``bayesattn.training.fit``.

Decoding is sequential posterior sampling: ``Seq2Seq.generate`` draws the attention weights afresh
at every step (``num_samples`` draws in one pass), emits the argmax of the posterior-averaged
predictive and records, per token, the predictive entropy, the expected entropy and their
difference, the **mutual information** (epistemic uncertainty). The script prints translations
with the MI of every token, checks whether MI is higher on wrong tokens (AUROC), and compares the
posterior cross-attention with the gold alignments.

The attention KL has one term per query row of every Bayesian layer, while each target token
contributes one log-likelihood term; with the full ELBO (``--kl-weight 1``) the KL pulls the
cross-attention towards its uniform prior and the decoder learns to ignore the source. The default
is therefore a tempered ELBO, ``--kl-weight 0.01``.

Writes ``token_mutual_information.png`` and ``cross_attention.png``.

Run: ``python examples/04_translation_uncertainty.py [--quick] [--out DIR] [--kl-weight W]``

Prints (the full run, without ``--quick``: about 72 s on one thread of a shared 2-core machine)::

    1600 training pairs, e.g. 'he can buy the house today' -> 'er kann heute das haus kaufen'
    Bayesian attention layers: ['decoder.layers.0.multihead_attn']
    validation token accuracy by epoch: [0.378, 0.703, 0.842, 0.945, 0.99, 0.999, 0.998, 0.999, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    exact translations: 199/200; token accuracy 0.999

      you have bought the table yesterday
      gold: du hast gestern den tisch gekauft
      du(0.039)  hast(0.025)  gestern(0.001)  den(0.002)  tisch(0.007)  gekauft(0.008)  <eos>(0.000)

      you must find the child
      gold: du musst das kind finden
      du(0.002)  musst(0.050)  das(0.127)  kind(0.037)  finden(0.002)  <eos>(0.030)

      you must buy the dog today
      gold: du musst heute den hund kaufen
      du(0.002)  musst(0.036)  heute(0.038)  den(0.017)  hund(0.018)  kaufen(0.005)  <eos>(0.000)

    MI on correct tokens 0.0218, on wrong tokens 0.1601
    AUROC of MI for spotting wrong tokens: 0.967
    cross-attention argmax = gold alignment for 83% of the words of sentence 0

    wrote OUT/token_mutual_information.png and OUT/cross_attention.png
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from bayesattn import AttentionConfig, Seq2Seq, attention_mode
from bayesattn.calibration import ood_auroc
from bayesattn.data import make_translation_task, train_val_test_split
from bayesattn.plots import plot_attention_uncertainty
from bayesattn.training import fit


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", "--smoke", action="store_true", help="tiny sizes, a few seconds")
    p.add_argument("--out", type=Path, default=None, help="folder for PNGs (default: a temp dir)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--family", default="dirichlet", choices=["dirichlet", "logistic_normal"])
    p.add_argument("--kl-weight", type=float, default=0.01, help="final KL weight (1 = the ELBO)")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--samples", type=int, default=None, help="posterior samples per decoding step")
    p.add_argument("--threads", type=int, default=1, help="torch threads (tiny models: 1 is best)")
    return p.parse_args()


def token_mi_figure(rows: list[tuple[list[str], list[float], list[bool]]], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 2.2 * len(rows)), layout="constrained")
    axes = fig.subplots(len(rows), 1, squeeze=False)[:, 0]
    for ax, (tokens, mi, ok) in zip(axes, rows, strict=True):
        colors = ["C0" if good else "C3" for good in ok]
        ax.bar(range(len(tokens)), mi, color=colors)
        ax.set_xticks(range(len(tokens)), tokens, rotation=30)
        ax.set_ylabel("MI (nats)")
    axes[0].set_title("mutual information of each generated token (red: differs from the gold)")
    fig.savefig(path, dpi=100)


def main() -> None:
    args = parse_args()
    if args.quick:
        print("smoke run (--quick): tiny sizes that only check the script runs; "
              "its numbers are not results")
    out = args.out or Path(tempfile.mkdtemp(prefix="bayesattn-example-"))
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    n, d_model = (200, 16) if args.quick else (2000, 32)
    epochs = args.epochs or (3 if args.quick else 20)
    S = args.samples or (4 if args.quick else 16)

    task = make_translation_task(n, seed=args.seed)
    train, val, test = train_val_test_split(task, (0.8, 0.1, 0.1), seed=args.seed)
    print(f"{len(train)} training pairs, e.g. {task.src_text[0]!r} -> {task.tgt_text[0]!r}")

    net = Seq2Seq(
        task.src_vocab_size,
        task.tgt_vocab_size,
        d_model=d_model,
        nhead=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dim_feedforward=2 * d_model,
        dropout=0.0,
        max_len=task.tgt.shape[1],
        attention=AttentionConfig(family=args.family, which=("cross",)),
    )
    print(f"Bayesian attention layers: {net.bayesian_layers}")
    steps_per_epoch = -(-len(train) // 32)
    history = fit(
        net,
        train,
        val_data=val,
        epochs=epochs,
        batch_size=32,
        lr=3e-3,
        kl_anneal_steps=5 * steps_per_epoch,
        kl_weight=args.kl_weight,
        seed=args.seed,
        progress=False,
    )
    print(f"validation token accuracy by epoch: {[round(a, 3) for a in history.val_acc]}")

    # sequential posterior sampling --------------------------------------------------------------
    gen = net.generate(test.src, max_len=test.tgt.shape[1] - 1, num_samples=S)
    L = gen.tokens.shape[1]
    gold = test.tgt[:, 1 : L + 1]  # (B, L): the gold word (or EOS, PAD) of each step
    valid = gen.mask & (gold != task.pad_id)  # steps with a generated and a gold token
    correct = gen.tokens == gold
    exact = sum(test.decode(gen.tokens[i]) == test.tgt_text[i].split() for i in range(len(test)))
    print(
        f"exact translations: {exact}/{len(test)}; token accuracy {float(correct[valid].float().mean()):.3f}"
    )

    rows = []
    for i in range(min(3, len(test))):
        steps = int(gen.mask[i].sum())
        words = test.decode(gen.tokens[i, :steps], strip_special=False)
        mi = gen.mutual_information[i, :steps].tolist()
        ok = correct[i, :steps].tolist()
        print(f"\n  {test.src_text[i]}\n  gold: {test.tgt_text[i]}")
        print(
            "  "
            + "  ".join(
                f"{w}({m:.3f}{'' if good else ' ✗'})"
                for w, m, good in zip(words, mi, ok, strict=True)
            )
        )
        rows.append((words, mi, ok))
    token_mi_figure(rows, out / "token_mutual_information.png")

    mi_ok, mi_bad = (
        gen.mutual_information[valid & correct],
        gen.mutual_information[valid & ~correct],
    )
    if len(mi_ok) and len(mi_bad):
        print(
            f"\nMI on correct tokens {float(mi_ok.mean()):.4f}, on wrong tokens {float(mi_bad.mean()):.4f}"
        )
        print(f"AUROC of MI for spotting wrong tokens: {ood_auroc(mi_ok, mi_bad):.3f}")
    else:
        print("\n(no wrong or no correct tokens: the error-detection AUROC is undefined)")

    # the cross-attention posterior of one test sentence, against the gold alignment ------------
    layer = net.decoder.layers[-1].multihead_attn
    src, tgt = test.src[:1], test.tgt[:1]
    layer.record_weights = True
    try:
        with torch.no_grad(), attention_mode("guide"):
            net(src, tgt, num_samples=max(S, 16))
        w = layer.last_weights.mean(-3)  # (S, 1, Tt-1, Ts): averaged over heads
    finally:
        layer.record_weights, layer.last_weights = False, None
    n_src, n_tgt = int((src != task.pad_id).sum()), int((tgt != task.pad_id).sum()) - 2
    mean, std = w.mean(0)[0, :n_tgt, :n_src], w.std(0)[0, :n_tgt, :n_src]  # target words x source
    align = test.alignment_matrix()[0, :n_tgt, :n_src]
    agree = float((mean.argmax(-1) == align.argmax(-1)).float().mean())
    print(f"cross-attention argmax = gold alignment for {agree:.0%} of the words of sentence 0")
    plot_attention_uncertainty(
        mean,
        std,
        query_labels=test.decode(tgt[0, 1 : n_tgt + 1], strip_special=False),
        key_labels=test.decode(src[0, :n_src], which="src"),
        title="posterior cross-attention (head mean): target word → source word",
        path=out / "cross_attention.png",
    )
    print(f"\nwrote {out / 'token_mutual_information.png'} and {out / 'cross_attention.png'}")


if __name__ == "__main__":
    main()
