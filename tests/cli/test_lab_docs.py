"""docs/lab.md's commands can be pasted as written.

Each experiment's "Flags:" line is its defaults spelt out (it said `--d 1,2,…,4096`, which no shell
passes on), in one code span on one line, and agrees with `attnscale experiment NAME --help`; each
`attnscale experiment NAME ...` the page shows names an experiment and flags that experiment takes.
"""
import re

import pytest

from conftest import ROOT

LAB = (ROOT / "docs" / "lab.md").read_text()
FLAGS_LINE = re.compile(r"^Flags: `([^`]*)`", re.M)
# "  --d TEXT=1,2,4", "  --seed UINT:INT in [0 - 18446744073709551615]=0": a flag with its default.
HELP_DEFAULT = re.compile(r"^\s+(--[\w-]+) [A-Z]+(?::[A-Z]+ in \[[^\]]*\])?=(\S+)", re.M)


def sections():
    """{experiment name: its ### section of lab.md}."""
    return {part.split()[0]: part for part in re.split(r"^### ", LAB, flags=re.M)[1:]}


def help_text(run, name):
    r = run("experiment", name, "--help")
    assert r.returncode == 0, r.stderr
    return r.stdout


WITH_FLAGS = sorted(name for name, text in sections().items() if FLAGS_LINE.search(text))


def test_the_page_has_flags_lines():
    assert {"variance", "saturation", "gradients", "length", "projections"} <= set(WITH_FLAGS), WITH_FLAGS


@pytest.mark.parametrize("name", WITH_FLAGS)
def test_a_flags_line_is_the_defaults_spelt_out(run, name):
    span = FLAGS_LINE.search(sections()[name]).group(1)
    assert "…" not in span and "..." not in span and "\n" not in span, span
    given = re.findall(r"(--[\w-]+) (\S+)", span)
    assert given, span
    defaults = dict(HELP_DEFAULT.findall(help_text(run, name)))
    for flag, value in given:
        assert defaults.get(flag) == value, (name, flag, value, defaults.get(flag))


COMMANDS = sorted(set(re.findall(r"`attnscale experiment ([a-z]+)((?: [^`]*)?)`", LAB)))


@pytest.mark.parametrize("name,args", COMMANDS)
def test_a_command_on_the_page_names_flags_its_experiment_takes(run, name, args):
    taken = set(re.findall(r"^\s+(--[\w-]+)", help_text(run, name), re.M))
    for flag in re.findall(r"(?<!\S)(--[\w-]+)", args):
        assert flag in taken, (name, flag, sorted(taken))
