"""WordNet noun glosses by lexicographer file (bayesattn.data.wordnet): parsing of the data file
(header skipped, lexicographer number, gloss with its quoted examples dropped), the fixed draw,
the split with held-out classes and the training-split vocabulary; on a small ``data.noun``
written here in WordNet's format, and on Debian's ``wordnet-base`` where it is installed."""

from pathlib import Path

import numpy as np
import pytest
import torch

from bayesattn.data.fortunes import MASK_TOKEN, build_vocab, encode_texts
from bayesattn.data.wordnet import (
    WORDNET_CLASSES,
    WORDNET_DIR,
    WORDNET_LEXNAMES,
    clean_gloss,
    load_wordnet_data,
    read_glosses,
    unlabeled_glosses,
)

_HEADER = "  1 This software and database is being provided to you, the LICENSEE, by  \n"


def _database(root: Path, n: int = 30) -> Path:
    lines = [_HEADER, "  2 Princeton University | not a synset  \n"]
    offset = 1740
    for name in (*WORDNET_CLASSES, "cognition"):
        lex = WORDNET_LEXNAMES[name]
        for i in range(n):
            gloss = f"the {name} word{lex} gloss {i} " + "filler " * (i % 5)
            gloss += f'; "an example naming {name}x{i}"'
            lines.append(f"{offset:08d} {lex:02d} n 01 thing 0 000 | {gloss}  \n")
            offset += 100
    lines.append(f'{offset:08d} 05 n 01 caf\xe9 0 000 | a caf\xe9 animal; ""  \n')  # latin-1
    (root / "data.noun").write_bytes("".join(lines).encode("latin-1"))
    return root


def test_clean_gloss_drops_the_quoted_examples():
    assert clean_gloss('a dog; "the dog barked"; "dogs bark"  \n') == "a dog"
    assert clean_gloss('one sense; a second "quoted" part') == "one sense; a second part"
    assert clean_gloss("plain") == "plain"
    # examples whose opening or closing quote is missing (as in four WordNet glosses)
    assert clean_gloss('a notice; "a notice of sale  ') == "a notice"
    assert clean_gloss('bought from stores; women carrying home a bag"') == "bought from stores"
    assert clean_gloss('a local branch of the post"') == "a local branch of the post"


def test_read_glosses(tmp_path):
    glosses, lex = read_glosses(_database(tmp_path))
    assert len(glosses) == 30 * 11 + 1 and lex.dtype == np.int64  # the header lines skipped
    assert glosses[0] == "the animal word5 gloss 0"  # the example (and its name) dropped
    assert lex[0] == 5 and glosses[-1] == "a caf\xe9 animal"
    assert not any("x0" in g for g in glosses)
    with pytest.raises(FileNotFoundError, match="apt-get install wordnet-base"):
        read_glosses(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="part"):
        read_glosses(tmp_path, part="nouns")


def test_split_vocabulary_and_draw(tmp_path):
    root = _database(tmp_path)
    d = load_wordnet_data(seed=3, holdout_classes=(2, 7), per_class=20, max_len=6, root=root)
    assert d.classes == (0, 1, 3, 4, 5, 6, 8, 9) and d.holdout_classes == (2, 7)
    assert d.topics == WORDNET_CLASSES and len(d.x_ood_classes) == 40
    assert set(d.y_ood_classes.tolist()) == {2, 7}
    n = len(d.x_train) + len(d.x_val) + len(d.x_test)
    assert n == 8 * 20 and d.x_train.shape[1] == 6 and d.x_train.dtype == torch.int64
    # the held-out classes' own words are unknown; the other classes' are in the vocabulary
    food, substance = f"word{WORDNET_LEXNAMES['food']}", f"word{WORDNET_LEXNAMES['substance']}"
    assert food not in d.vocab and substance not in d.vocab
    assert "word5" in d.vocab and "cognition" not in d.vocab and "example" not in d.vocab
    # "the <class> word<lex> ...": the class name and its word unknown for a held-out class
    assert (d.x_ood_classes[:, 1] == 1).all() and (d.x_ood_classes[:, 2] == 1).all()
    # every in-distribution row decodes to a gloss naming its own class
    for row, label in zip(d.x_train.tolist(), d.y_train.tolist(), strict=True):
        assert WORDNET_CLASSES[d.classes[label]] in {d.vocab[i] for i in row}
    again = load_wordnet_data(seed=3, holdout_classes=(2, 7), per_class=20, max_len=6, root=root)
    assert torch.equal(again.x_train, d.x_train)
    three = load_wordnet_data(per_class=20, holdout_classes=(0,), root=root,
                              classes=("animal", "plant", "cognition"))  # fmt: skip
    assert three.classes == (1, 2) and three.topics == ("animal", "plant", "cognition")
    with pytest.raises(ValueError, match="per_class"):
        load_wordnet_data(per_class=31, root=root)
    with pytest.raises(ValueError, match="classes"):
        load_wordnet_data(root=root, classes=("animal", "plant", "animals"))
    with pytest.raises(ValueError, match="holdout_classes"):
        load_wordnet_data(root=root, per_class=20, holdout_classes=(10,))


def test_unlabeled_glosses_hold_no_classified_gloss(tmp_path):
    root = _database(tmp_path)
    (root / "data.verb").write_bytes(
        (_HEADER + '00001740 29 v 01 run 0 000 | move fast; "he ran"  \n').encode("latin-1")
    )
    texts = unlabeled_glosses(root, parts=("noun", "verb"))
    # the 30 cognition glosses (not a class) and the verb; none of the ten classes' glosses
    assert len(texts) == 31 and texts[-1] == "move fast"
    assert all("cognition" in t for t in texts[:-1])
    fewer = unlabeled_glosses(root, exclude=WORDNET_CLASSES[1:], parts=("noun",))
    assert sum("animal" in t for t in fewer) == 31  # 30 + the latin-1 one
    with pytest.raises(ValueError, match="exclude"):
        unlabeled_glosses(root, exclude=("animals",))
    with pytest.raises(FileNotFoundError, match="wordnet-base"):
        unlabeled_glosses(root, parts=("adj",))


def test_a_vocabulary_with_unlabeled_text_and_a_mask_token(tmp_path):
    root = _database(tmp_path)
    texts = unlabeled_glosses(root, parts=("noun",))
    d = load_wordnet_data(seed=3, holdout_classes=(2, 7), per_class=20, max_len=6, root=root,
                          unlabeled=texts, mask_token=True)  # fmt: skip
    plain = load_wordnet_data(seed=3, holdout_classes=(2, 7), per_class=20, max_len=6, root=root)
    assert "cognition" in d.vocab and "cognition" not in plain.vocab
    assert d.vocab[-1] == MASK_TOKEN and MASK_TOKEN not in plain.vocab
    assert set(plain.vocab) < set(d.vocab)
    mask_id = d.vocab_size - 1
    assert not any((x == mask_id).any() for x in (d.x_train, d.x_val, d.x_test, d.x_ood_classes))
    # the same texts decode to the same words under either vocabulary (a word unknown to the
    # training split alone may be known now; padding stays padding)
    for a, b in zip(d.x_train.flatten().tolist(), plain.x_train.flatten().tolist(), strict=True):
        assert (a == 0) == (b == 0)
        if b > 1:
            assert d.vocab[a] == plain.vocab[b]


def test_build_vocab_and_encode_texts():
    vocab = build_vocab(["b a b", "c b a", "d"], min_count=2, mask_token=True)
    assert vocab == ("<pad>", "<unk>", "b", "a", MASK_TOKEN)  # by frequency, then spelling
    x = encode_texts(["a b c", "<mask> b", ""], vocab, 4)
    assert x.tolist() == [[3, 2, 1, 0], [1, 2, 0, 0], [0, 0, 0, 0]]  # "<mask>" reads as "mask"
    assert encode_texts([], vocab, 3).shape == (0, 3)
    with pytest.raises(ValueError, match="max_len"):
        encode_texts(["a"], vocab, 0)


@pytest.mark.skipif(not Path(WORDNET_DIR, "data.noun").is_file(), reason="Debian's wordnet-base")
def test_the_debian_package_gives_ten_classes_of_at_least_2000():
    glosses, lex = read_glosses()
    assert len(glosses) == 82115  # WordNet 3.0's noun synsets
    counts = [int((lex == WORDNET_LEXNAMES[c]).sum()) for c in WORDNET_CLASSES]
    assert min(counts) >= 2000
    assert not any('"' in g for g in glosses)
    d = load_wordnet_data()
    assert d.x_train.shape == (10400, 32) and len(d.x_ood_classes) == 4000
    assert d.vocab_size > 5000
    assert len(unlabeled_glosses()) == 20864 + 13767 + 18156 + 3621
