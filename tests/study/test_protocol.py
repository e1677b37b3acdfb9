"""The study's protocol pieces: held-out rotation and splits (on the indices), the config, the
method registry, and the safe output folder (manifest-only clean-up)."""

import json
from pathlib import Path

import numpy as np
import pytest

from bayesattn._study_io import (
    INCOMPLETE,
    PREVIOUS,
    begin_run,
    check_out_path,
    finish_run,
    manifest,
    prepare_out_dir,
    register_output,
)
from bayesattn.cli import main
from bayesattn.data import load_digits_data
from bayesattn.data.holdout import holdout_split_indices, rotation_pairs
from bayesattn.study import (
    METHODS,
    Fitted,
    Method,
    StudyConfig,
    get_dataset,
    get_method,
    register_method,
)
from bayesattn.study.methods import methods_for


def _digit_targets():
    from sklearn.datasets import load_digits

    return np.asarray(load_digits().target, dtype=np.int64)


def test_rotation_pairs_are_disjoint_and_cover_the_classes():
    pairs = rotation_pairs(5, seed=0)
    assert len(pairs) == 5 and all(len(p) == 2 and p[0] < p[1] for p in pairs)
    assert sorted(c for p in pairs for c in p) == list(range(10))
    assert rotation_pairs(3, seed=0) == pairs[:3] and rotation_pairs(5, seed=1) != pairs
    with pytest.raises(ValueError, match="holdout_rotation"):
        rotation_pairs(6)


def test_no_held_out_class_leaks_into_training_or_validation():
    targets = _digit_targets()
    for pair in rotation_pairs(5, seed=0):
        for seed in (0, 1):
            s = holdout_split_indices(targets, pair, seed)
            for name in ("train", "val", "test"):
                idx = getattr(s, name)
                assert not np.isin(targets[idx], pair).any(), (pair, name)
            assert set(targets[s.ood]) == set(pair)
            assert np.array_equal(s.ood, np.flatnonzero(np.isin(targets, pair)))
            parts = np.concatenate([s.train, s.val, s.test])
            assert len(np.unique(parts)) == len(parts)  # disjoint
            assert set(parts) == set(np.flatnonzero(~np.isin(targets, pair)))  # complete
            assert s.classes == tuple(c for c in range(10) if c not in pair)
    # the loader's arrays are those rows
    d = load_digits_data(seed=1, holdout_classes=(2, 5))
    assert set(d.y_ood_classes.tolist()) == {2, 5} and d.num_classes == 8
    assert len(d.x_train) == len(holdout_split_indices(targets, (2, 5), 1).train)


def test_config_pairs_presets_and_errors():
    assert StudyConfig().pairs() == rotation_pairs(2)
    assert StudyConfig(holdout_classes=(9, 1)).pairs() == [(1, 9)]
    assert StudyConfig(holdout_rotation=4).pairs() == rotation_pairs(4)
    assert StudyConfig.quick().pairs() == [(8, 9)]
    assert StudyConfig.quick(holdout_rotation=3).pairs() == rotation_pairs(3)
    full = StudyConfig.full()
    assert full.dataset_list == ("digits", "mnist1d", "fortunes", "wordnet")
    assert full.seeds == 5 and full.jobs == 2
    assert full.methods[: len(StudyConfig().methods) + 2] == (
        *StudyConfig().methods,
        "dirichlet",
        "sgpa",
    )
    # the main job runs the README's lead methods (issue 28)
    assert {"posthoc_gp", "posthoc_gp_mf", "density"} <= set(StudyConfig().methods)
    assert {"density", "mixture", "sgpa", "dirichlet"} <= set(full.methods)
    # the mixture's ablations run by name only; the ablations that lost are gone (their
    # numbers stay in docs/which-attention.md)
    by_name = {"mixture_point", "mixture_k1", "mixture_wide", "mixture_k2", "weights"}
    assert by_name <= set(METHODS) and not by_name & set(full.methods) and len(full.methods) == 24
    # on images the eighteen; the baseline and the pretrained network on words
    assert len(methods_for(get_dataset("digits"), full.methods)) == 18
    assert set(full.methods) - set(methods_for(get_dataset("fortunes"), full.methods)) == {
        "pretrained",
        "density_pretrained",
        "density_pretrained_bow",
    }
    assert set(methods_for(get_dataset("wordnet"), full.methods)) == set(full.methods)
    lost = {"density_cls", "density_gda", "spectral", "spectral_density", "spectral_gp",
            "unknown_rate", "density_layers", "density_masked", "density_sum"}  # fmt: skip
    assert not lost & set(METHODS)
    assert not get_method("density_bow").applies_to(get_dataset("digits"))
    assert not get_method("density_bow_pair").applies_to(get_dataset("digits"))
    assert StudyConfig.full(methods=("deterministic",), jobs=1).methods == ("deterministic",)
    assert len(full.pairs()) == 5
    m1d = StudyConfig(dataset="mnist1d").model("mnist1d")
    assert (m1d["patch"], m1d["stride"]) == (8, 4)  # overlapping windows: 9 tokens
    assert StudyConfig(d_model=8, nhead=2).model("digits")["d_model"] == 8
    with pytest.raises(ValueError, match="not both"):
        StudyConfig(holdout_classes=(1, 2), holdout_rotation=2)
    with pytest.raises(ValueError, match="holdout_rotation"):
        StudyConfig(holdout_rotation=6)
    with pytest.raises(ValueError, match="dataset"):
        StudyConfig(dataset="mnist")
    with pytest.raises(ValueError, match="methods must"):
        StudyConfig(methods=("nope",))
    with pytest.raises(ValueError, match="repeat"):
        StudyConfig(methods=("knn", "knn"))
    with pytest.raises(ValueError, match="holdout_classes"):
        StudyConfig(holdout_classes=(3, 3))
    with pytest.raises(ValueError, match="knn_ks"):
        StudyConfig(knn_ks=(0,))


def test_a_method_plugs_in_with_one_registration():
    class MaxProb(Method):
        name = "test_max_prob"
        description = "deterministic, own score 1 - max probability"
        own_score = "1 - max p"

        def fit(self, run):
            return get_method("deterministic").fit(run)

        def predict(self, fitted, x):
            return get_method("deterministic").predict(fitted, x)

        def score(self, fitted, run, x):
            return 1 - self.predict(fitted, x).mean_probs.max(-1).values

    m = MaxProb()
    try:
        register_method(m)
        assert "test_max_prob" in METHODS and get_method("test_max_prob") is m
        assert StudyConfig(methods=("test_max_prob",)).methods == ("test_max_prob",)
        with pytest.raises(ValueError, match="already registered.*override=True"):
            register_method(MaxProb())
        again = MaxProb()  # the error's advice works: override=True replaces the entry
        assert register_method(again, override=True) is again
        assert get_method("test_max_prob") is again
    finally:
        from bayesattn.study import methods as M

        M._REGISTRY.unregister("test_max_prob", missing_ok=True)
    assert "test_max_prob" not in METHODS
    assert isinstance(Fitted([], 0.0).params, dict)
    with pytest.raises(ValueError, match="unknown method"):
        get_method("nope")


@pytest.mark.parametrize("bad", ["", "  ", "."])
def test_unsafe_output_paths_are_refused(bad, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="out|refusing"):
        check_out_path(bad)


def test_home_root_and_folders_above_the_working_folder_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for p in (str(Path.home()), "/", str(tmp_path.parent), "..", str(tmp_path)):
        with pytest.raises(ValueError, match="refusing"):
            check_out_path(p)
    assert check_out_path("sub/study") == Path("sub/study")
    with pytest.raises(TypeError):
        check_out_path(3)


def test_force_removes_only_what_a_study_wrote(tmp_path):
    out = tmp_path / "s"
    out.mkdir()
    (out / "mine.png").write_text("the user's")
    with pytest.raises(ValueError, match="no study run wrote"):
        prepare_out_dir(out, force=True)  # someone else's folder, even with --force
    (out / "mine.png").unlink()
    prepare_out_dir(out, force=False)  # empty: fine
    foreign = begin_run(out)
    register_output(out, "fig.png").write_text("1")
    register_output(out, "post.nc").write_text("2")
    assert manifest(out) == {"fig.png", "post.nc"}
    finish_run(out, {"methods": ["a"]}, "# r", foreign)
    assert json.loads((out / "results.json").read_text())["files"] == [
        "fig.png",
        "post.nc",
        "report.md",
        "results.json",
    ]
    with pytest.raises(ValueError, match="--force"):
        prepare_out_dir(out, force=False)
    (out / "notes.png").write_text("added by the user later")  # not listed: kept
    prepare_out_dir(out, force=True)
    foreign = begin_run(out)
    # the replaced run's files wait in .previous-run until the new run finishes (issue 33)
    assert sorted(p.name for p in out.iterdir() if p.name != PREVIOUS) == [INCOMPLETE, "notes.png"]
    assert foreign == {"notes.png"}
    finish_run(out, {"methods": ["b"]}, "# r", foreign)
    assert sorted(p.name for p in out.iterdir()) == ["notes.png", "report.md", "results.json"]


def test_an_interrupted_runs_files_are_known_from_its_incomplete_manifest(tmp_path):
    out = tmp_path / "s"
    out.mkdir()
    begin_run(out)
    register_output(out, "half.png").write_text("x")  # then the run is killed
    (out / "other.txt").write_text("keep")
    assert manifest(out) == {"half.png"}
    prepare_out_dir(out, force=True)
    begin_run(out)
    assert sorted(p.name for p in out.iterdir() if p.name != PREVIOUS) == [INCOMPLETE, "other.txt"]
    with pytest.raises(ValueError, match="plain file names"):
        register_output(out, "../escape.png")
    (out / INCOMPLETE).write_text("header\n../../etc/passwd\nok.png\n")
    assert manifest(out) == {"ok.png"}  # paths never leave the folder


def test_cli_refuses_empty_out_and_deletes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for f in ("a.png", "b.nc", "results.json"):
        (tmp_path / f).write_text("keep")
    assert main(["study", "--out", "", "--force", "--quick", "--no-progress"]) == 2
    assert "empty path" in capsys.readouterr().err
    assert main(["study", "--out", ".", "--force", "--quick", "--no-progress"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "b.nc", "results.json"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.png").write_text("keep")
    assert main(["study", "--out", str(other), "--force", "--quick", "--no-progress"]) == 2
    assert "no study run wrote" in capsys.readouterr().err and (other / "x.png").exists()
    assert main(["study", "--out", str(tmp_path / "n"), "--epochs", "0", "--no-progress"]) == 2
    assert "epochs" in capsys.readouterr().err
    assert main(["study", "--out", str(tmp_path / "n"), "--holdout-rotation", "7"]) == 2
    with pytest.raises(SystemExit):
        main(["study", "--holdout-classes", "1", "2", "--holdout-rotation", "2"])
    with pytest.raises(SystemExit):
        main(["study", "--methods", "bogus"])


def test_the_03_building_blocks_benchmarks_import_still_work():
    import torch

    from bayesattn.study import _train, _vit

    cfg = StudyConfig(epochs=1, d_model=8, nhead=2, num_layers=1, dim_feedforward=8)
    data = load_digits_data(seed=0, holdout_classes=(8, 9))
    data = type(data)(**{**{f: getattr(data, f) for f in data.__dataclass_fields__},
                         "x_train": data.x_train[:64], "y_train": data.y_train[:64],
                         "x_val": data.x_val[:32], "y_val": data.y_val[:32]})  # fmt: skip
    torch.manual_seed(0)
    net = _vit(cfg, data.num_classes, None)
    assert net.head.out_features == 8 and net.encoder.layers[0].self_attn.embed_dim == 8
    before = net.head.weight.detach().clone()
    assert _train(net, data, cfg, 0, bayes=False) > 0
    assert not torch.equal(before, net.head.weight)


def _without_times(o):
    """A results block without what depends on the machine's load (times, figure paths)."""
    if isinstance(o, dict):
        return {
            k: _without_times(v)
            for k, v in o.items()
            if not (k.startswith("infer_ms") or "seconds" in k or k in ("figures", "first_run"))
        }
    if isinstance(o, list):
        return [_without_times(v) for v in o]
    return o


@pytest.mark.slow
def test_parallel_runs_give_the_numbers_of_one_process(tmp_path):
    from bayesattn.study import run_study

    kw = dict(methods=("deterministic", "mc_dropout", "last_layer", "posthoc_gp"), seeds=2,
              epochs=1, figures=False, progress=False, holdout_rotation=1)  # fmt: skip
    one = run_study(StudyConfig.quick(out=str(tmp_path / "one"), **kw))
    two = run_study(StudyConfig.quick(out=str(tmp_path / "two"), jobs=2, **kw))
    assert two["config"]["jobs"] == 2
    a, b = _without_times(one["datasets"]), _without_times(two["datasets"])
    assert [r["seed"] for r in b["digits"]["runs"]] == [0, 1]  # in (pair, seed) order
    assert a == b
    with pytest.raises(ValueError, match="jobs"):
        StudyConfig(jobs=0)


def test_posthoc_gp_method_is_the_interop_read_on_the_pooled_features():
    """The study's post-hoc GP: its predictive is fit_posthoc_gp's read of the network's head
    on the pooled features (so it equals the read fitted on the head directly), its own score
    the read's variance; it refits nothing of the network."""
    import torch

    from bayesattn.posthoc._gp_core import fit_posthoc_gp
    from bayesattn.study.runs import Run

    cfg = StudyConfig.quick(epochs=1, methods=("posthoc_gp",), progress=False)
    run = Run.load(cfg, "digits", (8, 9), 0)
    m = get_method("posthoc_gp")
    f = m.fit(run)
    net = f.nets[0]
    before = [p.detach().clone() for p in net.parameters()]
    read = fit_posthoc_gp(net.head, run.features("val"), run.data.y_val, net.head, seed=0)
    x = run.data.x_test[:16]
    torch.manual_seed(3)
    got = m.predict(f, x).probs
    torch.manual_seed(3)
    seed = int(torch.randint(0, 2**31 - 1, ()))
    want = read.sample_probs(run.features("", x), cfg.num_samples, seed=seed)
    assert torch.equal(got, want)  # bit for bit: the one-pass features read as the two-pass
    torch.testing.assert_close(m.score(f, run, x), read.variance(run.features("", x)))
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    assert f.params["temperature"] == read.temperature > 0


def test_posthoc_gp_mf_method_is_the_reads_mean_field_predictive(monkeypatch):
    """The study's ``posthoc_gp_mf``: one deterministic predictive, the read's ``probs`` on the
    pooled features (the same read as ``posthoc_gp``'s), own score the read's variance, and its
    fitted mean-field parameters recorded."""
    import torch

    from bayesattn.posthoc._gp_core import fit_posthoc_gp
    from bayesattn.study.runs import Run

    cfg = StudyConfig.quick(epochs=1, methods=("posthoc_gp_mf",), progress=False)
    run = Run.load(cfg, "digits", (8, 9), 0)
    m = get_method("posthoc_gp_mf")
    f = m.fit(run)
    net = f.nets[0]
    read = fit_posthoc_gp(net.head, run.features("val"), run.data.y_val, net.head, seed=0)
    x = run.data.x_test[:16]
    got = m.predict(f, x).probs
    assert got.shape == (1, 16, run.data.num_classes)
    assert torch.equal(got[0], read.probs(run.features("", x)))  # bit for bit
    torch.testing.assert_close(m.score(f, run, x), read.variance(run.features("", x)))
    assert f.params["mf_temperature"] == read.mf_temperature > 0
    assert f.params["mf_scale"] == read.mf_scale >= 0
    # prediction and own score on the same inputs share one pass (the last x, by identity)
    h = run.features("", x)
    assert run.features("", x) is h
    other = run.features("", x.clone())
    assert other is not h and torch.equal(other, h)
    # the cost: one pass through the network per timed call (warm-up, 3 at batch 512, 15 at
    # batch 1), shared by prediction and own score, never reused from an earlier call
    from bayesattn.study import metrics, runs

    passes = []
    plain = runs._one_pass
    monkeypatch.setattr(runs, "_one_pass", lambda *a, **k: passes.append(1) or plain(*a, **k))
    metrics._cost(m, f, run)
    assert len(passes) == 1 + 3 + 15


@pytest.mark.slow
def test_merging_studies_equals_one_study_with_every_method(tmp_path):
    """Two studies over the same runs with different methods, merged, give the pooled numbers
    of one study running all of them; a study of other seeds adds its runs (as one study over
    all the seeds); a shared method must agree; a run lacking a method and other settings are
    refused."""
    from bayesattn.study import run_study
    from bayesattn.study.merge import merge_studies, without_times

    kw = dict(seeds=2, epochs=1, figures=False, progress=False, holdout_rotation=1)
    a = tmp_path / "a"
    run_study(StudyConfig.quick(out=str(a), methods=("deterministic", "mc_dropout"), **kw))
    b = tmp_path / "b"
    run_study(StudyConfig.quick(out=str(b), methods=("deterministic", "posthoc_gp"), **kw))
    both = run_study(StudyConfig.quick(
        out=str(tmp_path / "all"), methods=("deterministic", "mc_dropout", "posthoc_gp"), **kw
    ))  # fmt: skip
    merged = merge_studies([a, b], tmp_path / "merged")
    assert merged["methods"] == ["deterministic", "mc_dropout", "posthoc_gp"]
    want, got = both["datasets"]["digits"], merged["datasets"]["digits"]
    for part in ("pooled", "paired", "per_pair", "wins"):
        assert without_times(got[part]) == without_times(want[part]), part
    assert (tmp_path / "merged" / "report.md").is_file()
    assert json.loads((tmp_path / "merged" / "results.json").read_text())["merged_from"]

    c = tmp_path / "c"  # another seed with fewer methods: its run would lack mc_dropout
    kw_c = {**kw, "seeds": 1}
    run_study(StudyConfig.quick(out=str(c), methods=("deterministic",), seed=2, **kw_c))
    with pytest.raises(ValueError, match="lacks"):
        merge_studies([a, c], tmp_path / "bad")
    d = tmp_path / "d"  # another seed, the same methods: the runs add up to seeds 0, 1, 2
    run_study(StudyConfig.quick(out=str(d), methods=("deterministic", "mc_dropout"), seed=2,
                                **kw_c))  # fmt: skip
    three = run_study(StudyConfig.quick(
        out=str(tmp_path / "three"), methods=("deterministic", "mc_dropout"), **{**kw, "seeds": 3}
    ))  # fmt: skip
    added = merge_studies([d, a], tmp_path / "added")
    assert added["seeds"] == [0, 1, 2] and added["config"]["seeds"] == 3
    want, got = three["datasets"]["digits"], added["datasets"]["digits"]
    assert [(r["pair"], r["seed"]) for r in got["runs"]] == [
        (r["pair"], r["seed"]) for r in want["runs"]
    ]
    for part in ("pooled", "paired", "per_pair", "wins"):
        assert without_times(got[part]) == without_times(want[part]), part
    # the seed lacking mc_dropout joins when only the methods every run has are kept
    kept = merge_studies([a, c], tmp_path / "kept", methods=["deterministic"])
    assert kept["methods"] == ["deterministic"] and kept["seeds"] == [0, 1, 2]
    assert all(set(r["methods"]) == {"deterministic"} for r in kept["datasets"]["digits"]["runs"])
    assert without_times(kept["datasets"]["digits"]["pooled"]["deterministic"]) == without_times(
        three["datasets"]["digits"]["pooled"]["deterministic"])  # fmt: skip
    with pytest.raises(ValueError, match=r"methods must name methods of the sources"):
        merge_studies([a, c], tmp_path / "bad4", methods=["deterministic", "ensemble"])
    e = tmp_path / "e"  # another setting (the epochs): refused
    run_study(StudyConfig.quick(out=str(e), methods=("deterministic",), **{**kw, "epochs": 2}))
    with pytest.raises(ValueError, match="epochs"):
        merge_studies([a, e], tmp_path / "bad3")
    res = json.loads((b / "results.json").read_text())  # a shared method that disagrees
    res["datasets"]["digits"]["runs"][0]["methods"]["deterministic"]["accuracy"] += 0.01
    (b / "results.json").write_text(json.dumps(res))
    with pytest.raises(ValueError, match="'deterministic' differs"):
        merge_studies([a, b], tmp_path / "bad2")


def test_the_study_records_the_kl_of_a_variational_posterior_and_none_elsewhere():
    """last_layer/sgpa: the network's posterior_kl over the training inputs (mean per example,
    global); methods without a variational posterior: None (shown as —)."""
    import torch

    from bayesattn.study.metrics import SCALARS, get
    from bayesattn.study.runs import Run

    cfg = StudyConfig.quick(epochs=1, methods=("deterministic", "last_layer"), progress=False)
    run = Run.load(cfg, "digits", (8, 9), 0)
    rec = get_method("last_layer")
    f = rec.fit(run)
    local, glob = rec.posterior_kl(f, run)
    want_local, want_glob = f.nets[0].posterior_kl(run.data.x_train)
    assert local == pytest.approx(float(want_local.mean())) and glob == want_glob == 0.0
    assert local > 0.0
    det = get_method("deterministic")
    assert det.posterior_kl(det.fit(run), run) is None
    keys = {k: p for k, p, _ in SCALARS}
    assert get({"kl_local": None}, keys["kl_local"]) is None
    assert get({}, keys["kl_global"]) is None  # a study written before the KL was recorded
    assert torch.is_tensor(want_local) and want_local.shape == (len(run.data.x_train),)


@pytest.mark.skipif(
    not __import__("pathlib").Path("/usr/share/games/fortunes/art").is_file(),
    reason="Debian's fortunes package (.ci/run installs it)",
)
def test_a_fortunes_run_has_token_sets_and_a_token_network():

    from bayesattn.data.token_ood import TOKEN_CORRUPTIONS
    from bayesattn.study.runs import Run

    cfg = StudyConfig.quick(dataset="fortunes", epochs=1, progress=False)
    assert "fortunes" in StudyConfig.full().dataset_list  # the full protocol's tokens
    run = Run.load(cfg, "fortunes", (8, 9), 0)
    assert set(run.far) == {"uniform", "reversed", "permuted", "moments"}
    assert {k for k, _ in run.corrupted} == set(TOKEN_CORRUPTIONS)
    net = run.network(None)
    assert net.vocab_size == run.data.vocab_size
    logits = net.eval()(run.data.x_test[:5])
    assert logits.shape == (5, run.data.num_classes)
    assert run.features("val").shape == (len(run.data.x_val), run.model["d_model"])
