"""The translation task's harder variant: a topicalised German adverb (subject-verb inversion)."""

from __future__ import annotations

import pytest
import torch

from bayesattn.data import make_translation_task, translate_sentence


def test_front_adverb_inverts_subject_and_keeps_alignments() -> None:
    de, align = translate_sentence("he can buy the house today", front_adverb=True)
    assert de == ["heute", "kann", "er", "das", "haus", "kaufen"]
    # every english word still aligns to its german word, now in the new order
    assert align == [(0, 2), (1, 1), (2, 5), (3, 3), (4, 4), (5, 0)]
    # without an adverb, or inside a subordinate clause, nothing moves
    assert translate_sentence("he can buy the house", front_adverb=True) == translate_sentence(
        "he can buy the house"
    )
    sub = "i know that he has seen the dog today"
    assert translate_sentence(sub, front_adverb=True) == translate_sentence(sub)


def test_task_probability_and_default_unchanged() -> None:
    base = make_translation_task(300, seed=3)
    assert torch.equal(make_translation_task(300, seed=3, front_adverb=0.0).tgt, base.tgt)
    hard = make_translation_task(300, seed=3, front_adverb=1.0)
    assert torch.equal(hard.src, base.src)  # the english side does not change
    fronted = [t for t in hard.tgt_text if t.split()[0] in ("heute", "gestern", "morgen")]
    with_adverb = [
        s for s in base.src_text
        if "that" not in s.split() and s.split()[-1] in ("today", "yesterday", "tomorrow")
    ]  # fmt: skip
    assert len(fronted) == len(with_adverb) > 0
    half = make_translation_task(300, seed=3, front_adverb=0.5)
    n_half = sum(t.split()[0] in ("heute", "gestern", "morgen") for t in half.tgt_text)
    assert 0 < n_half < len(fronted)
    assert half.meta["front_adverb"] == 0.5


def test_front_adverb_validation() -> None:
    with pytest.raises(ValueError, match="front_adverb"):
        make_translation_task(10, front_adverb=1.5)
    with pytest.raises(TypeError, match="front_adverb must be a bool"):
        translate_sentence("i can see the house", front_adverb=1)
