"""The study's methods for words (bayesattn.study.word_methods) and the masked-LM trunk a study
pretrains once per data set (bayesattn.study.pretrained), on a synthetic word data set: ten
topics of their own words over shared filler, and unlabeled texts of other words."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bayesattn.calibration import predictive_entropy
from bayesattn.calibration.bag_of_words import fit_bag_of_words
from bayesattn.calibration.token_scores import combine_scores
from bayesattn.data.fortunes import FortunesData, build_vocab, tokens_data
from bayesattn.data.holdout import holdout_split_indices
from bayesattn.posthoc import TextDensityRead
from bayesattn.posthoc._density_core import fit_class_density
from bayesattn.posthoc.features import extract_features
from bayesattn.study import StudyConfig, get_method, run_study
from bayesattn.study.datasets import base
from bayesattn.study.datasets.fortunes import Fortunes
from bayesattn.study.methods import methods_for
from bayesattn.study.pretrained import pretrained_trunk
from bayesattn.study.runs import Run
from bayesattn.training.pretrain import transfer_trunk

FILLER = [f"f{i}" for i in range(30)]


def _texts(rng, words, n):
    out = []
    for _ in range(n):
        k = int(rng.integers(4, 10))
        own = rng.choice(words, k)
        fill = rng.choice(FILLER, k)
        out.append(" ".join(w for pair in zip(own, fill, strict=True) for w in pair))
    return out


class _Words(Fortunes):
    """Ten synthetic topics (40 texts each) and 300 unlabeled texts of filler and other words."""

    name = "test_words"
    description = "synthetic word topics (a test data set)"
    model_defaults = dict(Fortunes.model_defaults, d_model=16, nhead=2, dim_feedforward=32,
                          pretrain_epochs=1)  # fmt: skip
    full_protocol = False
    order = 99

    def check_available(self):
        return None

    def load(self, seed, holdout_classes):
        rng = np.random.default_rng(0)
        texts, y = [], []
        for c in range(10):
            texts += _texts(rng, [f"t{c}w{j}" for j in range(12)], 40)
            y += [c] * 40
        split = holdout_split_indices(np.asarray(y), holdout_classes, seed)
        return tokens_data(FortunesData, texts, np.asarray(y), split, seed, 20, 2,
                           topics=tuple(map(str, range(10))),
                           unlabeled=self.pretraining_texts())  # fmt: skip

    def pretraining_texts(self):
        rng = np.random.default_rng(1)
        return _texts(rng, [f"u{j}" for j in range(20)] + [f"t{c}w0" for c in range(10)], 300)


class _NoCorpus(_Words):
    name = "test_words_no_corpus"

    def pretraining_texts(self):
        return None


@pytest.fixture(scope="module")
def words():
    for ds in (_Words(), _NoCorpus()):
        base.register_dataset(ds, override=True)
    yield
    for name in ("test_words", "test_words_no_corpus"):
        base._REGISTRY.unregister(name, missing_ok=True)


@pytest.fixture(scope="module")
def run(words, tmp_path_factory):
    out = tmp_path_factory.mktemp("words")
    cfg = StudyConfig.quick(epochs=2, progress=False, dataset="test_words", out=str(out))
    return Run.load(cfg, "test_words", (8, 9), 0)


def test_methods_apply_to_word_data_sets_and_a_study_refuses_one_that_applies_nowhere(words):
    assert get_method("bag_of_words").applies_to(base.get_dataset("test_words"))
    assert not get_method("bag_of_words").applies_to(base.get_dataset("digits"))
    assert get_method("density_bow").applies_to(base.get_dataset("test_words_no_corpus"))
    assert not get_method("density_pretrained").applies_to(base.get_dataset("test_words_no_corpus"))
    names = ["deterministic", "bag_of_words", "pretrained", "density"]
    assert methods_for(base.get_dataset("digits"), names) == ["deterministic", "density"]
    with pytest.raises(ValueError, match=r"bag_of_words.*apply to none of the datasets"):
        StudyConfig(dataset="digits", methods=("deterministic", "bag_of_words"))
    with pytest.raises(ValueError, match=r"\['pretrained'\]"):
        StudyConfig(dataset="test_words_no_corpus", methods=("pretrained",))


def test_bag_of_words_is_the_calibration_function(run):
    d = run.data
    bow = get_method("bag_of_words")
    f = bow.fit(run)
    ref = fit_bag_of_words((d.x_train, d.y_train), (d.x_val, d.y_val), d.vocab_size)
    torch.testing.assert_close(bow.predict(f, d.x_test).probs[0], ref.probs(d.x_test).float())
    assert f.params["C"] == ref.C and f.nets == []


def test_the_trunk_is_pretrained_once_cached_and_copied_word_by_word(run, tmp_path):
    ds = base.get_dataset("test_words")
    model = run.model
    net, vocab, info = pretrained_trunk(ds, model, 20, tmp_path, smoke=True)
    assert vocab == build_vocab(ds.pretraining_texts(), 2, mask_token=True)
    assert (
        info["texts"] == 300 and info["seconds"] > 0 and 0 <= info["val_masked_accuracy"][-1] <= 1
    )
    files = sorted(p.name for p in tmp_path.iterdir())
    assert any(n.endswith(".pt") for n in files) and all(n.startswith(".") for n in files)
    meta = json.loads(next(tmp_path.glob(".pretrained-*.json")).read_text())
    assert meta["settings"]["epochs"] == 1 and meta["settings"]["d_model"] == 16
    from bayesattn.study import pretrained as P

    P._LOADED.clear()  # a new process: read from the folder, the same weights
    again, _, info2 = pretrained_trunk(ds, model, 20, tmp_path, smoke=True)
    assert info2 == json.loads(json.dumps(info))
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(),
                                                 again.state_dict().values(), strict=True))  # fmt: skip
    # the run's fine-tuned network starts from that trunk, word by word
    fine = run.pretrained_members(1)[0][0]
    torch.manual_seed(run.seed)
    fresh = run.network(None)
    trunk, trunk_vocab = run_trunk(run)
    found = transfer_trunk(trunk, trunk_vocab, fresh, run.data.vocab)
    shared = set(run.data.vocab) & set(trunk_vocab)  # filler, the pretraining words, pad, unk
    assert found == pytest.approx(len(shared) / len(run.data.vocab)) and 0 < found < 1
    assert run.cache["pretrained_info"]["vocabulary_found"] == pytest.approx(found)
    assert not torch.equal(fine.embed.tokens.weight, fresh.embed.tokens.weight)  # fine-tuned
    with pytest.raises(ValueError, match="no pretraining texts"):
        pretrained_trunk(base.get_dataset("test_words_no_corpus"), model, 20, tmp_path, True)


def token_views(net, x):
    """The head's input (the CLS output) and the logits, one pass without the token view, in
    the field names of ``posthoc.token_views`` (``layer_cls[-1]``)."""
    f = extract_features(net, x, tokens=False)
    return SimpleNamespace(logits=f.logits, layer_cls=[f.cls])


def run_trunk(run):
    net, vocab, _ = pretrained_trunk(run.spec, run.model, run.data.x_train.shape[1], run.cfg.out,
                                     smoke=True)  # fmt: skip
    return net, vocab


def test_pretrained_methods_charge_their_share_and_read_the_fine_tuned_network(run):
    p, dp = get_method("pretrained"), get_method("density_pretrained")
    fp, fd = p.fit(run), dp.fit(run)
    assert fp.nets[0] is fd.nets[0] is run.pretrained_members(1)[0][0]
    assert fp.nets[0] is not run.members(1)[0][0]
    info = fp.params["pretraining"]
    assert info["seconds_per_run"] == pytest.approx(info["seconds"] / 2)  # quick: 1 pair × 2 seeds
    assert fd.train_seconds >= fp.train_seconds >= info["seconds_per_run"]
    d, x = run.data, run.data.x_test
    tv, vv, v = (token_views(fd.nets[0], z) for z in (d.x_train, d.x_val, x))
    read = fit_class_density([tv.layer_cls[-1]], d.y_train, [vv.layer_cls[-1]], d.y_val,
                             d.num_classes, val_logits=vv.logits)  # fmt: skip
    torch.testing.assert_close(dp.score(fd, run, x), read.score([v.layer_cls[-1]]))
    torch.testing.assert_close(dp.predict(fd, x).probs[0],
                               read.probs(v.logits, [v.layer_cls[-1]]).float())  # fmt: skip
    assert fd.params["view"] == "cls"


def test_a_study_over_images_and_words_skips_what_does_not_apply(words, tmp_path):
    cfg = StudyConfig.quick(datasets=("digits", "test_words"), seeds=1, epochs=1, progress=False,
                            methods=("deterministic", "bag_of_words", "density_bow"),
                            figures=False, out=str(tmp_path / "s"))  # fmt: skip
    res = run_study(cfg)
    assert set(res["datasets"]["digits"]["pooled"]) == {"deterministic"}
    words = res["datasets"]["test_words"]["pooled"]
    assert set(words) == {"deterministic", "bag_of_words", "density_bow"}
    assert words["density_bow"]["primary_score"] == "own"
    report = (tmp_path / "s" / "report.md").read_text()
    assert "bag_of_words" in report


@pytest.mark.parametrize("name", ["density_bow", "density_pretrained_bow"])
def test_density_bow_sums_the_density_and_the_bag_of_words_entropy(run, name):
    m = get_method(name)
    f = m.fit(run)
    d = run.data
    net = f.nets[0]
    assert (net is run.pretrained_members(1)[0][0]) == (name == "density_pretrained_bow")
    bow = fit_bag_of_words((d.x_train, d.y_train), (d.x_val, d.y_val), d.vocab_size)

    def parts(x):
        v = token_views(net, x)
        return [f.state["read"].core_.score([v.layer_cls[-1]]), predictive_entropy(bow.probs(x).double())]

    torch.testing.assert_close(m.score(f, run, d.x_ood_classes),
                               combine_scores(parts(d.x_ood_classes), parts(d.x_val)))  # fmt: skip
    x = d.x_test
    v = token_views(net, x)
    torch.testing.assert_close(m.predict(f, x).probs[0],
                               f.state["read"].core_.probs(v.logits, [v.layer_cls[-1]]).float())  # fmt: skip
    assert f.params["C"] == bow.C
    res, score = m.predict_and_score(f, run, x)  # what the study times: one density evaluation
    assert torch.equal(res.probs, m.predict(f, x).probs) and torch.equal(score, m.score(f, run, x))
    # the library's read of this recipe scores and predicts as the study's method
    lib = TextDensityRead(net).fit(d.x_train, d.y_train, val=(d.x_val, d.y_val))
    torch.testing.assert_close(lib.score(d.x_ood_classes), m.score(f, run, d.x_ood_classes))
    torch.testing.assert_close(lib.predict(x).probs, m.predict(f, x).probs)
    assert lib.C == bow.C


def test_density_bow_pair_is_the_read_ensemble_of_two_text_reads(run):
    from bayesattn.posthoc import ReadEnsemble

    m = get_method("density_bow_pair")
    f = m.fit(run)
    nets, _ = run.members(2)
    assert f.nets == nets and nets[0] is not nets[1]
    d = run.data
    # independent: one TextDensityRead per network, fitted by the library, averaged by hand
    libs = [TextDensityRead(n).fit(d.x_train, d.y_train, val=(d.x_val, d.y_val)) for n in nets]
    x = d.x_ood_classes
    torch.testing.assert_close(m.score(f, run, x), (libs[0].score(x) + libs[1].score(x)) / 2)
    got = m.predict(f, d.x_test)
    assert got.probs.shape[0] == 2
    torch.testing.assert_close(got.probs, torch.cat([r.predict(d.x_test).probs for r in libs]))
    # member 0's part is density_bow's own
    single = get_method("density_bow")
    fs = single.fit(run)
    torch.testing.assert_close(got.probs[0], single.predict(fs, d.x_test).probs[0])
    # the library's ensemble of the two reads is the same method
    ens = ReadEnsemble.of(nets, TextDensityRead).fit(d.x_train, d.y_train, val=(d.x_val, d.y_val))
    torch.testing.assert_close(ens.score(x), m.score(f, run, x))
    res, score = m.predict_and_score(f, run, x)
    assert torch.equal(res.probs, m.predict(f, x).probs) and torch.equal(score, m.score(f, run, x))


def test_a_folder_holding_only_a_cached_trunk_takes_a_new_study(words, tmp_path):
    from bayesattn._study_io import prepare_out_dir

    (tmp_path / ".pretrained-test_words-abc.pt").write_bytes(b"x")
    assert prepare_out_dir(tmp_path, force=False) == tmp_path
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files no study run wrote"):
        prepare_out_dir(tmp_path, force=False)
