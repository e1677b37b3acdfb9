"""The study's figures: every method its own look in the Pareto figure (``bayesattn.study.figures``)."""

from __future__ import annotations

from bayesattn.study.figures import method_styles


def test_every_method_has_its_own_colour_and_marker():
    methods = [f"m{k}" for k in range(14)]  # more methods than tab10 has colours
    styles = method_styles(methods)
    looks = [(tuple(c), mk) for c, mk in styles.values()]
    assert len(set(looks)) == len(methods)
    assert styles["m10"][0] == styles["m0"][0] and styles["m10"][1] != styles["m0"][1]
