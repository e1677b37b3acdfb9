"""The ``bayesattn`` command line: version, help with defaults, the method listing."""

from __future__ import annotations

import argparse
import re

import pytest

import bayesattn
from bayesattn.cli import build_parser, main, method_listing
from bayesattn.study import METHODS, get_method, register_method
from bayesattn.study.methods import Method


def _parsers() -> list[argparse.ArgumentParser]:
    top = build_parser()
    subs = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    return [top, *(p for a in subs for p in a.choices.values())]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"bayesattn {bayesattn.__version__}"


@pytest.mark.parametrize("parser", _parsers(), ids=lambda p: p.prog)
def test_every_option_shows_its_default(parser: argparse.ArgumentParser):
    """Every option taking a value says its default in ``--help`` (flags default to off)."""
    fmt = parser._get_formatter()
    missing = []
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0:  # positionals, flags, help, version
            continue
        if "default" not in fmt._expand_help(action):
            missing.append(action.option_strings[0])
    assert not missing, f"{parser.prog}: no default in the help of {missing}"
    parser.format_help()  # renders (no stray % in a help string)


def test_defaults_in_help_are_the_real_ones():
    study = _parsers()[1]
    text = " ".join(study.format_help().split())
    assert "--seed SEED first seed (0 .. 4294967295) (default: 0)" in text  # 0 is shown too
    assert "(default: bayesattn-study)" in text and "(default: 3; --quick: 2;" in text
    # (a data set registered earlier in the process, e.g. by a docs snippet, is listed too)
    epochs = re.search(r"\(default: by dataset, ([^;]*); --quick: 5\)", text)
    assert epochs, text
    assert {"digits 20", "mnist1d 30", "fortunes 10", "wordnet 10"} <= set(epochs[1].split(", "))


def test_list_methods_describes_every_method(capsys):
    assert main(["study", "--list-methods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["method", "runs", "in", "description"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert list(rows) == list(METHODS)
    for name in METHODS:
        description = get_method(name).description
        assert description.strip() and rows[name].endswith(description)
    assert "default, full" in rows["deterministic"] and "by name" in rows["weights"]
    assert method_listing() == "\n".join(lines)


def test_a_method_without_a_description_is_refused():
    class Nameless(Method):
        name = "test_undescribed"

    with pytest.raises(ValueError, match="'test_undescribed' needs a description"):
        register_method(Nameless())
    assert "test_undescribed" not in METHODS
