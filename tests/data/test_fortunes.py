"""The fortunes by topic (bayesattn.data.fortunes): parsing, the seeded split with held-out
topics, the training-split vocabulary, the encoding; on a small corpus written here (the same
files as Debian's package), and on the package's own files where it is installed."""

from pathlib import Path

import numpy as np
import pytest
import torch

from bayesattn.data.fortunes import (
    FORTUNE_TOPICS,
    FORTUNES_DIR,
    PAD,
    UNK,
    load_fortunes_data,
    read_fortunes,
    tokenize,
)


def _corpus(root: Path, n: int = 30) -> Path:
    for k, topic in enumerate(FORTUNE_TOPICS):
        entries = [f"the {topic} word{k} entry {i} " + "filler " * (i % 7) for i in range(n)]
        (root / topic).write_text("\n%\n".join(entries) + "\n%\n   \n%\n")  # an empty entry
    return root


def test_tokenize_and_read(tmp_path):
    assert tokenize("Don't PANIC, 42 times!") == ["don't", "panic", "42", "times"]
    texts, y = read_fortunes(_corpus(tmp_path))
    assert len(texts) == 30 * len(FORTUNE_TOPICS) and y.dtype == np.int64
    assert np.bincount(y).tolist() == [30] * len(FORTUNE_TOPICS)  # the empty entry dropped
    assert texts[0].startswith("the art word0 entry 0")
    with pytest.raises(ValueError, match="topics"):
        read_fortunes(tmp_path, topics=("art", "art"))
    with pytest.raises(FileNotFoundError, match="apt-get install fortunes"):
        read_fortunes(tmp_path / "nowhere")


def test_split_vocabulary_and_encoding(tmp_path):
    root = _corpus(tmp_path)
    d = load_fortunes_data(seed=3, holdout_classes=(2, 7), per_class=20, max_len=6, root=root)
    assert d.classes == (0, 1, 3, 4, 5, 6, 8, 9) and d.holdout_classes == (2, 7)
    assert set(d.y_ood_classes.tolist()) == {2, 7} and len(d.x_ood_classes) == 40
    assert set(d.y_train.tolist()) == set(range(8))
    n = len(d.x_train) + len(d.x_val) + len(d.x_test)
    assert n == 8 * 20 and d.x_train.dtype == torch.int64 and d.x_train.shape[1] == 6
    # the held-out topics' own words never made the vocabulary (built on training rows only)
    assert "word2" not in d.vocab and "word7" not in d.vocab and "word0" in d.vocab
    assert d.vocab[:2] == ("<pad>", "<unk>") and d.vocab_size == len(d.vocab)
    assert (d.x_ood_classes[:, 2] == UNK).all()  # "the <topic> word2": the 3rd word unknown
    # padding after the words, cut at max_len; ids decode back to the words
    row = d.x_train[0]
    words = [d.vocab[i] for i in row.tolist() if i != PAD]
    assert words[0] == "the" and len(words) <= 6
    assert bool((d.x_train <= d.vocab_size - 1).all())
    again = load_fortunes_data(seed=3, holdout_classes=(2, 7), per_class=20, max_len=6, root=root)
    assert torch.equal(again.x_train, d.x_train)
    other = load_fortunes_data(seed=4, holdout_classes=(2, 7), per_class=20, max_len=6, root=root)
    assert not torch.equal(other.x_train, d.x_train)
    with pytest.raises(ValueError, match="per_class"):
        load_fortunes_data(per_class=31, root=root)


@pytest.mark.skipif(not Path(FORTUNES_DIR, "art").is_file(), reason="Debian's fortunes package")
def test_the_debian_package_gives_ten_topics_of_at_least_198():
    texts, y = read_fortunes()
    assert np.bincount(y).min() >= 198 and len(np.bincount(y)) == 10
    d = load_fortunes_data()
    assert d.x_train.shape[1] == 48 and d.vocab_size > 1000


def test_a_corpus_changed_on_disk_is_read_again(tmp_path):
    """The cache is keyed by the files, not the folder path: a rewritten topic file (same path,
    same process) gives its new entries; an unchanged corpus keeps its cached read."""
    _corpus(tmp_path, n=30)
    texts, y = read_fortunes(tmp_path)
    assert len(texts) == 300
    assert read_fortunes(tmp_path)[0] == texts  # unchanged: the same entries
    (tmp_path / "art").write_text("\n%\n".join(f"new art {i}" for i in range(5)) + "\n")
    texts2, y2 = read_fortunes(tmp_path)
    assert np.bincount(y2).tolist() == [5] + [30] * (len(FORTUNE_TOPICS) - 1)
    assert texts2[0] == "new art 0"
    (tmp_path / "law").unlink()
    with pytest.raises(FileNotFoundError, match="law"):
        read_fortunes(tmp_path)
