"""WordNet glosses by lexicographer file: a competent token network and methods for words.

Two phases, on :func:`bayesattn.data.wordnet.load_wordnet_data` (``--per-class`` glosses a class,
two classes held out as the study holds them out, :func:`~bayesattn.data.holdout.rotation_pairs`):

1. **Selection (validation only).** The study's fortunes network (``TransformerClassifier`` over
   the word ids, CLS pooling, AdamW + warm-up, best validation epoch restored, as
   ``bayesattn.study.runs.Run.train`` trains it) at each setting of ``--configs``
   (``d_model-layers-epochs-dropout``, feed-forward 2·d_model, 4 heads, batch 64, lr 3e-3) on
   the first pair with seed 0; the setting with the best **validation accuracy** (declared in
   advance; ties by validation NLL) is used below. No test or held-out text is read.
2. **Methods** on ``--pairs`` held-out pairs × ``--seeds`` seeds, each with a TF-IDF + logistic
   regression row (:func:`bayesattn.calibration.bag_of_words.bag_of_words_row`) and three
   networks of the chosen setting (member ``i`` seeded ``seed + 1000 i``, as the study seeds
   them). Declared scores: the plain network's predictive entropy; the density read
   (``bayesattn.posthoc.DensityRead``'s core, ``fit_class_density``, fitted on training features, its
   prior strength, standardisation and density-aware temperature on validation) of the views
   ``cls+tokens`` (the study's: CLS and the mean of the non-padding token states), ``cls``,
   ``tokens-masked`` (the mean over positions that are neither padding nor unknown words) and
   ``layers`` (every layer's CLS, each standardised, summed: Lee et al. 2018); the unknown-word
   rate; the 3-ensemble's entropy and mutual information; sums of scores standardised on
   in-distribution validation (:func:`bayesattn.calibration.token_scores.combine_scores`).

Prints per-run lines and a pooled table (mean and range over runs); writes
``benchmarks/results/wordnet_tokens.json``. Needs ``apt-get install wordnet-base``.

Run: ``OMP_NUM_THREADS=1 nice -n 10 python benchmarks/wordnet_tokens.py --setting 64-2-10-0.1``
(on a busy 2-core machine at 1,000 glosses a class: 5 to 12 minutes a network of the study's
size, 67 minutes for the 4 runs of 3 networks); ``--select-only`` the selection alone,
``--quick`` a smoke test.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import pyro
import torch
from _results import table, write_results
from torch import Tensor
from tqdm import tqdm

from bayesattn.calibration import (
    accuracy,
    expected_calibration_error,
    fit_temperature,
    negative_log_likelihood,
    ood_auroc,
    predictive_entropy,
)
from bayesattn.calibration.bag_of_words import bag_of_words_row, fit_bag_of_words
from bayesattn.calibration.token_scores import (
    combine_scores,
    masked_token_mean,
    mutual_information,
    sequence_mutual_information,
    sequence_surprisal,
    unknown_rate,
)
from bayesattn.data.fortunes import build_vocab, encode_texts
from bayesattn.data.holdout import rotation_pairs
from bayesattn.data.wordnet import WordNetData, load_wordnet_data, unlabeled_glosses
from bayesattn.nn.config import AttentionConfig
from bayesattn.nn.networks import CausalLM, TransformerClassifier
from bayesattn.posthoc._density_core import fit_class_density
from bayesattn.posthoc.token_views import TokenViews, token_views
from bayesattn.training import fit
from bayesattn.training.pretrain import pretrain_masked_lm, transfer_trunk

#: ``d_model-layers-epochs-dropout`` settings tried on validation (the first is the study's
#: fortunes network)
CONFIGS = ("64-2-10-0.1", "64-2-20-0.1", "128-2-10-0.1", "64-2-10-0.3")
SPLITS = ("train", "val", "test", "ood")


def network(d: WordNetData, setting: str) -> tuple[TransformerClassifier, int, float]:
    """A fresh network of ``setting`` (``d_model-layers-epochs-dropout[-lr]``), its epochs and
    learning rate (3e-3 unless given)."""
    width, layers, epochs, dropout, *lr = setting.split("-")
    e = int(width)
    net = TransformerClassifier(d.num_classes, vocab_size=d.vocab_size, max_len=d.x_train.shape[1],
                                pooling="cls", d_model=e, nhead=4, num_layers=int(layers),
                                dim_feedforward=2 * e, dropout=float(dropout))  # fmt: skip
    return net, int(epochs), float(lr[0]) if lr else 3e-3


#: a pretrained trunk and its vocabulary (``--pretrain``), copied into every network trained
PRETRAINED: list[tuple[TransformerClassifier, tuple[str, ...]]] = []


def train(d: WordNetData, setting: str, seed: int) -> tuple[TransformerClassifier, float]:
    """The network of ``setting`` trained as the study trains its deterministic members (from
    the pretrained trunk when there is one)."""
    torch.manual_seed(seed)
    net, epochs, lr = network(d, setting)
    if PRETRAINED:
        transfer_trunk(*PRETRAINED[0], net, d.vocab)
    pyro.clear_param_store()
    steps = math.ceil(len(d.x_train) / 64)
    t0 = time.perf_counter()
    fit(net, (d.x_train, d.y_train), val_data=(d.x_val, d.y_val), method="hybrid",
        epochs=epochs, batch_size=64, lr=lr, weight_decay=1e-4, warmup_steps=steps, seed=seed,
        progress=False, restore_best=True, early_stopping_patience=None, val_samples=0)  # fmt: skip
    return net.eval(), time.perf_counter() - t0


def pretrain(spec: str, cache: str | None) -> dict[str, Any]:
    """``--pretrain d_model-layers-epochs``: a trunk pretrained as a masked language model of
    :func:`~bayesattn.data.wordnet.unlabeled_glosses` (no gloss of the ten classes in it; its
    own vocabulary of words seen twice, 2 % held aside), loaded from ``cache`` if there."""
    width, layers, epochs = (int(v) for v in spec.split("-"))
    texts = unlabeled_glosses()
    vocab = build_vocab(texts, 2, mask_token=True)
    net = TransformerClassifier(2, vocab_size=len(vocab), max_len=32, pooling="cls", d_model=width,
                                nhead=4, num_layers=layers, dim_feedforward=2 * width,
                                dropout=0.1)  # fmt: skip
    if cache and os.path.exists(cache):
        net.load_state_dict(torch.load(cache, weights_only=True))
        info = {"cached": cache}
    else:
        x = encode_texts(texts, vocab, 32)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
        n_val = len(x) // 50
        r = pretrain_masked_lm(net, x[order[n_val:]], mask_id=len(vocab) - 1, val=x[order[:n_val]],
                               epochs=epochs, batch_size=128, lr=3e-3, seed=0)  # fmt: skip
        info = {"texts": len(x), "vocabulary": len(vocab), "train_loss": r.train_loss,
                "val_loss": r.val_loss, "val_masked_accuracy": r.val_accuracy,
                "seconds": round(r.seconds, 1)}  # fmt: skip
        print(f"pretrained {spec}: {info}", flush=True)
        if cache:
            torch.save(net.state_dict(), cache)
    PRETRAINED.append((net.eval(), vocab))
    return info


def x_of(d: WordNetData, split: str) -> Tensor:
    return d.x_ood_classes if split == "ood" else getattr(d, f"x_{split}")


def select(d: WordNetData, configs: list[str]) -> tuple[str, list[list[Any]]]:
    """Phase 1: the setting with the best validation accuracy (ties: NLL)."""
    rows = []
    for setting in tqdm(configs, desc="selection", leave=False):
        net, secs = train(d, setting, 0)
        with torch.no_grad():
            p = torch.softmax(net.forward_logits(d.x_val).double(), -1)
        acc, nll = accuracy(p, d.y_val), negative_log_likelihood(p, d.y_val)
        rows.append([setting, round(acc, 4), round(nll, 4), round(secs, 1)])
        print(f"  {setting:>14}: val acc {acc:.3f}  val NLL {nll:.3f}  train {secs:.0f} s",
              flush=True)  # fmt: skip
    best = max(rows, key=lambda r: (r[1], -r[2]))
    return str(best[0]), rows


def probs_row(p: Tensor, y: Tensor) -> dict[str, float]:
    return {"accuracy": accuracy(p, y), "nll": negative_log_likelihood(p, y),
            "ece": expected_calibration_error(p, y)}  # fmt: skip


def auroc(score: Callable[[str], Tensor]) -> float:
    return ood_auroc(score("test"), score("ood"))


def one_run(d: WordNetData, setting: str, seed: int, members: int,
            bow_data: WordNetData | None = None) -> dict[str, dict[str, float]]:  # fmt: skip
    """Phase 2 on one split: every method's accuracy, NLL, ECE, declared AUROC and cost (s)."""
    out: dict[str, dict[str, float]] = {}
    t0 = time.perf_counter()
    out["tf-idf + logistic regression"] = bag_of_words_row(bow_data or d)
    out["tf-idf + logistic regression"]["cost_s"] = time.perf_counter() - t0
    nets, secs = [], []
    for i in tqdm(range(members), desc="members", leave=False):
        net, s = train(d, setting, seed + 1000 * i)
        nets.append(net)
        secs.append(s)
    t0 = time.perf_counter()
    views: dict[str, TokenViews] = {s: token_views(nets[0], x_of(d, s)) for s in SPLITS}
    t_views = time.perf_counter() - t0
    y_test = d.y_test
    probs = {s: torch.softmax(v.logits.double(), -1) for s, v in views.items()}
    ent = {s: predictive_entropy(p) for s, p in probs.items()}
    out["plain network (entropy)"] = {**probs_row(probs["test"], y_test),
                                      "auroc": auroc(ent.__getitem__),
                                      "cost_s": secs[0] + t_views}  # fmt: skip
    T = fit_temperature(views["val"].logits.double(), d.y_val)
    out["temperature scaling (entropy)"] = {
        **probs_row(torch.softmax(views["test"].logits.double() / T, -1), y_test),
        "auroc": auroc(lambda s: predictive_entropy(torch.softmax(views[s].logits.double() / T, -1))),
        "cost_s": secs[0] + t_views,
    }  # fmt: skip

    # the density read's views (features of member 0)
    def feats(kind: str, s: str) -> list[Tensor]:
        v, x = views[s], x_of(d, s)
        cls = v.layer_cls[-1]
        if kind == "cls+tokens":
            return [cls, masked_token_mean(v.states, x, unk_id=None)]
        if kind == "cls":
            return [cls]
        if kind == "tokens-masked":
            return [masked_token_mean(v.states, x)]
        return list(v.layer_cls)  # "layers"

    density: dict[str, dict[str, Tensor]] = {}
    for kind in ("cls+tokens", "cls", "tokens-masked", "layers"):
        t0 = time.perf_counter()
        read = fit_class_density(feats(kind, "train"), d.y_train, feats(kind, "val"), d.y_val,
                                 d.num_classes, val_logits=views["val"].logits)  # fmt: skip
        density[kind] = {s: read.score(feats(kind, s)) for s in ("val", "test", "ood")}
        p = read.probs(views["test"].logits, feats(kind, "test"))
        out[f"density read: {kind}"] = {**probs_row(p, y_test),
                                        "auroc": auroc(density[kind].__getitem__),
                                        "cost_s": secs[0] + t_views + time.perf_counter() - t0}  # fmt: skip
    unk = {s: unknown_rate(x_of(d, s)) for s in SPLITS}
    out["unknown-word rate"] = {"auroc": auroc(unk.__getitem__), "cost_s": 0.0}

    # the ensemble
    mp = {s: torch.stack([probs[s]] + [torch.softmax(n.forward_logits(x_of(d, s)).double(), -1)
                                        for n in nets[1:]]) for s in ("val", "test", "ood")}  # fmt: skip
    ens = f"{members}-ensemble"
    ens_row = probs_row(mp["test"].mean(0), y_test)
    out[f"{ens} (entropy)"] = {**ens_row, "auroc": auroc(lambda s: predictive_entropy(mp[s].mean(0))),
                               "cost_s": sum(secs) + members * t_views}  # fmt: skip
    out[f"{ens} (MI)"] = {**ens_row, "auroc": auroc(lambda s: mutual_information(mp[s])),
                          "cost_s": sum(secs) + members * t_views}  # fmt: skip

    # sums of scores standardised on in-distribution validation
    base = out["plain network (entropy)"]
    combos = {"entropy + density cls": [ent, density["cls"]],
              "entropy + density layers": [ent, density["layers"]],
              "entropy + unknown rate": [ent, unk],
              "entropy + density cls + unknown rate": [ent, density["cls"], unk]}  # fmt: skip
    for name, parts in combos.items():

        def score(s: str, parts: list[dict[str, Tensor]] = parts) -> Tensor:
            return combine_scores([p[s] for p in parts], [p["val"] for p in parts])

        out[f"sum: {name}"] = {**{k: base[k] for k in ("accuracy", "nll", "ece")},
                               "auroc": auroc(score), "cost_s": base["cost_s"]}  # fmt: skip
    return out


def lm_sequences(x: Tensor) -> Tensor:
    """Token ids ``(B, T)`` as a language model reads them ``(B, 1 + T)``: BOS (1) first, the
    words shifted by 2 (padding stays 0; the unknown word becomes 3)."""
    shifted = torch.where(x == 0, x, x + 2)
    return torch.cat([torch.ones(len(x), 1, dtype=x.dtype), shifted], 1)


#: posterior draws of the Bayesian-attention language model's next-token distributions
LM_DRAWS = 8


def lm_run(
    d: WordNetData, setting: str, seed: int, epochs: int, bayesian: bool = False
) -> dict[str, dict[str, float]]:
    """The input likelihood of a small causal LM of the training texts (mean next-token
    surprisal; the unknown word one token of its vocabulary), a unigram model's surprisal
    (add-one smoothed training counts, an unknown word scored as unseen), and their
    sums with the plain network's entropy (member 0 retrained: the same seed as in the main
    run gives the same network). ``bayesian``: the LM's last layer has Bayesian attention
    (``AttentionConfig.last_layer()``, trained on the ELBO); its scores are the surprisal under
    the predictive of ``LM_DRAWS`` draws and the draws' mutual information over next tokens
    (:func:`~bayesattn.calibration.token_scores.sequence_mutual_information`)."""
    out: dict[str, dict[str, float]] = {}
    seqs = {s: lm_sequences(x_of(d, s)) for s in SPLITS}
    width = int(setting.split("-")[0])
    torch.manual_seed(seed)
    lm = CausalLM(d.vocab_size + 2, d_model=width, nhead=4, num_layers=2,
                  dim_feedforward=2 * width, dropout=0.1, max_len=seqs["train"].shape[1],
                  attention=AttentionConfig.last_layer() if bayesian else None)  # fmt: skip
    pyro.clear_param_store()
    steps = math.ceil(len(d.x_train) / 64)
    t0 = time.perf_counter()
    fit(lm, (seqs["train"], None), val_data=(seqs["val"], None), method="hybrid", epochs=epochs,
        batch_size=64, lr=3e-3, weight_decay=1e-4, warmup_steps=steps, seed=seed, progress=False,
        restore_best=True, early_stopping_patience=None, val_samples=0)  # fmt: skip
    lm.eval()

    def surprisal(q: Tensor, batch: int = 128) -> Tensor:  # in batches: (B, T, V) is large
        with torch.no_grad():
            return torch.cat([sequence_surprisal(torch.log_softmax(lm.forward_logits(
                q[i : i + batch]), -1), q[i : i + batch, 1:]) for i in range(0, len(q), batch)])  # fmt: skip

    def draws(q: Tensor, batch: int = 32) -> tuple[Tensor, Tensor]:  # (S, b, T, V) per batch
        sur, mi = [], []
        with torch.no_grad():
            for i in range(0, len(q), batch):
                lp = torch.log_softmax(lm.forward_logits(q[i : i + batch],
                                                         num_samples=LM_DRAWS), -1)  # fmt: skip
                pred = torch.logsumexp(lp, 0) - math.log(LM_DRAWS)  # (b, T, V)
                sur.append(sequence_surprisal(pred, q[i : i + batch, 1:]))
                mi.append(sequence_mutual_information(lp, q[i : i + batch, 1:]))
        return torch.cat(sur), torch.cat(mi)

    if bayesian:
        both = {s: draws(q) for s, q in seqs.items() if s != "train"}
        sur = {s: v[0] for s, v in both.items()}
        lm_mi = {s: v[1] for s, v in both.items()}
    else:
        sur = {s: surprisal(q) for s, q in seqs.items() if s != "train"}
    lm_cost = time.perf_counter() - t0
    lm_name = "Bayesian-attention causal LM" if bayesian else "causal LM"
    out[f"{lm_name} surprisal"] = {"auroc": auroc(sur.__getitem__), "cost_s": lm_cost}
    if bayesian:
        out[f"{lm_name} mutual information"] = {"auroc": auroc(lm_mi.__getitem__),
                                                "cost_s": lm_cost}  # fmt: skip
    # add-one smoothing; an unknown word is scored as an unseen word (count 0 + 1), not by the
    # frequency of the unknown id (which pools every rare training word and would make texts
    # full of unknown words look typical)
    counts = torch.bincount(d.x_train[d.x_train != 0], minlength=d.vocab_size).double() + 1
    counts[1] = 1.0
    logp = torch.log(counts / counts[1:].sum())
    logp[0] = 0.0

    def unigram(s: str) -> Tensor:
        x = x_of(d, s)
        return -(logp[x] * (x != 0)).sum(-1) / (x != 0).sum(-1).clamp_min(1)

    uni = {s: unigram(s) for s in ("val", "test", "ood")}
    out["unigram surprisal"] = {"auroc": auroc(uni.__getitem__), "cost_s": 0.0}
    net, secs = train(d, setting, seed)
    with torch.no_grad():
        ent = {s: predictive_entropy(torch.softmax(net.forward_logits(x_of(d, s)).double(), -1))
               for s in ("val", "test", "ood")}  # fmt: skip
    out["plain network (entropy), retrained"] = {"auroc": auroc(ent.__getitem__), "cost_s": secs}
    sums = {f"entropy + {lm_name} surprisal": [ent, sur], "entropy + unigram surprisal": [ent, uni]}
    if bayesian:
        sums[f"entropy + {lm_name} mutual information"] = [ent, lm_mi]
    for name, parts in sums.items():

        def score(s: str, parts: list[dict[str, Tensor]] = parts) -> Tensor:
            return combine_scores([p[s] for p in parts], [p["val"] for p in parts])

        out[f"sum: {name}"] = {"auroc": auroc(score), "cost_s": secs + lm_cost}
    return out


def pooled(runs: list[dict[str, dict[str, float]]]) -> list[list[Any]]:
    rows = []
    for method in runs[0]:
        row: list[Any] = [method]
        for key in ("accuracy", "nll", "ece", "auroc", "cost_s"):
            vals = [r[method][k] for r in runs for k in [key if key != "auroc" or
                    "auroc" in r[method] else "auroc_entropy"] if k in r[method]]  # fmt: skip
            if not vals:
                row.append("")
                continue
            m = statistics.mean(vals)
            row.append(f"{m:.3f} [{min(vals):.3f}, {max(vals):.3f}]" if key != "cost_s"
                       else round(m, 1))  # fmt: skip
        rows.append(row)
    return rows


def vocabulary_diagnostic(per_class: int, pair: tuple[int, ...]) -> list[list[Any]]:
    """Validation accuracy of TF-IDF + logistic regression when its vocabulary keeps only the
    words seen ``k`` times in training: how much of the bag of words' accuracy rests on rare
    words (which a network's embedding trained from scratch sees a few times)."""
    rows = []
    for k in (2, 3, 5, 10, 20):
        d = load_wordnet_data(seed=0, holdout_classes=pair, per_class=per_class, min_count=k)
        bow = fit_bag_of_words((d.x_train, d.y_train), (d.x_val, d.y_val), d.vocab_size)
        rows.append([k, d.vocab_size, round(accuracy(bow.probs(d.x_val), d.y_val), 4)])
        print(f"  min_count {k:>2}: vocabulary {d.vocab_size:>5}, val accuracy {rows[-1][2]:.3f}")
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-class", type=int, default=1000)
    ap.add_argument("--pairs", type=int, default=2, help="held-out pairs (rotation_pairs)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--members", type=int, default=3)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), metavar="E-L-EP-P")
    ap.add_argument("--setting", default=None, help="skip the selection: use this setting")
    ap.add_argument("--min-count", type=int, default=2,
                    help="the vocabulary's cut-off in the selection (not 2: results "
                    "wordnet_tokens_selection_min<k>.json)")  # fmt: skip
    ap.add_argument(
        "--select-only",
        action="store_true",
        help="only the selection (results: wordnet_tokens_selection.json)",
    )
    ap.add_argument("--vocab-diagnostic", action="store_true",
                    help="only the bag of words' validation accuracy by vocabulary cut-off "
                    "(results: wordnet_tokens_vocabulary.json)")  # fmt: skip
    ap.add_argument("--lm", action="store_true",
                    help="only the language-model scores (needs --setting; results: "
                    "wordnet_tokens_lm.json)")  # fmt: skip
    ap.add_argument("--lm-epochs", type=int, default=10)
    ap.add_argument("--lm-bayesian", action="store_true",
                    help="with --lm: the LM's last layer has Bayesian attention (draws' mutual "
                    "information over next tokens; results: wordnet_tokens_lm_bayesian.json)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--pretrain", metavar="E-L-EP", default=None,
                    help="fine-tune from a trunk of width E, L layers pretrained EP epochs as a "
                    "masked LM of the unlabeled glosses (results: *_pretrained<E>.json)")  # fmt: skip
    ap.add_argument(
        "--pretrain-cache",
        default=None,
        metavar="PATH",
        help="the pretrained trunk's state_dict: read if there, else written",
    )
    ap.add_argument("--quick", action="store_true", help="a smoke test: 100 glosses, 1 epoch")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.per_class, args.pairs, args.seeds, args.members = 100, 1, 1, 2
        args.configs = ["32-1-1-0.1", "32-1-2-0.1"]
    if args.lm and args.setting is None:
        ap.error("--lm needs --setting (the main run's chosen setting)")
    if args.lm_bayesian and not args.lm:
        ap.error("--lm-bayesian goes with --lm")
    pairs = rotation_pairs(args.pairs)
    t_all = time.perf_counter()
    unlabeled: list[str] = []
    pre_info: dict[str, Any] = {}
    if args.pretrain:
        if args.quick:
            args.pretrain = "32-1-1"
        pre_info = pretrain(args.pretrain, args.pretrain_cache)
        unlabeled = unlabeled_glosses()
    tables = []
    name = ("wordnet_tokens_vocabulary" if args.vocab_diagnostic else
            f"wordnet_tokens_selection{'' if args.min_count == 2 else f'_min{args.min_count}'}"
            if args.select_only else
            f"wordnet_tokens_lm{'_bayesian' if args.lm_bayesian else ''}" if args.lm
            else "wordnet_tokens")  # fmt: skip
    if args.pretrain:
        name += f"_pretrained{args.pretrain.split('-')[0]}"
    title = ("WordNet tokens: scores of a Bayesian-attention language model" if args.lm_bayesian
             else "WordNet tokens: language-model scores" if args.lm
             else "WordNet tokens: network, bag of words, methods for words")  # fmt: skip
    if args.pretrain:
        title += ", after masked-LM pretraining"

    def save(extra: list[dict[str, Any]]) -> None:
        if not args.quick:
            pre = ([table(f"Masked-LM pretraining {args.pretrain}", ["what", "value"],
                          [[k, str(v)] for k, v in pre_info.items()])] if pre_info else [])  # fmt: skip
            print(f"wrote {write_results(name, title, pre + tables + extra)}", flush=True)

    if args.vocab_diagnostic:
        print(f"bag of words by vocabulary cut-off, pair {pairs[0]}, seed 0 (validation):")
        rows = vocabulary_diagnostic(args.per_class, pairs[0])
        tables.append(table(f"TF-IDF + logistic regression by vocabulary cut-off ({args.per_class}"
                            f" glosses a class; validation, pair {pairs[0]}, seed 0)",
                            ["min_count", "vocabulary", "val accuracy"], rows))  # fmt: skip
        save([])
        return
    if args.setting is None:
        print(f"selection on pair {pairs[0]}, seed 0 (validation only):")
        d0 = load_wordnet_data(seed=0, holdout_classes=pairs[0], per_class=args.per_class,
                               min_count=args.min_count, unlabeled=unlabeled)  # fmt: skip
        setting, sel_rows = select(d0, args.configs)
        tables.append(table(f"Selection ({args.per_class} glosses a class, vocabulary of words "
                            f"seen {args.min_count}+ times; validation, pair "
                            f"{pairs[0]}, seed 0)", ["d_model-layers-epochs-dropout",
                            "val accuracy", "val NLL", "train s"], sel_rows))  # fmt: skip
        print(f"chosen setting: {setting} (best validation accuracy)")
        if args.select_only:
            save([])
            return
    else:
        setting = args.setting
    runs, per_run_rows = [], []
    jobs = [(p, s) for p in pairs for s in range(args.seeds)]
    cols = ["method", "accuracy", "NLL", "ECE", "held-out AUROC (declared score)", "cost s"]
    for pair, seed in tqdm(jobs, desc="runs"):
        d = load_wordnet_data(seed=seed, holdout_classes=pair, per_class=args.per_class,
                              unlabeled=unlabeled)  # fmt: skip
        bow = (load_wordnet_data(seed=seed, holdout_classes=pair, per_class=args.per_class)
               if unlabeled else None)  # fmt: skip
        r = (lm_run(d, setting, seed, 1 if args.quick else args.lm_epochs, args.lm_bayesian)
             if args.lm
             else one_run(d, setting, seed, args.members, bow))  # fmt: skip
        runs.append(r)
        for m, v in r.items():
            a = v.get("auroc", v.get("auroc_entropy"))
            per_run_rows.append([f"{pair}", seed, m, v.get("accuracy", ""), v.get("nll", ""),
                                 a, round(v["cost_s"], 1)])  # fmt: skip
        line = ", ".join(f"{m} {v.get('auroc', v.get('auroc_entropy')):.3f}" for m, v in r.items())
        tqdm.write(f"pair {pair} seed {seed}: AUROC {line}")
        rows = pooled(runs)
        head = (f"WordNet nouns, {args.per_class} glosses a class, {len(runs)} runs (pairs "
                f"{sorted({p for p, _ in jobs[: len(runs)]})}, seeds 0-{args.seeds - 1}), network "
                f"{setting}: mean [min, max] over runs")  # fmt: skip
        save([table(head, cols, rows),
              table("Per run", ["pair", "seed", "method", "accuracy", "NLL", "AUROC", "cost s"],
                    per_run_rows)])  # fmt: skip
    print(f"\n{head}")
    print(" | ".join(cols))
    for row in rows:
        print(" | ".join(str(c) for c in row))
    print(f"\nwall time {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
