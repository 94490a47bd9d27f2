"""`tandem VERB` is the one entry point of every user-facing benchmark and tool: each verb with
its own parser (bench/cli.py OWN_PARSER_VERBS) answers -h under its own name, and `tandem -h`
lists them all."""
from __future__ import annotations

import pytest

from bench.cli import OWN_PARSER_VERBS, main

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)


@pytest.mark.parametrize("verb", sorted(OWN_PARSER_VERBS))
def test_each_benchmark_verb_answers_help_under_its_tandem_name(verb, capsys):
    with pytest.raises(SystemExit) as exited:
        main([verb, "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: tandem {verb} ")


def test_tandem_help_lists_every_verb(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    listed = capsys.readouterr().out
    for verb in ("sim", "loadgen", "load", "bench", "capacity", *OWN_PARSER_VERBS):
        assert f"    {verb} " in listed or f"    {verb}\n" in listed, verb
