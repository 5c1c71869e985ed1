"""Every benchmark script against today's lm: the names it imports exist, it imports, and its shell commands name
commands, modules, presets and files that exist. A script is mostly run on a rented GPU or after weeks of lm
changes; a rename in lm (a removed function, a moved module) should fail here, not in its first minute there.
Running each script at tiny sizes is the job of its own test (tests/test_bench*.py, test_transfer_gpu_script.py,
test_hf_glue_check.py, test_kernels.py); these only read them, but for speedrun_pair.sh's choice of lm and
glue_layout_probe.py's arguments."""

import re
import subprocess

import pytest

from lm.cli.main import COMMANDS
from lm.config import conf_dir
from tests.benchmark_scripts import BENCHMARKS, _is_module, lm_references, load, unresolved

SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py"))
SHELL = sorted(p.name for p in BENCHMARKS.glob("*.sh"))


def test_the_reader_finds_a_removed_name_in_a_function_and_not_a_shadowed_one():
    source = (
        "from lm.data.tokenizer import Tokenizer\n"
        "import lm.core.async_save as save\n"
        "def main():\n"
        "    from lm.cli.transfer_arms import check_scratch_arm\n"
        "    save.BackgroundWrite.busy\n"
        "    Tokenizer.load\n"
        "def raw():\n"
        "    from tokenizers import Tokenizer\n"
        "    Tokenizer.from_file\n"
    )
    refs = lm_references(source)
    assert refs == [  # (line 1's Tokenizer is read as its longer chain, line 6's)
        (4, "lm.cli.transfer_arms.check_scratch_arm"),
        (5, "lm.core.async_save.BackgroundWrite.busy"),
        (6, "lm.data.tokenizer.Tokenizer.load"),
    ]
    assert [unresolved(d) for _, d in refs] == [
        "lm.cli.transfer_arms has no check_scratch_arm",
        "lm.core.async_save.BackgroundWrite has no busy",
        None,
    ]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_lm_name_a_benchmark_uses_exists(script):
    refs = lm_references((BENCHMARKS / script).read_text())
    missing = [f"{script}:{line}: {dotted} ({why})" for line, dotted in refs if (why := unresolved(dotted))]
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_imports_without_running(script, capsys):
    load(script.removesuffix(".py"))  # its top level only: main() runs under __name__ == "__main__"
    assert capsys.readouterr().out == ""


def _commands(text: str) -> list[str]:
    """The shell script's lines without comments, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", text)
    return [line.split(" #")[0] for line in text.splitlines() if not line.lstrip().startswith("#")]


@pytest.mark.parametrize("script", SHELL)
def test_every_benchmark_shell_script_parses_and_names_what_exists(script):
    path = BENCHMARKS / script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    root, missing = BENCHMARKS.parent, []
    for line in _commands(path.read_text()):
        for module in re.findall(r"-m (lm(?:\.\w+)+)", line):
            missing += [] if _is_module(module) else [f"module {module}"]
        for command in re.findall(r"(?:-m lm|^\s*lm|[(;&|]\s*lm) (\w+)", line):
            missing += [] if command in COMMANDS else [f"lm command {command}"]
        for file in re.findall(r"\b((?:benchmarks|tests)/\w+\.(?:py|sh))\b", line):
            missing += [] if (root / file).is_file() else [f"file {file}"]
        for preset in re.findall(r"experiment=(\w+)", line):
            missing += [] if (conf_dir() / "experiment" / f"{preset}.yaml").is_file() else [f"experiment {preset}"]
        for preset in re.findall(r"--preset (\w+)\b(?!=)", line):  # lm transfer's experiment, gpu_mfu.py's model
            found = any((conf_dir() / group / f"{preset}.yaml").is_file() for group in ("experiment", "model"))
            missing += [] if found else [f"preset {preset}"]
    assert not missing, f"{script}: {missing}"


def test_speedrun_pair_runs_this_checkouts_lm_where_none_is_installed(tmp_path):
    """benchmarks/speedrun_pair.sh hands the timing to the peers' script, which runs `lm train` if `lm` is on PATH
    and the old `lm-train` console script (removed) otherwise: on a machine without `pip install -e .` (a rented
    GPU) every lm round failed, and where a venv holds another checkout's install that checkout's lm was timed."""
    import os
    import sys

    peers, bin_dir = tmp_path / "peers", tmp_path / "bin"
    peers.mkdir()
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # python, and no lm, on PATH
    (bin_dir / "python").chmod(0o755)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "nano_1.log").write_text("step 2000: train loss 1.0, val loss 1.6\n")
    (logs / "lm_1.log").write_text("step 1100: val_loss 1.5\n")
    (peers / "speedrun_pair.sh").write_text(  # the peers' choice of command, as theirs makes it
        "if command -v lm >/dev/null && lm --help 2>/dev/null | grep -qw train; then LM_TRAIN=(lm train); "
        "else LM_TRAIN=(lm-train); fi\n"
        'echo "command: ${LM_TRAIN[*]}"\n'
        f"echo 'logs: {logs}'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"PATH": f"{bin_dir}:/usr/bin:/bin", "LM_PEERS": str(peers)}
    out = subprocess.run(["bash", str(BENCHMARKS / "speedrun_pair.sh"), "1"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "command: lm train" in out.stdout
    assert "round 1: nanoGPT step 2000: val loss 1.6   lm step 1100: val_loss 1.5" in out.stdout


def test_glue_layout_probe_refuses_parallel_whose_scratch_lane_it_cannot_reach(monkeypatch):
    """benchmarks/glue_layout_probe.py swaps lm.glue.encode.build_inputs in its own process; lm transfer --parallel
    ran the scratch arm as a second, plain lm transfer process, so that arm got [CLS] a [SEP] b [SEP] and the
    pretrained one [EOS] a [EOS] b [EOS]: the probe compared two layouts, not two initialisations."""
    import lm.cli.transfer
    import lm.glue.encode as encode

    calls = []
    monkeypatch.setattr(lm.cli.transfer, "main", lambda argv: calls.append((argv, encode.build_inputs)))
    monkeypatch.setattr(encode, "build_inputs", encode.build_inputs)  # put back after the test
    probe = load("glue_layout_probe")
    with pytest.raises(SystemExit, match="--parallel runs the scratch arm as a plain lm transfer process"):
        probe.main(["--tokens", "0", "--parallel"])
    assert calls == []
    probe.main(["--tokens", "0", "--tasks", "rte"])
    assert calls == [(["--tokens", "0", "--tasks", "rte"], probe.build_inputs)]
