"""`tandem VERB` is the one entry point of the simulation and of every benchmark: the command is
sim/cli.py, each verb with its own parser (sim/cli.py OWN_PARSER_VERBS, bench/cli.py's) answers
-h under its own name, and `tandem -h` lists them all."""
from __future__ import annotations

import pytest

from bench import cli as bench_cli
from sim.cli import BENCH_VERBS, OWN_PARSER_VERBS, main

pytestmark = pytest.mark.unit  # fast: no process or server started (pyproject.toml)


@pytest.mark.parametrize("verb", sorted([*OWN_PARSER_VERBS, *bench_cli.OWN_PARSER_VERBS]))
def test_each_own_parser_verb_answers_help_under_its_tandem_name(verb, capsys):
    with pytest.raises(SystemExit) as exited:
        main([verb, "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: tandem {verb} ")


def test_tandem_help_lists_every_verb(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    listed = capsys.readouterr().out
    for verb in ("sim", "loadgen", *OWN_PARSER_VERBS, *BENCH_VERBS):
        assert f"    {verb} " in listed or f"    {verb}\n" in listed, verb


def test_the_command_names_exactly_the_benchmarks_verbs():
    """sim/cli.py lists the benchmarks' verbs without importing bench/; bench/cli.py runs them."""
    parser_verbs = set(bench_cli.build_parser()._subparsers._group_actions[0].choices)
    assert set(BENCH_VERBS) == parser_verbs


def test_a_benchmark_verb_runs_through_the_command(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["load", "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: tandem load ")
