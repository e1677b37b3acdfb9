"""A masked-LM trunk per data set, pretrained once and shared by every run of a study: the
data set's :meth:`~bayesattn.study.datasets.StudyDataset.pretraining_texts` (no text of any of
its classes) encoded in their own vocabulary (words seen twice, a mask id last), 2 % held
aside, BERT's corruption (:func:`~bayesattn.training.pretrain_masked_lm`, seed 0). The trunk has
the study network's width, heads, depth and length; its settings are the data set's
``pretrain_epochs`` (a ``--quick`` study: one epoch on 2,000 texts).

The trunk is written to the study folder as a hidden file named by its settings
(``.pretrained-<data set>-<hash>.pt``, ``torch.load(weights_only=True)``, with a JSON of what it
cost), so a resumed or repeated study reuses it; worker processes take a file lock, and the
first one pretrains while the others wait."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from .._validation import atomic_write_bytes, atomic_write_text
from ..data.fortunes import build_vocab, encode_texts
from ..nn.networks import TransformerClassifier
from ..training.pretrain import pretrain_masked_lm
from .datasets import StudyDataset

__all__ = ["PretrainedTrunk", "pretrained_trunk", "PRETRAIN_VERSION"]

#: bumped when the pretraining recipe changes (a cached trunk of another version is not read)
PRETRAIN_VERSION = 1
#: a ``--quick`` study's pretraining: one epoch on this many texts
SMOKE_TEXTS = 2000

PretrainedTrunk = tuple[TransformerClassifier, tuple[str, ...], dict[str, Any]]

#: trunks already loaded in this process, by cache file
_LOADED: dict[str, PretrainedTrunk] = {}


def trunk_settings(
    ds: StudyDataset, model: dict[str, Any], max_len: int, smoke: bool
) -> dict[str, Any]:
    """What the trunk depends on (its cache key)."""
    return {"dataset": ds.name, "version": PRETRAIN_VERSION, "d_model": model["d_model"],
            "nhead": model["nhead"], "num_layers": model["num_layers"],
            "dim_feedforward": model["dim_feedforward"], "max_len": max_len,
            "epochs": 1 if smoke else int(model.get("pretrain_epochs", 10)),
            "texts": SMOKE_TEXTS if smoke else None, "batch_size": 128, "lr": 3e-3, "seed": 0,
            "min_count": 2}  # fmt: skip


def _build(settings: dict[str, Any], vocab_len: int) -> TransformerClassifier:
    return TransformerClassifier(2, vocab_size=vocab_len, max_len=settings["max_len"],
                                 pooling="cls", d_model=settings["d_model"],
                                 nhead=settings["nhead"], num_layers=settings["num_layers"],
                                 dim_feedforward=settings["dim_feedforward"], dropout=0.1)  # fmt: skip


def _pretrain(
    settings: dict[str, Any], texts: list[str], vocab: tuple[str, ...]
) -> tuple[TransformerClassifier, dict[str, Any]]:
    torch.manual_seed(settings["seed"])
    net = _build(settings, len(vocab))
    x = encode_texts(texts, vocab, settings["max_len"])
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(settings["seed"]))
    n_val = max(1, len(x) // 50)
    r = pretrain_masked_lm(net, x[order[n_val:]], mask_id=len(vocab) - 1, val=x[order[:n_val]],
                           epochs=settings["epochs"], batch_size=settings["batch_size"],
                           lr=settings["lr"], seed=settings["seed"], progress=False)  # fmt: skip
    info = {"texts": len(x), "vocabulary": len(vocab), "val_loss": r.val_loss,
            "val_masked_accuracy": r.val_accuracy, "seconds": r.seconds}  # fmt: skip
    return net, info


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created) for the block: one process pretrains."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def pretrained_trunk(
    ds: StudyDataset, model: dict[str, Any], max_len: int, out: str | Path, smoke: bool = False
) -> PretrainedTrunk:
    """The data set's masked-LM trunk (eval mode, texts of ``max_len`` tokens), its vocabulary
    and what pretraining cost
    (``seconds``, ``val_masked_accuracy``, …): read from ``out`` if there, else pretrained and
    written there atomically. ``ValueError`` for a data set without pretraining texts."""
    raw = ds.pretraining_texts()
    if not raw:
        raise ValueError(f"data set {ds.name!r} has no pretraining texts")
    settings = trunk_settings(ds, model, max_len, smoke)
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    pt = folder / f".pretrained-{ds.name}-{key}.pt"
    if str(pt) in _LOADED:
        return _LOADED[str(pt)]
    texts = list(raw)[: settings["texts"]] if settings["texts"] else list(raw)
    meta = pt.with_suffix(".json")
    vocab = build_vocab(texts, settings["min_count"], mask_token=True)
    with _locked(folder / f".pretrained-{ds.name}-{key}.lock"):
        if pt.is_file() and meta.is_file():
            net = _build(settings, len(vocab))
            net.load_state_dict(torch.load(pt, weights_only=True))
            info = json.loads(meta.read_text())["info"]
        else:
            net, info = _pretrain(settings, texts, vocab)
            buf = io.BytesIO()
            torch.save(net.state_dict(), buf)
            atomic_write_bytes(pt, buf.getvalue())
            atomic_write_text(meta, json.dumps({"settings": settings, "info": info}, indent=1))
    _LOADED[str(pt)] = (net.eval(), vocab, info)
    return _LOADED[str(pt)]
