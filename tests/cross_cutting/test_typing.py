"""The ``Literal`` option types agree with what the code accepts at run time."""

from typing import get_args

import pytest

from bayesattn.nn import supports
from bayesattn.nn.blocks import AttentionConfig


def test_support_names_are_the_supports_get_support_builds():
    assert set(get_args(supports.SupportName)) == {"dense", *supports.SUPPORTS}
    for name in get_args(supports.SupportName):
        k = supports.get_support(name)
        assert (k is None) == (name == "dense")


@pytest.mark.parametrize(
    "field, value",
    [("layers", "first"), ("which", ("self", "encoder")), ("prior", "gaussian"), ("support", "x")],
)
def test_literal_options_are_still_checked_at_run_time(field, value):
    with pytest.raises(ValueError, match=field):
        AttentionConfig(family="dirichlet", **{field: value})
