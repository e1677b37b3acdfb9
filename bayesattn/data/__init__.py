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

One module per concern; the names below are re-exported here (the study's helpers,
``holdout``, ``mnist1d``, ``far_ood``, ``fortunes``, ``wordnet`` and ``token_ood``, are imported
from their modules):

* :mod:`bayesattn.data.digits` -- :class:`DigitsData`, :func:`load_digits_data`.
* :mod:`bayesattn.data.corruptions` -- :func:`corrupt_images`, :func:`corruption_suite`.
* :mod:`bayesattn.data.holdout` -- class-held-out split indices and the disjoint held-out pairs
  of the study (:func:`~bayesattn.data.holdout.holdout_split_indices`,
  :func:`~bayesattn.data.holdout.rotation_pairs`).
* :mod:`bayesattn.data.mnist1d` -- MNIST-1D, generated offline by the ``mnist1d`` package
  (:func:`~bayesattn.data.mnist1d.load_mnist1d_data`; the ``study`` extra).
* :mod:`bayesattn.data.far_ood` -- far-OOD sanity sets and 1-D corruptions
  (:func:`~bayesattn.data.far_ood.far_ood_suite`, :func:`~bayesattn.data.far_ood.corrupt_sequences`).
* :mod:`bayesattn.data.fortunes` -- tokens: Debian's fortune cookies by topic
  (:func:`~bayesattn.data.fortunes.load_fortunes_data`; ``apt-get install fortunes``).
* :mod:`bayesattn.data.wordnet` -- tokens: WordNet 3.0 noun glosses by lexicographer file
  (:func:`~bayesattn.data.wordnet.load_wordnet_data`; ``apt-get install wordnet-base``).
* :mod:`bayesattn.data.token_ood` -- far-OOD sets and corruptions of token sequences.
* :mod:`bayesattn.data.patches` -- :func:`images_to_patches`, :func:`patches_to_images`.
* :mod:`bayesattn.data.sequences` -- :class:`SequenceTask`, copy / reverse / sort tasks,
  :func:`make_ood_sequences`.
* :mod:`bayesattn.data.translation` -- the English->German grammar
  (:func:`translate_sentence`, :func:`make_translation_task`).
* :mod:`bayesattn.data.splits` -- :func:`train_val_test_split`.
* :mod:`bayesattn.data.long` -- long-sequence tasks for the efficient kernels
  (:func:`~bayesattn.data.long.make_retrieval_task`).

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

from .corruptions import CORRUPTION_KINDS, corrupt_images, corruption_suite
from .digits import DigitsData, load_digits_data
from .patches import images_to_patches, patches_to_images
from .sequences import (
    BOS_ID,
    EOS_ID,
    OOD_SEQUENCE_KINDS,
    PAD_ID,
    SPECIAL_TOKENS,
    SequenceTask,
    make_copy_task,
    make_ood_sequences,
    make_reverse_task,
    make_sort_task,
)
from .splits import train_val_test_split
from .translation import TRANSLATION_PATTERNS, make_translation_task, translate_sentence

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
