"""Study steps that raise (issue 33): a bad configuration leaves the folder as it was; a method
that fails before any run of a replacing study finished gives the earlier study back; in a new
folder it leaves the folder INCOMPLETE (issue 43: a status, and what it finished, kept for a
resume: ``tests/study/test_resume.py``); registries are unchanged by a registration that raises.
(A killed study says INCOMPLETE: ``tests/cross_cutting/test_faults.py``.)"""

from __future__ import annotations

import pytest

from bayesattn._study_io import INCOMPLETE, study_status
from bayesattn.study import StudyConfig, run_study
from bayesattn.study import methods as M

pytestmark = pytest.mark.slow  # one tiny study (about 10 s)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("atomic") / "s"
    run_study(StudyConfig.quick(out=str(out), methods=("deterministic",), seeds=1, epochs=1,
                                figures=False, progress=False))  # fmt: skip
    return out


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("bad", [
    dict(methods=("nope",)), dict(epochs=0), dict(holdout_classes=(8, 8)), dict(jobs=0),
    dict(seeds=0), dict(num_samples=-1),
])  # fmt: skip
def test_a_study_refused_at_set_up_leaves_the_folder_as_it_was(study, bad):
    before = _snapshot(study)
    kw = dict(methods=("deterministic",), seeds=1, epochs=1, figures=False, progress=False)
    with pytest.raises((ValueError, TypeError)):
        run_study(StudyConfig.quick(out=str(study), **{**kw, **bad}))
    assert _snapshot(study) == before and study_status(study) == "complete"


class _Fails(M.Deterministic):
    name = "r4_fails"

    def fit(self, run):
        raise RuntimeError("this method fails mid-run")


def test_a_method_that_fails_mid_run_leaves_the_folder_as_it_was(study, tmp_path):
    names = tuple(M.METHODS)
    M.register_method(_Fails())
    kw = dict(seeds=1, epochs=1, figures=False, progress=False)
    try:
        with pytest.raises(ValueError, match="already registered"):
            M.register_method(_Fails(), default=True)  # a duplicate changes nothing
        assert tuple(M.DEFAULT_METHODS).count("r4_fails") == 0
        before = _snapshot(study)  # replacing an earlier study: its files come back, unchanged
        with pytest.raises(RuntimeError, match="fails mid-run"):
            run_study(StudyConfig.quick(out=str(study), methods=("deterministic", "r4_fails"),
                                        **kw), force=True)  # fmt: skip
        assert _snapshot(study) == before and study_status(study) == "complete"
        out = tmp_path / "new"  # a new folder: says it is incomplete, and why
        with pytest.raises(RuntimeError, match="fails mid-run"):
            run_study(StudyConfig.quick(out=str(out), methods=("deterministic", "r4_fails"),
                                        **kw))  # fmt: skip
        assert study_status(out) == "incomplete"
        assert "It stopped: RuntimeError: this method fails" in (out / INCOMPLETE).read_text()
    finally:
        M._REGISTRY.unregister("r4_fails")
    assert tuple(M.METHODS) == names
