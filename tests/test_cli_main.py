"""The one `lm` command (issue 48, item 1): `lm --help` lists every subcommand in one line each, `lm <cmd>
--help` works for the Hydra apps and the argparse ones, the dispatched command names itself `lm <cmd>`
in its usage and errors, and `lm` is the only console script."""

import re
import tokenize

import pytest
import tomllib

from lm.cli.main import COMMANDS, usage
from tests.engine_support import REPO
from tests.test_validation_errors import run_cli

EXPECTED = {
    "train",
    "finetune",
    "prepare",
    "export",
    "report",
    "attention",
    "preflight",
    "quickstart",
    "transfer",
    "eval",
}


def test_lm_help_lists_every_command_once_in_one_line(tmp_path):
    assert set(COMMANDS) == EXPECTED
    p = run_cli("lm", "--help", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == usage()
    listed = p.stdout.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    rows = [line.split() for line in listed.splitlines()]
    assert [r[0] for r in rows] == list(COMMANDS)
    assert all(len(r) > 2 for r in rows)  # each with its summary


def test_lm_help_shows_the_readmes_first_commands_as_the_readme_writes_them(tmp_path):
    """`lm --help` listed the commands but no command line to start from."""
    from tests.test_readme import README

    p = run_cli("lm", "--help", cwd=tmp_path)
    first = p.stdout.split("first runs (README.md):\n", 1)[1].split("\n\n", 1)[0]
    commands = [line.split("#")[0].strip() for line in first.splitlines()]
    assert commands == [
        "lm quickstart",
        "lm train model=tiny data=shakespeare_char train.max_steps=200",
        "lm train data.source=my_text.txt train.max_steps=200",
    ]
    assert all(c in README.read_text() for c in commands)


def test_the_deepspeed_launchers_local_rank_before_the_command_is_dropped(tmp_path):
    """`deepspeed --module lm train ...` (docs/training.md, lm train --help) runs `python -m lm --local_rank=N train
    ...`; lm took `--local_rank=7` for the command and every rank exited: `lm: unknown command '--local_rank=7'`."""
    for flag in ("--local_rank=1", "--local-rank=1"):
        p = run_cli("lm", flag, "train", "model=tiny", "train.max_steps=7", "--cfg", "job", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        assert "  max_steps: 7\n" in p.stdout


@pytest.mark.parametrize("name", ["prepare", "export", "report", "attention", "eval", "preflight", "transfer"])
def test_argparse_help_lines_fit_120_columns(tmp_path, name):
    """Raw help text is printed as written: lm transfer's CPU-recipe example was one 191-column line (a
    backslash-newline in the docstring joined its two lines), lm attention's and lm preflight's descriptions 237 and
    215 columns, lm prepare's list of registry corpora 186."""
    p = run_cli("lm", name, "--help", cwd=tmp_path)
    assert max(len(line) for line in p.stdout.splitlines()) <= 120


def _lines_joined_by_a_backslash(path) -> list[int]:
    """Lines of `path` where a string literal that is not raw ends a line with a lone backslash, which Python reads
    as a line continuation: the two lines print as one (a docstring's shell example keeps its break with \\\\)."""
    found = []
    with open(path, "rb") as f:
        for tok in tokenize.tokenize(f.readline):
            prefix = re.match(r"[A-Za-z]*", tok.string).group() if tok.type == tokenize.STRING else "r"
            if "r" in prefix.lower():
                continue
            body = tok.string[len(prefix) :]
            for m in re.finditer(r"(\\+)\n", body):
                if len(m.group(1)) % 2:
                    found.append(tok.start[0] + body[: m.start()].count("\n"))
    return found


def test_no_lm_string_joins_two_lines_with_a_lone_backslash():
    """lm preflight's --help printed its multi-node example as one line: `...torchrun_multinode.sh \\` then a
    newline, in a docstring, is a continuation; its joined line was over 120 columns, a shorter one would not be."""
    found = {
        str(p.relative_to(REPO)): n
        for p in sorted((REPO / "lm").rglob("*.py"))
        if (n := _lines_joined_by_a_backslash(p))
    }
    assert found == {}


def test_bare_lm_prints_usage_and_fails_and_unknown_commands_are_one_line(tmp_path):
    p = run_cli("lm", cwd=tmp_path)
    assert p.returncode == 2 and "commands:" in p.stdout
    p = run_cli("lm", "pretrain", cwd=tmp_path)
    assert p.returncode == 1
    assert p.stderr.strip() == f"lm: unknown command 'pretrain'; one of: {', '.join(COMMANDS)} (lm --help)"


@pytest.mark.parametrize("name", ["prepare", "export", "report", "attention", "preflight", "quickstart", "transfer"])
def test_argparse_commands_show_their_help_under_their_new_name(tmp_path, name):
    p = run_cli("lm", name, "--help", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: lm {name} "), p.stdout[:200]


@pytest.mark.parametrize(
    "name, group", [("train", "model/ffn:"), ("finetune", "task/glue:"), ("finetune", "protocol: electra, small, turc")]
)
def test_hydra_commands_show_usage_grammar_and_groups(tmp_path, name, group):
    p = run_cli("lm", name, "--help", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: lm {name} [override ...]")
    assert group in p.stdout
    assert "lm-" not in p.stdout  # no old command names
    if name == "train":
        assert "model/ffn=swiglu" in p.stdout and "-m " in p.stdout  # the override grammar


def test_help_lists_only_options_a_user_can_pick(tmp_path):
    """Hydra's group list also names the schema nodes that type the options (`mlp_schema`, `data: ... schema`)."""
    p = run_cli("lm", "train", "--help", cwd=tmp_path)
    listed = p.stdout.split("== Config groups (group=option) ==")[1]
    groups = dict(line.split(": ", 1) for line in listed.splitlines() if line)
    assert groups["model/ffn"].split(", ")[:3] == ["elu", "geglu", "gelu"]
    assert "swiglu" in groups["model/ffn"].split(", ") and "single" in groups["engine"].split(", ")
    assert not [o for line in groups.values() for o in line.split(", ") if o.endswith("schema")], groups


def test_a_dispatched_hydra_app_names_itself_in_its_errors(tmp_path):
    (tmp_path / "f").write_text("x")
    p = run_cli("lm", "train", "model=tiny", f"run_dir={tmp_path / 'f' / 'run'}", cwd=tmp_path)
    assert p.returncode == 1
    assert p.stderr.strip().startswith(f"lm train: run_dir {tmp_path / 'f' / 'run'} is not writable"), p.stderr


def test_lm_is_the_only_console_script():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"lm": "lm.cli.main:main"}
