"""The `galaxy` parser registers only the command a command line names:
the same parse as the full parser, and `galaxy serve KIND` (how every
control-function instance starts) imports no other component, nor the
simulator, the bench or chaos."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys

import pytest

from controlplane.tools import cli


def _choices(p: argparse.ArgumentParser) -> list[str]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return list(a.choices)
    raise AssertionError("no subcommands")


def test_registrars_register_exactly_the_names_listed():
    by_registrar: dict[tuple[str, str], set[str]] = {}
    for name, reg in cli.REGISTRARS.items():
        by_registrar.setdefault(reg, set()).add(name)
    for (module, func), names in by_registrar.items():
        p = argparse.ArgumentParser()
        sub = p.add_subparsers()
        getattr(importlib.import_module(module), func)(sub)
        assert set(_choices(p)) == names, module


def test_the_full_parser_has_every_command_once():
    names = _choices(cli.build_parser())
    assert len(names) == len(set(names))
    assert set(names) == {*cli.REGISTRARS, *cli.CALLS, "up", "calibrate", "serve", "completion"}


LINES = [
    ["serve", "controller", "--insecure", "--listen", "127.0.0.1:0"],
    ["--run-dir=/tmp/r", "serve", "dispatch", "--controller", "h:1", "--insecure"],
    ["--log-level", "DEBUG", "serve", "schedule", "--controller", "h:1"],
    ["up", "--nodes", "3"],
    ["invoke", "echo", "--data", "x"],
    ["status", "--json"],
    ["simulate", "--out", "/tmp/o", "--until", "5"],
    ["bench", "-f", "x.yaml"],
    ["traffic", "--help-not-a-flag"],
]


def _parse(p: argparse.ArgumentParser, argv: list[str]) -> dict[str, object] | str:
    try:
        ns = vars(p.parse_args(argv))
    except SystemExit as e:
        return f"exit {e.code}"
    ns.pop("id", None)  # a random default per parser
    ns["func"] = getattr(ns.get("func"), "__qualname__", None)
    return ns


@pytest.mark.slow
@pytest.mark.parametrize("argv", LINES, ids=lambda a: " ".join(a)[:40])
def test_a_command_line_parses_as_with_the_full_parser(argv, capsys):
    assert _parse(cli.build_parser(argv), argv) == _parse(cli.build_parser(), argv)


@pytest.mark.parametrize(
    "argv,cmd,kind",
    [
        (["serve", "nodeagent", "--x"], "serve", "nodeagent"),
        (["--log-level", "INFO", "up"], "up", None),
        (["--run-dir=/x", "invoke", "f"], "invoke", None),
        (["-h"], None, None),
        (["serve", "--help"], "serve", None),
        ([], None, None),
    ],
)
def test_wanted_finds_the_command_past_global_options(argv, cmd, kind):
    assert cli._wanted(argv) == (cmd, kind)


@pytest.mark.slow
def test_serve_imports_only_its_own_component():
    code = (
        "import sys, json\n"
        "from controlplane.tools import cli\n"
        "cli.build_parser(['serve', 'controller']).parse_args(['serve', 'controller'])\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    mods = json.loads(out.stdout)
    assert "controlplane.controller.main" in mods
    heavy = ("simulator", "controlplane.bench", "functions", "controlplane.tools.chaos")
    heavy += ("controlplane.nodeagent.main", "controlplane.gateway", "aiohttp")
    assert not [m for m in mods if m.startswith(heavy)]
