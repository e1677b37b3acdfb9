"""Embedded datasets and seeded synthetic tasks. Nothing is ever downloaded.

Two families of data live here:

* **Digits** -- the 8x8 handwritten digits that ship inside scikit-learn, split into
  stratified train/val/test sets of in-distribution classes plus a pool of held-out
  classes for out-of-distribution (OOD) evaluation, and seeded image corruptions
  (noise, rotation, occlusion) for distribution-shift studies.
* **Sequence tasks** -- copy / reverse / sort over integer tokens and a small
  rule-based English->German translation task whose grammar forces reordering, all
  returned as a :class:`SequenceTask` with token ids, vocabularies and gold word
  alignments (for comparing attention maps against ground truth).

Conventions
-----------
* Every function takes ``seed: int`` and draws from its own ``torch.Generator`` or
  ``numpy.random.default_rng(seed)``; global RNG state is never read or changed.
* Images are float32 ``(N, H, W)`` in ``[0, 1]``; labels are int64.
* Token ids: ``PAD=0``, ``BOS=1``, ``EOS=2``; ordinary tokens start at ``3``.
  ``src`` holds the plain source tokens right-padded with PAD (no BOS/EOS);
  ``tgt`` is ``BOS w_0 ... w_{L-1} EOS PAD ...``.
* Alignments are ``(src_pos, tgt_pos)`` pairs where ``src_pos`` indexes ``src`` and
  ``tgt_pos`` indexes the target *words*, i.e. ``tgt[:, 1:]`` -- the decoder output
  (teacher-forced prediction step) at which that word is produced. This is the row of a
  cross-attention map computed on the decoder input ``tgt[:, :-1]``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    # digits
    "DigitsData",
    "load_digits_data",
    "CORRUPTION_KINDS",
    "corrupt_images",
    "corruption_suite",
    "images_to_patches",
    "patches_to_images",
    # sequence tasks
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "SPECIAL_TOKENS",
    "SequenceTask",
    "make_copy_task",
    "make_reverse_task",
    "make_sort_task",
    "make_ood_sequences",
    "OOD_SEQUENCE_KINDS",
    "TRANSLATION_PATTERNS",
    "translate_sentence",
    "make_translation_task",
    "train_val_test_split",
]

# --------------------------------------------------------------------------------------
# argument checking
# --------------------------------------------------------------------------------------


def _check_int(name: str, value: Any, *, min_value: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if min_value is not None and value < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {value}")
    return value


def _check_seed(seed: Any) -> int:
    return _check_int("seed", seed, min_value=0)


def _check_fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")
    return value


def _check_tensor(name: str, value: Any, ndim: int) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(value.shape)}")
    return value


def _torch_generator(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


# ======================================================================================
# Digits
# ======================================================================================


@dataclass(frozen=True, eq=False)
class DigitsData:
    """Stratified split of the 8x8 digits with held-out classes kept aside for OOD.

    Labels of in-distribution classes are remapped to ``0..C-1`` in increasing order of
    the original digit; ``classes[k]`` is the original digit of new label ``k`` and
    ``label_map`` maps original digit -> new label. ``y_ood_classes`` keeps the
    *original* digit ids (they have no in-distribution label).

    Shape:
        x_train, x_val, x_test: ``(N_split, 8, 8)`` float32 in ``[0, 1]``.
        y_train, y_val, y_test: ``(N_split,)`` int64 in ``[0, C)``.
        x_ood_classes: ``(N_ood, 8, 8)`` float32; y_ood_classes: ``(N_ood,)`` int64.
    """

    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    x_test: Tensor
    y_test: Tensor
    classes: tuple[int, ...]
    label_map: dict[int, int]
    holdout_classes: tuple[int, ...]
    x_ood_classes: Tensor
    y_ood_classes: Tensor
    seed: int

    @property
    def num_classes(self) -> int:
        """Number of in-distribution classes ``C``."""
        return len(self.classes)

    @property
    def class_names(self) -> tuple[str, ...]:
        """Printable names of the in-distribution classes, indexed by new label."""
        return tuple(str(c) for c in self.classes)


def _import_load_digits() -> Callable[..., Any]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - exercised via monkeypatch in tests
        raise ImportError(
            "load_digits_data needs scikit-learn, which ships the 8x8 digits dataset; "
            "install it with: pip install bayesattn[examples]"
        ) from exc
    return load_digits


def load_digits_data(
    seed: int = 0,
    val_fraction: float = 0.15,
    test_fraction: float = 0.2,
    holdout_classes: Iterable[int] = (8, 9),
) -> DigitsData:
    """Load the scikit-learn 8x8 digits with a seeded stratified split.

    Samples of ``holdout_classes`` go only to ``x_ood_classes``. Each remaining class is
    shuffled and split per class: ``round(test_fraction * n_c)`` test,
    ``round(val_fraction * n_c)`` validation, the rest training; each split is then
    shuffled. Pixel values are divided by 16.

    Shape:
        Returns a :class:`DigitsData` with images ``(N, 8, 8)`` and labels ``(N,)``.
    """
    seed = _check_seed(seed)
    val_fraction = _check_fraction("val_fraction", val_fraction)
    test_fraction = _check_fraction("test_fraction", test_fraction)
    if val_fraction + test_fraction >= 1.0:
        raise ValueError(
            "val_fraction + test_fraction must be < 1, got "
            f"{val_fraction} + {test_fraction} = {val_fraction + test_fraction}"
        )
    if isinstance(holdout_classes, (str, bytes)) or not isinstance(holdout_classes, Iterable):
        raise TypeError(f"holdout_classes must be an iterable of ints, got {holdout_classes!r}")
    holdout_list = list(holdout_classes)
    for c in holdout_list:
        if isinstance(c, bool) or not isinstance(c, numbers.Integral) or not 0 <= c <= 9:
            raise ValueError(f"holdout_classes must contain digits 0..9, got {holdout_list!r}")
    if len(set(holdout_list)) != len(holdout_list):
        raise ValueError(f"holdout_classes must not repeat a class, got {holdout_list!r}")
    holdout = tuple(sorted(int(c) for c in holdout_list))
    classes = tuple(c for c in range(10) if c not in holdout)
    if len(classes) < 2:
        raise ValueError(
            f"holdout_classes must leave at least 2 in-distribution classes, got {holdout_list!r}"
        )

    bunch = _import_load_digits()()
    images = np.asarray(bunch.images, dtype=np.float32) / 16.0  # (1797, 8, 8)
    targets = np.asarray(bunch.target, dtype=np.int64)  # (1797,)

    rng = np.random.default_rng(seed)
    label_map = {c: k for k, c in enumerate(classes)}
    parts: dict[str, list[np.ndarray]] = {"train": [], "val": [], "test": []}
    for c in classes:
        idx = rng.permutation(np.flatnonzero(targets == c))
        n_test = int(round(test_fraction * len(idx)))
        n_val = int(round(val_fraction * len(idx)))
        if n_test + n_val >= len(idx):
            raise ValueError(
                f"val_fraction={val_fraction} and test_fraction={test_fraction} leave no "
                f"training samples for class {c} ({len(idx)} samples)"
            )
        parts["test"].append(idx[:n_test])
        parts["val"].append(idx[n_test : n_test + n_val])
        parts["train"].append(idx[n_test + n_val :])

    remap = np.full(10, -1, dtype=np.int64)
    for c, k in label_map.items():
        remap[c] = k

    def take(name: str) -> tuple[Tensor, Tensor]:
        idx = rng.permutation(np.concatenate(parts[name]))
        x = torch.from_numpy(images[idx].copy())  # (N, 8, 8)
        y = torch.from_numpy(remap[targets[idx]])  # (N,)
        return x, y

    x_train, y_train = take("train")
    x_val, y_val = take("val")
    x_test, y_test = take("test")
    ood_idx = np.flatnonzero(np.isin(targets, holdout))
    x_ood = torch.from_numpy(images[ood_idx].copy()).reshape(-1, 8, 8)  # (N_ood, 8, 8)
    y_ood = torch.from_numpy(targets[ood_idx].copy())  # (N_ood,)
    return DigitsData(
        x_train=x_train,
        y_train=y_train,
        x_val=x_val,
        y_val=y_val,
        x_test=x_test,
        y_test=y_test,
        classes=classes,
        label_map=label_map,
        holdout_classes=holdout,
        x_ood_classes=x_ood,
        y_ood_classes=y_ood,
        seed=seed,
    )


# --------------------------------------------------------------------------------------
# corruptions
# --------------------------------------------------------------------------------------

CORRUPTION_KINDS: tuple[str, ...] = ("noise", "rotation", "occlusion")
_NOISE_STD = (0.05, 0.1, 0.2, 0.3, 0.4)  # severity 1..5
_ROTATION_DEG = (15.0, 30.0, 45.0, 60.0, 75.0)
_OCCLUSION_FRAC = (0.25, 0.375, 0.5, 0.625, 0.75)  # patch side / min(H, W)


def _check_kind(kind: Any) -> str:
    if kind not in CORRUPTION_KINDS:
        raise ValueError(f"kind must be one of {CORRUPTION_KINDS}, got {kind!r}")
    return kind


def _check_severity(severity: Any) -> int:
    if isinstance(severity, bool) or not isinstance(severity, numbers.Integral):
        raise TypeError(f"severity must be an int in 1..5, got {severity!r}")
    if not 1 <= severity <= 5:
        raise ValueError(f"severity must be an int in 1..5, got {severity}")
    return int(severity)


def _occlusion_side(severity: int, height: int, width: int) -> int:
    return max(1, int(round(min(height, width) * _OCCLUSION_FRAC[severity - 1])))


def corrupt_images(x: Tensor, kind: str, severity: int, seed: int = 0) -> Tensor:
    """Return a corrupted copy of ``x`` (the input is not modified).

    * ``"noise"``: additive Gaussian noise, std ``(0.05, 0.1, 0.2, 0.3, 0.4)`` for
      severity 1..5, clipped to ``[0, 1]``.
    * ``"rotation"``: rotation about the image centre by ``15 * severity`` degrees with a
      seeded random direction per image; bilinear sampling, zeros outside.
    * ``"occlusion"``: a zeroed square of side ``round(min(H, W) * (severity + 1) / 8)``
      (2..6 pixels on 8x8) at a seeded random location fully inside the image.

    The random draws do not depend on ``severity`` (common random numbers), so for a
    fixed seed severities differ only in magnitude.

    Shape:
        x: ``(N, H, W)`` floating point. Returns ``(N, H, W)``, same dtype and device.
    """
    x = _check_tensor("x", x, 3)
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating point tensor, got dtype {x.dtype}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"x must be finite; got NaN or Inf pixels in shape {tuple(x.shape)}")
    kind = _check_kind(kind)
    severity = _check_severity(severity)
    seed = _check_seed(seed)
    g = _torch_generator(seed)
    n, h, w = x.shape

    if kind == "noise":
        noise = torch.randn((n, h, w), generator=g).to(device=x.device, dtype=x.dtype)
        return (x + _NOISE_STD[severity - 1] * noise).clamp(0.0, 1.0)  # (N, H, W)

    if kind == "rotation":
        sign = torch.randint(0, 2, (n,), generator=g).to(x.dtype) * 2 - 1  # (N,)
        angle = sign * math.radians(_ROTATION_DEG[severity - 1])
        cos, sin = torch.cos(angle), torch.sin(angle)
        zeros = torch.zeros_like(cos)
        # output pixel p samples input at R p; normalised coords rescale by the aspect ratio
        theta = torch.stack(
            [
                torch.stack([cos, -sin * h / w, zeros], dim=-1),
                torch.stack([sin * w / h, cos, zeros], dim=-1),
            ],
            dim=1,
        ).to(x.device)  # (N, 2, 3)
        grid = F.affine_grid(theta, [n, 1, h, w], align_corners=False)  # (N, H, W, 2)
        out = F.grid_sample(
            x.unsqueeze(1), grid, mode="bilinear", padding_mode="zeros", align_corners=False
        )  # (N, 1, H, W)
        return out.squeeze(1)

    # occlusion
    side = _occlusion_side(severity, h, w)
    u = torch.rand((n, 2), generator=g)  # (N, 2)
    top = torch.floor(u[:, 0] * (h - side + 1)).long().to(x.device)  # (N,)
    left = torch.floor(u[:, 1] * (w - side + 1)).long().to(x.device)  # (N,)
    rows = torch.arange(h, device=x.device)
    cols = torch.arange(w, device=x.device)
    row_in = (rows >= top[:, None]) & (rows < top[:, None] + side)  # (N, H)
    col_in = (cols >= left[:, None]) & (cols < left[:, None] + side)  # (N, W)
    mask = row_in[:, :, None] & col_in[:, None, :]  # (N, H, W)
    return x.masked_fill(mask, 0.0)


def corruption_suite(
    x: Tensor,
    kinds: Sequence[str] = CORRUPTION_KINDS,
    severities: Sequence[int] = (1, 3, 5),
    seed: int = 0,
) -> dict[tuple[str, int], Tensor]:
    """Corrupt ``x`` with every ``(kind, severity)`` combination.

    Every entry uses the same ``seed``; entry ``(k, s)`` equals
    ``corrupt_images(x, k, s, seed)``.

    Shape:
        x: ``(N, H, W)``. Returns ``{(kind, severity): (N, H, W)}`` in kinds x severities
        order.
    """
    if isinstance(kinds, str) or len(kinds) == 0:
        raise ValueError(f"kinds must be a non-empty sequence of kind names, got {kinds!r}")
    if isinstance(severities, (str, bytes)) or len(severities) == 0:
        raise ValueError(f"severities must be a non-empty sequence of ints, got {severities!r}")
    for k in kinds:
        _check_kind(k)
    for s in severities:
        _check_severity(s)
    return {(k, int(s)): corrupt_images(x, k, s, seed=seed) for k in kinds for s in severities}


# --------------------------------------------------------------------------------------
# patches
# --------------------------------------------------------------------------------------


def images_to_patches(x: Tensor, patch_size: int = 2) -> Tensor:
    """Cut images into non-overlapping square patches (ViT-style tokens).

    Patches are ordered row-major over the patch grid, and pixels row-major within a
    patch. An 8x8 image with ``patch_size=2`` gives 16 patches of dimension 4.

    Shape:
        x: ``(N, H, W)``. Returns ``(N, (H // p) * (W // p), p * p)``.
    """
    x = _check_tensor("x", x, 3)
    p = _check_int("patch_size", patch_size, min_value=1)
    n, h, w = x.shape
    if h % p or w % p:
        raise ValueError(f"image size (H, W) = ({h}, {w}) is not divisible by patch_size={p}")
    gh, gw = h // p, w // p
    patches = x.reshape(n, gh, p, gw, p).permute(0, 1, 3, 2, 4)  # (N, gh, gw, p, p)
    return patches.reshape(n, gh * gw, p * p)


def patches_to_images(patches: Tensor, image_size: int | tuple[int, int] | None = None) -> Tensor:
    """Inverse of :func:`images_to_patches`.

    ``image_size`` is ``(H, W)`` or an int for square images; ``None`` assumes a square
    patch grid.

    Shape:
        patches: ``(N, num_patches, p * p)``. Returns ``(N, H, W)``.
    """
    patches = _check_tensor("patches", patches, 3)
    n, num_patches, dim = patches.shape
    p = math.isqrt(dim)
    if p * p != dim or dim == 0:
        raise ValueError(f"patch dimension must be a perfect square p * p, got {dim}")
    if image_size is None:
        g = math.isqrt(num_patches)
        if g * g != num_patches:
            raise ValueError(
                f"num_patches={num_patches} is not a square grid; pass image_size=(H, W)"
            )
        h = w = g * p
    else:
        if isinstance(image_size, numbers.Integral) and not isinstance(image_size, bool):
            h = w = int(image_size)
        elif (
            isinstance(image_size, tuple)
            and len(image_size) == 2
            and all(isinstance(v, numbers.Integral) for v in image_size)
        ):
            h, w = (int(v) for v in image_size)
        else:
            raise TypeError(f"image_size must be an int or (H, W) tuple, got {image_size!r}")
        if h % p or w % p or (h // p) * (w // p) != num_patches:
            raise ValueError(
                f"image_size={image_size!r} does not match {num_patches} patches of size {p}x{p}"
            )
    gh, gw = h // p, w // p
    x = patches.reshape(n, gh, gw, p, p).permute(0, 1, 3, 2, 4)  # (N, gh, p, gw, p)
    return x.reshape(n, h, w)


# ======================================================================================
# Sequence tasks
# ======================================================================================

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>")
_NUM_SPECIAL = len(SPECIAL_TOKENS)

Alignment = list[tuple[int, int]]


@dataclass
class SequenceTask:
    """A batch of source/target token-id sequences with vocabularies.

    ``src`` rows are the source tokens right-padded with ``pad_id`` (no BOS/EOS).
    ``tgt`` rows are ``bos_id, words..., eos_id`` right-padded with ``pad_id``; feed
    ``tgt[:, :-1]`` to a decoder and predict ``tgt[:, 1:]``. ``alignments[i]`` lists
    ``(src_pos, tgt_pos)`` pairs for example ``i``, sorted, with ``tgt_pos`` indexing
    ``tgt[i, 1:]``. ``meta`` records how the task was generated.

    Shape:
        src: ``(N, S)`` int64; tgt: ``(N, T)`` int64.
    """

    src: Tensor
    tgt: Tensor
    src_vocab: list[str]
    tgt_vocab: list[str]
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    alignments: list[Alignment] | None = None
    src_text: list[str] | None = None
    tgt_text: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("src", "tgt"):
            t = _check_tensor(name, getattr(self, name), 2)
            if t.dtype != torch.int64:
                raise TypeError(f"{name} must have dtype torch.int64, got {t.dtype}")
        if self.src.shape[0] != self.tgt.shape[0]:
            raise ValueError(
                f"src and tgt must have the same number of rows, got {self.src.shape[0]} "
                f"and {self.tgt.shape[0]}"
            )
        n = self.src.shape[0]
        for name in ("alignments", "src_text", "tgt_text"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} must have {n} entries, got {len(value)}")

    def __len__(self) -> int:
        return int(self.src.shape[0])

    @property
    def src_vocab_size(self) -> int:
        return len(self.src_vocab)

    @property
    def tgt_vocab_size(self) -> int:
        return len(self.tgt_vocab)

    def src_padding_mask(self) -> Tensor:
        """Boolean mask, True at PAD (PyTorch ``key_padding_mask`` convention).

        Shape:
            Returns ``(N, S)`` bool.
        """
        return self.src == self.pad_id

    def tgt_padding_mask(self) -> Tensor:
        """Boolean mask, True at PAD positions of ``tgt``.

        Shape:
            Returns ``(N, T)`` bool.
        """
        return self.tgt == self.pad_id

    def src_lengths(self) -> Tensor:
        """Number of non-PAD source tokens per row.

        Shape:
            Returns ``(N,)`` int64.
        """
        return (self.src != self.pad_id).sum(dim=1)

    def _vocab(self, which: str) -> list[str]:
        if which == "src":
            return self.src_vocab
        if which == "tgt":
            return self.tgt_vocab
        raise ValueError(f"which must be 'src' or 'tgt', got {which!r}")

    def decode(
        self, ids: Tensor | Sequence[int], which: str = "tgt", strip_special: bool = True
    ) -> list[str]:
        """Map one row of token ids to token strings.

        With ``strip_special`` (default) BOS and PAD are dropped and decoding stops at
        the first EOS.

        Shape:
            ids: ``(L,)``. Returns a list of at most ``L`` strings.
        """
        vocab = self._vocab(which)
        if isinstance(ids, Tensor):
            if ids.ndim != 1:
                raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
            id_list = [int(i) for i in ids.tolist()]
        else:
            id_list = [int(i) for i in ids]
        out: list[str] = []
        for i in id_list:
            if not 0 <= i < len(vocab):
                raise ValueError(f"token id {i} is outside the {which} vocabulary of {len(vocab)}")
            if strip_special:
                if i == self.eos_id:
                    break
                if i in (self.pad_id, self.bos_id):
                    continue
            out.append(vocab[i])
        return out

    def encode(self, tokens: Sequence[str] | str, which: str = "src") -> list[int]:
        """Map token strings (or a whitespace-separated string) to ids, no specials added.

        Shape:
            Returns a list of ``len(tokens)`` ids.
        """
        vocab = self._vocab(which)
        lookup = {t: i for i, t in enumerate(vocab)}
        words = tokens.split() if isinstance(tokens, str) else list(tokens)
        unknown = [t for t in words if t not in lookup]
        if unknown:
            raise ValueError(f"tokens {unknown!r} are not in the {which} vocabulary")
        return [lookup[t] for t in words]

    def alignment_matrix(self) -> Tensor:
        """Dense gold alignments: ``A[i, t, s] = 1`` if target word ``t`` aligns to ``s``.

        Shape:
            Returns ``(N, T - 1, S)`` float32, rows indexed like ``tgt[:, 1:]``.
        """
        if self.alignments is None:
            raise ValueError("this task has no alignments (alignments is None)")
        n, s = self.src.shape
        out = torch.zeros(n, self.tgt.shape[1] - 1, s)  # (N, T-1, S)
        for i, pairs in enumerate(self.alignments):
            for sp, tp in pairs:
                out[i, tp, sp] = 1.0
        return out

    def subset(self, index: Tensor | Sequence[int]) -> SequenceTask:
        """Rows ``index`` of this task as a new task (vocabularies are shared copies).

        Shape:
            index: ``(M,)``. Returns a task with ``M`` rows.
        """
        idx = torch.as_tensor(index, dtype=torch.long)
        if idx.ndim != 1:
            raise ValueError(f"index must be 1-D, got shape {tuple(idx.shape)}")
        rows = idx.tolist()

        def pick(values: list[Any] | None) -> list[Any] | None:
            return None if values is None else [values[i] for i in rows]

        return SequenceTask(
            src=self.src[idx].clone(),
            tgt=self.tgt[idx].clone(),
            src_vocab=list(self.src_vocab),
            tgt_vocab=list(self.tgt_vocab),
            pad_id=self.pad_id,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
            alignments=pick(self.alignments),
            src_text=pick(self.src_text),
            tgt_text=pick(self.tgt_text),
            meta=dict(self.meta),
        )


# --------------------------------------------------------------------------------------
# algorithmic tasks: copy / reverse / sort
# --------------------------------------------------------------------------------------

_ALGORITHMIC_TASKS = ("copy", "reverse", "sort")


def _token_vocab(vocab_size: int) -> list[str]:
    return list(SPECIAL_TOKENS) + [str(k) for k in range(vocab_size)]


def _algorithmic_task(
    name: str,
    n: int,
    length: int,
    vocab_size: int,
    seed: int,
    min_length: int | None,
    *,
    num_unseen: int = 0,
    unseen_fraction: float = 0.0,
    meta: dict[str, Any] | None = None,
) -> SequenceTask:
    n = _check_int("n", n, min_value=1)
    length = _check_int("length", length, min_value=1)
    vocab_size = _check_int("vocab_size", vocab_size, min_value=1)
    seed = _check_seed(seed)
    if min_length is None:
        min_length = length
    min_length = _check_int("min_length", min_length, min_value=1)
    if min_length > length:
        raise ValueError(f"min_length must be <= length={length}, got {min_length}")

    g = _torch_generator(seed)
    lengths = torch.randint(min_length, length + 1, (n,), generator=g)  # (N,)
    first = _NUM_SPECIAL
    tokens = torch.randint(first, first + vocab_size, (n, length), generator=g)  # (N, S)
    pos = torch.arange(length)
    valid = pos[None, :] < lengths[:, None]  # (N, S)
    if num_unseen:
        unseen = torch.randint(
            first + vocab_size, first + vocab_size + num_unseen, (n, length), generator=g
        )  # (N, S)
        use_unseen = torch.rand((n, length), generator=g) < unseen_fraction  # (N, S)
        # force at least one unseen token per row, at a random valid position
        forced = torch.floor(torch.rand(n, generator=g) * lengths).long()  # (N,)
        use_unseen[torch.arange(n), forced] = True
        tokens = torch.where(use_unseen, unseen, tokens)
    src = tokens.masked_fill(~valid, PAD_ID)  # (N, S)

    if name == "copy":
        perm = pos.expand(n, length)  # (N, L) tgt word t <- src position t
    elif name == "reverse":
        perm = (lengths[:, None] - 1 - pos[None, :]).clamp(min=0)  # (N, L)
    else:  # sort, stable so ties keep source order
        keys = src.masked_fill(~valid, torch.iinfo(torch.int64).max)
        perm = torch.sort(keys, dim=1, stable=True).indices  # (N, L)
    words = torch.gather(src, 1, perm).masked_fill(~valid, PAD_ID)  # (N, L)

    tgt = torch.full((n, length + 2), PAD_ID, dtype=torch.int64)  # (N, T)
    tgt[:, 0] = BOS_ID
    tgt[:, 1 : length + 1] = words
    tgt[torch.arange(n), lengths + 1] = EOS_ID

    perm_rows = perm.tolist()
    alignments = [sorted((perm_rows[i][t], t) for t in range(int(lengths[i]))) for i in range(n)]
    vocab = _token_vocab(vocab_size + num_unseen)
    info = {
        "task": name,
        "length": length,
        "min_length": min_length,
        "vocab_size": vocab_size,
        "seed": seed,
    }
    info.update(meta or {})
    return SequenceTask(
        src=src,
        tgt=tgt,
        src_vocab=vocab,
        tgt_vocab=list(vocab),
        alignments=alignments,
        meta=info,
    )


def make_copy_task(
    n: int, length: int = 8, vocab_size: int = 10, seed: int = 0, min_length: int | None = None
) -> SequenceTask:
    """Copy task: the target repeats the source.

    Tokens are uniform over ``vocab_size`` symbols (ids ``3 .. 3 + vocab_size - 1``,
    named ``"0", "1", ...``). Sequence lengths are uniform in ``[min_length, length]``
    (all ``length`` when ``min_length`` is None). Target word ``t`` aligns to source
    position ``t``.

    Shape:
        src: ``(n, length)``; tgt: ``(n, length + 2)``.
    """
    return _algorithmic_task("copy", n, length, vocab_size, seed, min_length)


def make_reverse_task(
    n: int, length: int = 8, vocab_size: int = 10, seed: int = 0, min_length: int | None = None
) -> SequenceTask:
    """Reverse task: the target is the source reversed (padding stays at the end).

    Target word ``t`` aligns to source position ``L - 1 - t`` for a row of length ``L``.

    Shape:
        src: ``(n, length)``; tgt: ``(n, length + 2)``.
    """
    return _algorithmic_task("reverse", n, length, vocab_size, seed, min_length)


def make_sort_task(
    n: int, length: int = 8, vocab_size: int = 10, seed: int = 0, min_length: int | None = None
) -> SequenceTask:
    """Sort task: the target is the source sorted ascending by token id.

    Alignments follow a stable sort: equal tokens keep their source order.

    Shape:
        src: ``(n, length)``; tgt: ``(n, length + 2)``.
    """
    return _algorithmic_task("sort", n, length, vocab_size, seed, min_length)


_TASK_FNS: dict[Callable[..., SequenceTask], str] = {
    make_copy_task: "copy",
    make_reverse_task: "reverse",
    make_sort_task: "sort",
}

OOD_SEQUENCE_KINDS = ("longer", "unseen_tokens")


def make_ood_sequences(
    task_fn: Callable[..., SequenceTask] | str,
    n: int,
    kind: str = "longer",
    *,
    length: int = 8,
    vocab_size: int = 10,
    seed: int = 0,
    min_length: int | None = None,
    ood_length: int | None = None,
    num_unseen_tokens: int = 5,
    unseen_fraction: float = 0.5,
) -> SequenceTask:
    """Out-of-distribution variants of a copy / reverse / sort task.

    ``task_fn`` is :func:`make_copy_task`, :func:`make_reverse_task`,
    :func:`make_sort_task` or their names. ``length``, ``vocab_size`` and ``min_length``
    describe the *training* distribution.

    * ``"longer"``: lengths uniform in ``[length + 1, ood_length]`` (default
      ``2 * length``), same vocabulary and ids as training.
    * ``"unseen_tokens"``: training lengths, but the vocabulary is extended by
      ``num_unseen_tokens`` ids ``3 + vocab_size ..`` never produced in training; each
      position uses one with probability ``unseen_fraction`` and every row has at least
      one. Training-token ids are unchanged, so size embeddings with
      ``len(ood.src_vocab)`` to score these rows.

    For the translation task, use ``patterns`` instead (e.g. train on ``"perfect"`` and
    evaluate on ``"subordinate"``).

    Shape:
        src: ``(n, S)`` with ``S = ood_length`` or ``length``; tgt: ``(n, S + 2)``.
    """
    if isinstance(task_fn, str):
        if task_fn not in _ALGORITHMIC_TASKS:
            raise ValueError(f"task_fn must be one of {_ALGORITHMIC_TASKS}, got {task_fn!r}")
        name = task_fn
    elif callable(task_fn) and task_fn in _TASK_FNS:
        name = _TASK_FNS[task_fn]
    else:
        raise ValueError(
            "task_fn must be make_copy_task, make_reverse_task, make_sort_task or one of "
            f"{_ALGORITHMIC_TASKS}, got {task_fn!r}"
        )
    length = _check_int("length", length, min_value=1)
    if kind == "longer":
        if ood_length is None:
            ood_length = 2 * length
        ood_length = _check_int("ood_length", ood_length, min_value=1)
        if ood_length <= length:
            raise ValueError(f"ood_length must be > length={length}, got {ood_length}")
        return _algorithmic_task(
            name,
            n,
            ood_length,
            vocab_size,
            seed,
            length + 1,
            meta={"ood": "longer", "train_length": length},
        )
    if kind == "unseen_tokens":
        num_unseen = _check_int("num_unseen_tokens", num_unseen_tokens, min_value=1)
        if isinstance(unseen_fraction, bool) or not isinstance(unseen_fraction, numbers.Real):
            raise TypeError(f"unseen_fraction must be a float, got {unseen_fraction!r}")
        if not 0.0 <= unseen_fraction <= 1.0:
            raise ValueError(f"unseen_fraction must be in [0, 1], got {unseen_fraction}")
        vocab_size = _check_int("vocab_size", vocab_size, min_value=1)
        return _algorithmic_task(
            name,
            n,
            length,
            vocab_size,
            seed,
            min_length,
            num_unseen=num_unseen,
            unseen_fraction=float(unseen_fraction),
            meta={
                "ood": "unseen_tokens",
                "train_vocab_size": _NUM_SPECIAL + vocab_size,
                "num_unseen_tokens": num_unseen,
            },
        )
    raise ValueError(f"kind must be one of {OOD_SEQUENCE_KINDS}, got {kind!r}")


# --------------------------------------------------------------------------------------
# rule-based English -> German translation
# --------------------------------------------------------------------------------------

TRANSLATION_PATTERNS: tuple[str, ...] = ("perfect", "subordinate", "modal")

# person keys: 1sg, 2sg, 3sg, 1pl, 3pl
_SUBJECTS: dict[str, tuple[str, str]] = {
    "i": ("ich", "1sg"),
    "you": ("du", "2sg"),
    "he": ("er", "3sg"),
    "she": ("sie", "3sg"),
    "we": ("wir", "1pl"),
    "they": ("sie", "3pl"),
}
_EN_HAVE = {"1sg": "have", "2sg": "have", "3sg": "has", "1pl": "have", "3pl": "have"}
_DE_HAVE = {"1sg": "habe", "2sg": "hast", "3sg": "hat", "1pl": "haben", "3pl": "haben"}
_MODALS: dict[str, dict[str, str]] = {
    "can": {"1sg": "kann", "2sg": "kannst", "3sg": "kann", "1pl": "können", "3pl": "können"},
    "must": {"1sg": "muss", "2sg": "musst", "3sg": "muss", "1pl": "müssen", "3pl": "müssen"},
    "should": {"1sg": "soll", "2sg": "sollst", "3sg": "soll", "1pl": "sollen", "3pl": "sollen"},
}
# clause-embedding verbs: english (base, 3sg) -> german conjugation
_SAY_VERBS: dict[str, tuple[str, dict[str, str]]] = {
    "know": (
        "knows",
        {"1sg": "weiß", "2sg": "weißt", "3sg": "weiß", "1pl": "wissen", "3pl": "wissen"},
    ),
    "think": (
        "thinks",
        {"1sg": "glaube", "2sg": "glaubst", "3sg": "glaubt", "1pl": "glauben", "3pl": "glauben"},
    ),
    "say": (
        "says",
        {"1sg": "sage", "2sg": "sagst", "3sg": "sagt", "1pl": "sagen", "3pl": "sagen"},
    ),
}
# english noun -> (german accusative article, german noun)
_OBJECTS: dict[str, tuple[str, str]] = {
    "house": ("das", "haus"),
    "dog": ("den", "hund"),
    "car": ("das", "auto"),
    "book": ("das", "buch"),
    "cat": ("die", "katze"),
    "man": ("den", "mann"),
    "woman": ("die", "frau"),
    "child": ("das", "kind"),
    "apple": ("den", "apfel"),
    "letter": ("den", "brief"),
    "newspaper": ("die", "zeitung"),
    "key": ("den", "schlüssel"),
    "table": ("den", "tisch"),
    "city": ("die", "stadt"),
    "bike": ("das", "fahrrad"),
}
# verb lemma -> (en infinitive, en participle, de infinitive, de participle, objects)
_VERBS: dict[str, tuple[str, str, str, str, tuple[str, ...]]] = {
    "see": ("see", "seen", "sehen", "gesehen", tuple(_OBJECTS)),
    "find": (
        "find",
        "found",
        "finden",
        "gefunden",
        ("dog", "cat", "book", "letter", "key", "newspaper", "child", "bike", "house"),
    ),
    "buy": (
        "buy",
        "bought",
        "kaufen",
        "gekauft",
        ("house", "car", "book", "dog", "cat", "apple", "newspaper", "table", "bike"),
    ),
    "sell": (
        "sell",
        "sold",
        "verkaufen",
        "verkauft",
        ("house", "car", "book", "dog", "cat", "table", "bike"),
    ),
    "read": ("read", "read", "lesen", "gelesen", ("book", "letter", "newspaper")),
    "write": ("write", "written", "schreiben", "geschrieben", ("book", "letter")),
    "visit": ("visit", "visited", "besuchen", "besucht", ("man", "woman", "child", "city")),
    "call": ("call", "called", "anrufen", "angerufen", ("man", "woman", "child")),
    "wash": (
        "wash",
        "washed",
        "waschen",
        "gewaschen",
        ("car", "dog", "cat", "child", "apple", "table", "bike"),
    ),
    "lose": ("lose", "lost", "verlieren", "verloren", ("key", "book", "letter", "dog", "cat")),
    "eat": ("eat", "eaten", "essen", "gegessen", ("apple",)),
}
_ADVERBS = {"today": "heute", "yesterday": "gestern", "tomorrow": "morgen"}
_PERFECT_ADVERBS: tuple[str | None, ...] = (None, "today", "yesterday")
_MODAL_ADVERBS: tuple[str | None, ...] = (None, "today", "tomorrow")

_EN_PARTICIPLES = {v[1]: lemma for lemma, v in _VERBS.items()}
_EN_INFINITIVES = {v[0]: lemma for lemma, v in _VERBS.items()}
_EN_SAY = {base: base for base in _SAY_VERBS} | {v[0]: base for base, v in _SAY_VERBS.items()}
_VERB_OBJECTS: tuple[tuple[str, str], ...] = tuple(
    (lemma, noun) for lemma, v in _VERBS.items() for noun in v[4]
)
# maximum sentence lengths (words) per pattern: (english, german)
_MAX_WORDS = {"perfect": (6, 6), "modal": (6, 6), "subordinate": (9, 10)}


def _translation_vocabs() -> tuple[list[str], list[str]]:
    en: set[str] = {"that", "the"}
    de: set[str] = {",", "dass"}
    for en_w, (de_w, _) in _SUBJECTS.items():
        en.add(en_w)
        de.add(de_w)
    en.update(_EN_HAVE.values())
    de.update(_DE_HAVE.values())
    for modal, forms in _MODALS.items():
        en.add(modal)
        de.update(forms.values())
    for base, (third, forms) in _SAY_VERBS.items():
        en.update((base, third))
        de.update(forms.values())
    for noun, (article, de_noun) in _OBJECTS.items():
        en.add(noun)
        de.update((article, de_noun))
    for en_inf, en_part, de_inf, de_part, _ in _VERBS.values():
        en.update((en_inf, en_part))
        de.update((de_inf, de_part))
    en.update(_ADVERBS)
    de.update(_ADVERBS.values())
    return list(SPECIAL_TOKENS) + sorted(en), list(SPECIAL_TOKENS) + sorted(de)


def _untranslatable(tokens: Sequence[str], pos: int, expected: str) -> ValueError:
    got = repr(tokens[pos]) if pos < len(tokens) else "end of sentence"
    return ValueError(
        f"cannot translate {' '.join(tokens)!r}: expected {expected} at position {pos}, got {got}"
    )


def _translate_clause(
    tokens: Sequence[str], start: int, subordinate: bool
) -> list[tuple[str, int | None]]:
    """German words of one clause, each paired with its English source position."""
    i = start
    if i >= len(tokens) or tokens[i] not in _SUBJECTS:
        raise _untranslatable(tokens, i, f"a subject {tuple(_SUBJECTS)}")
    de_subj, person = _SUBJECTS[tokens[i]]
    subj_pos = i
    aux = tokens[i + 1] if i + 1 < len(tokens) else None
    if aux in ("have", "has"):
        if aux != _EN_HAVE[person]:
            raise _untranslatable(tokens, i + 1, f"{_EN_HAVE[person]!r} after {tokens[i]!r}")
        de_finite = _DE_HAVE[person]
        verb_table, verb_kind, verb_index = _EN_PARTICIPLES, "a past participle", 3
    elif aux in _MODALS:
        de_finite = _MODALS[aux][person]
        verb_table, verb_kind, verb_index = _EN_INFINITIVES, "an infinitive", 2
    else:
        raise _untranslatable(tokens, i + 1, "'have'/'has' or a modal (can, must, should)")
    if i + 2 >= len(tokens) or tokens[i + 2] not in verb_table:
        raise _untranslatable(tokens, i + 2, verb_kind)
    de_verb = _VERBS[verb_table[tokens[i + 2]]][verb_index]
    if i + 3 >= len(tokens) or tokens[i + 3] != "the":
        raise _untranslatable(tokens, i + 3, "'the'")
    if i + 4 >= len(tokens) or tokens[i + 4] not in _OBJECTS:
        raise _untranslatable(tokens, i + 4, "an object noun")
    article, de_noun = _OBJECTS[tokens[i + 4]]
    adverb: list[tuple[str, int | None]] = []
    end = i + 5
    if end < len(tokens):
        if tokens[end] not in _ADVERBS:
            raise _untranslatable(tokens, end, f"an adverb {tuple(_ADVERBS)}")
        adverb = [(_ADVERBS[tokens[end]], end)]
        end += 1
    if end != len(tokens):
        raise _untranslatable(tokens, end, "end of sentence")

    finite = (de_finite, i + 1)
    nonfinite = (de_verb, i + 2)
    middle = adverb + [(article, i + 3), (de_noun, i + 4)]
    if subordinate:  # verb cluster at the end, finite verb last
        return [(de_subj, subj_pos), *middle, nonfinite, finite]
    return [(de_subj, subj_pos), finite, *middle, nonfinite]  # verb-second, bracket


def translate_sentence(
    english_tokens: Sequence[str] | str,
) -> tuple[list[str], list[tuple[int, int]]]:
    """Translate one sentence of the toy grammar to German, with word alignments.

    Grammar (lowercase tokens)::

        sentence := clause | SUBJ SAY "that" clause
        clause   := SUBJ (HAVE PARTICIPLE | MODAL INFINITIVE) "the" NOUN [ADVERB]

    German puts the non-finite verb at the end of a main clause
    (``i have seen the house`` -> ``ich habe das haus gesehen``), the time adverb after
    the finite verb, and the whole verb cluster at the end of a subordinate clause with
    the finite verb last (``... , dass du den hund gesehen hast``). Alignments are
    ``(english_pos, german_pos)`` pairs; every English word aligns to exactly one German
    word, and only the comma is unaligned.

    Shape:
        Returns ``(german_tokens, alignment)`` with ``len(alignment) == len(english)``.
    """
    if isinstance(english_tokens, str):
        tokens = english_tokens.split()
    elif isinstance(english_tokens, Sequence) and all(isinstance(t, str) for t in english_tokens):
        tokens = list(english_tokens)
    else:
        raise TypeError(
            f"english_tokens must be a string or a sequence of strings, got {english_tokens!r}"
        )
    if len(tokens) >= 2 and tokens[1] in _EN_SAY:
        if tokens[0] not in _SUBJECTS:
            raise _untranslatable(tokens, 0, f"a subject {tuple(_SUBJECTS)}")
        de_subj, person = _SUBJECTS[tokens[0]]
        base = _EN_SAY[tokens[1]]
        third, forms = _SAY_VERBS[base]
        expected = third if person == "3sg" else base
        if tokens[1] != expected:
            raise _untranslatable(tokens, 1, f"{expected!r} after {tokens[0]!r}")
        if len(tokens) < 3 or tokens[2] != "that":
            raise _untranslatable(tokens, 2, "'that'")
        words: list[tuple[str, int | None]] = [
            (de_subj, 0),
            (forms[person], 1),
            (",", None),
            ("dass", 2),
            *_translate_clause(tokens, 3, subordinate=True),
        ]
    else:
        words = _translate_clause(tokens, 0, subordinate=False)
    german = [w for w, _ in words]
    alignment = sorted((src, j) for j, (_, src) in enumerate(words) if src is not None)
    return german, alignment


def _english_clause(person_word: str, index: int, modal: bool) -> list[str]:
    """Decode a clause index (verb-object x [modal] x adverb) into English tokens."""
    adverbs = _MODAL_ADVERBS if modal else _PERFECT_ADVERBS
    index, adv_i = divmod(index, len(adverbs))
    index, vo_i = divmod(index, len(_VERB_OBJECTS))
    lemma, noun = _VERB_OBJECTS[vo_i]
    en_inf, en_part = _VERBS[lemma][0], _VERBS[lemma][1]
    person = _SUBJECTS[person_word][1]
    if modal:
        head = [tuple(_MODALS)[index], en_inf]
    else:
        head = [_EN_HAVE[person], en_part]
    adverb = adverbs[adv_i]
    return [person_word, *head, "the", noun] + ([adverb] if adverb else [])


_N_SUBJ = len(_SUBJECTS)
_N_PERFECT_CLAUSES = len(_VERB_OBJECTS) * len(_PERFECT_ADVERBS)
_N_MODAL_CLAUSES = len(_MODALS) * len(_VERB_OBJECTS) * len(_MODAL_ADVERBS)
_PATTERN_SIZES = {
    "perfect": _N_SUBJ * _N_PERFECT_CLAUSES,
    "modal": _N_SUBJ * _N_MODAL_CLAUSES,
    "subordinate": _N_SUBJ * len(_SAY_VERBS) * _N_SUBJ * (_N_PERFECT_CLAUSES + _N_MODAL_CLAUSES),
}


def _english_sentence(pattern: str, index: int) -> list[str]:
    subjects = tuple(_SUBJECTS)
    if pattern in ("perfect", "modal"):
        index, s = divmod(index, _N_SUBJ)
        return _english_clause(subjects[s], index, modal=pattern == "modal")
    index, s = divmod(index, _N_SUBJ)
    index, v = divmod(index, len(_SAY_VERBS))
    index, s2 = divmod(index, _N_SUBJ)
    base = tuple(_SAY_VERBS)[v]
    say = _SAY_VERBS[base][0] if _SUBJECTS[subjects[s]][1] == "3sg" else base
    if index < _N_PERFECT_CLAUSES:
        inner = _english_clause(subjects[s2], index, modal=False)
    else:
        inner = _english_clause(subjects[s2], index - _N_PERFECT_CLAUSES, modal=True)
    return [subjects[s], say, "that", *inner]


def _balanced_counts(n: int, capacities: list[int], unique: bool) -> list[int]:
    """Split ``n`` as evenly as possible over patterns, capped by capacity if unique."""
    k = len(capacities)
    counts = [n // k + (1 if j < n % k else 0) for j in range(k)]
    if not unique:
        return counts
    counts = [0] * k
    remaining = n
    open_ = [j for j in range(k) if capacities[j] > 0]
    while remaining and open_:  # water-filling
        share, extra = divmod(remaining, len(open_))
        still_open = []
        for r, j in enumerate(open_):
            want = share + (1 if r < extra else 0)
            take = min(want, capacities[j] - counts[j])
            counts[j] += take
            remaining -= take
            if counts[j] < capacities[j]:
                still_open.append(j)
        open_ = still_open
    return counts


def make_translation_task(
    n: int,
    seed: int = 0,
    patterns: Sequence[str] = TRANSLATION_PATTERNS,
    unique: bool = True,
) -> SequenceTask:
    """Seeded English->German translation task from a tiny reordering grammar.

    Examples are spread as evenly as possible over ``patterns``:

    * ``"perfect"``: ``i have seen the house`` -> ``ich habe das haus gesehen``
    * ``"subordinate"``: ``i know that you have seen the dog`` ->
      ``ich weiß , dass du den hund gesehen hast`` (the inner clause may also be modal)
    * ``"modal"``: ``i can see the house`` -> ``ich kann das haus sehen``

    with optional time adverbs (``today``/``yesterday``/``tomorrow``) that move in front
    of the object in German. With ``unique`` (default) no sentence repeats, so splits do
    not leak; a pattern with too few distinct sentences hands its share to the others.
    Vocabularies cover the whole grammar (sorted, after the special tokens), so they do
    not depend on ``n``, ``seed`` or ``patterns``; ``src``/``tgt`` are padded to the
    longest sentence the chosen patterns can produce. ``src_text``/``tgt_text`` hold the
    raw space-joined strings and ``alignments`` come from :func:`translate_sentence`.

    Shape:
        src: ``(n, 6)`` or ``(n, 9)`` with "subordinate"; tgt: ``(n, 8)`` or ``(n, 12)``.
    """
    n = _check_int("n", n, min_value=1)
    seed = _check_seed(seed)
    if isinstance(patterns, str) or len(patterns) == 0:
        raise ValueError(
            f"patterns must be a non-empty sequence drawn from {TRANSLATION_PATTERNS}, "
            f"got {patterns!r}"
        )
    for p in patterns:
        if p not in TRANSLATION_PATTERNS:
            raise ValueError(f"patterns must be drawn from {TRANSLATION_PATTERNS}, got {p!r}")
    if len(set(patterns)) != len(patterns):
        raise ValueError(f"patterns must not repeat a pattern, got {tuple(patterns)!r}")
    patterns = tuple(patterns)
    capacities = [_PATTERN_SIZES[p] for p in patterns]
    if unique and n > sum(capacities):
        raise ValueError(
            f"n={n} exceeds the {sum(capacities)} distinct sentences of patterns "
            f"{patterns}; pass unique=False to allow repeats"
        )

    rng = np.random.default_rng(seed)
    sentences: list[list[str]] = []
    for p, count in zip(patterns, _balanced_counts(n, capacities, unique), strict=True):
        if count == 0:
            continue
        idx = rng.choice(_PATTERN_SIZES[p], size=count, replace=not unique)
        sentences.extend(_english_sentence(p, int(i)) for i in idx)
    order = rng.permutation(n)
    sentences = [sentences[i] for i in order]

    src_vocab, tgt_vocab = _translation_vocabs()
    src_ids = {w: i for i, w in enumerate(src_vocab)}
    tgt_ids = {w: i for i, w in enumerate(tgt_vocab)}
    max_src = max(_MAX_WORDS[p][0] for p in patterns)
    max_tgt = max(_MAX_WORDS[p][1] for p in patterns)
    src = torch.full((n, max_src), PAD_ID, dtype=torch.int64)  # (N, S)
    tgt = torch.full((n, max_tgt + 2), PAD_ID, dtype=torch.int64)  # (N, T)
    alignments: list[Alignment] = []
    src_text: list[str] = []
    tgt_text: list[str] = []
    for i, en in enumerate(sentences):
        de, align = translate_sentence(en)
        src[i, : len(en)] = torch.tensor([src_ids[w] for w in en])
        tgt[i, : len(de) + 2] = torch.tensor([BOS_ID, *(tgt_ids[w] for w in de), EOS_ID])
        alignments.append(align)
        src_text.append(" ".join(en))
        tgt_text.append(" ".join(de))
    return SequenceTask(
        src=src,
        tgt=tgt,
        src_vocab=src_vocab,
        tgt_vocab=tgt_vocab,
        alignments=alignments,
        src_text=src_text,
        tgt_text=tgt_text,
        meta={"task": "translation", "patterns": patterns, "seed": seed, "unique": unique},
    )


def train_val_test_split(
    task: SequenceTask,
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    seed: int = 0,
) -> tuple[SequenceTask, SequenceTask, SequenceTask]:
    """Seeded random split of a task into train / val / test tasks.

    Sizes are ``round(f_val * N)`` and ``round(f_test * N)``, train gets the rest.
    Vocabularies, alignments and texts follow their rows.

    Shape:
        Returns three tasks whose row counts sum to ``N``.
    """
    if not isinstance(task, SequenceTask):
        raise TypeError(f"task must be a SequenceTask, got {type(task).__name__}")
    if isinstance(fractions, str) or len(fractions) != 3:
        raise ValueError(f"fractions must be 3 numbers (train, val, test), got {fractions!r}")
    fr = [float(f) for f in fractions]
    if any(f < 0 for f in fr) or not math.isclose(sum(fr), 1.0, abs_tol=1e-6):
        raise ValueError(f"fractions must be non-negative and sum to 1, got {tuple(fractions)!r}")
    seed = _check_seed(seed)
    n = len(task)
    n_val = int(round(fr[1] * n))
    n_test = int(round(fr[2] * n))
    n_train = n - n_val - n_test
    if n_train < 0:
        raise ValueError(f"fractions={tuple(fractions)!r} leave no training rows for N={n}")
    perm = torch.randperm(n, generator=_torch_generator(seed))
    return (
        task.subset(perm[:n_train]),
        task.subset(perm[n_train : n_train + n_val]),
        task.subset(perm[n_train + n_val :]),
    )
