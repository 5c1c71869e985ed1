"""benchmarks/fault_injection.py with small mixes. Single process: a kill, a kill plus a damaged checkpoint, a
concurrent second run, a config change on resume (and a full disk where root can mount a tmpfs). Two ranks
(DDP under torchrun) and lm finetune task=glue/all: a kill and a kill plus damage each. Issue 49's kinds, one
each. Every trial must end as an exact resume or a clear refusal: zero silent corruptions, no file outside the
run dirs touched."""

import json
import subprocess
import sys

import pytest

from tests.engine_support import REPO, subprocess_env

pytestmark = pytest.mark.slow


def run_trials(tmp_path, args: list[str], timeout: int) -> dict:
    """benchmarks/fault_injection.py with `args`, its output under tmp_path/out: the summary it wrote (it must
    exit 0)."""
    proc = subprocess.run(
        [sys.executable, "benchmarks/fault_injection.py", *args, "--out", str(tmp_path / "out")],
        cwd=REPO,
        env=subprocess_env(LM_CACHE=str(tmp_path / "cache")),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((tmp_path / "out" / "fault_injection.json").read_text())


def test_fault_injection_finds_no_silent_corruption(tmp_path):
    summary = run_trials(tmp_path, ["--trials", "5", "--seed", "0"], timeout=900)
    total = summary["total"]
    assert total["trials"] == 5 and total["silent_corruption"] == 0, summary
    assert total["exact_resume"] + total["clear_refusal"] + total["skipped"] == 5
    assert set(summary["by_kind"]) == {"kill", "kill+damage", "concurrent", "config_change", "disk_full"}
    assert summary["by_kind"]["concurrent"]["clear_refusal"] == 1  # the live holder always refuses a second run
    assert summary["outside_run_dir_touched"] is False
    assert "| **all** | 5 |" in (tmp_path / "out" / "fault_injection.md").read_text()


def test_two_ranks_and_finetuning_find_no_silent_corruption(tmp_path):
    """DDP under torchrun (a kill inside a step/checkpoint write/at a random moment, then a damaged checkpoint)
    and lm finetune task=glue/all (a kill, a damaged task/seed checkpoint): exact resumes or clear refusals."""
    summary = run_trials(
        tmp_path, ["--trials", "0", "--ddp-trials", "2", "--finetune-trials", "2", "--seed", "1"], timeout=1800
    )
    assert set(summary["by_kind"]) == {"ddp:kill", "ddp:kill+damage", "finetune:kill", "finetune:kill+damage"}
    total = summary["total"]
    assert total["trials"] == 4 and total["silent_corruption"] == 0 and total["skipped"] == 0, summary
    assert total["exact_resume"] + total["clear_refusal"] == 4
    assert summary["outside_run_dir_touched"] is False


def test_issue_49_trials_find_no_silent_corruption(tmp_path):
    """One trial of each of issue 49's kinds: a damaged `latest` plus a changed model (refused by the config of the
    checkpoint resumed), a deleted `latest` (resumed from the newest intact step_*), a `.lock` planted as a symlink
    (refused, its target untouched), an infinite gradient norm (stopped), `latest` naming another run's checkpoint
    (this run's own newest intact one resumed)."""
    kinds = ["damage+config_change", "deleted_latest", "symlinked_lock", "inf_grad", "latest_outside"]
    summary = run_trials(tmp_path, ["--trials", "5", "--kinds", ",".join(kinds), "--seed", "0"], timeout=1800)
    outcomes = {kind: [o for o, n in c.items() if o != "trials" and n] for kind, c in summary["by_kind"].items()}
    assert outcomes == {
        "damage+config_change": ["clear_refusal"],
        "deleted_latest": ["exact_resume"],
        "symlinked_lock": ["clear_refusal"],
        "inf_grad": ["clear_refusal"],
        "latest_outside": ["exact_resume"],
    }, summary
    assert summary["outside_run_dir_touched"] is False


def test_kills_during_asynchronous_writes_find_no_silent_corruption(tmp_path):
    """train.async_checkpoint=true (issue 51 item 3), one process and FSDP2 on 2 ranks (DCP's async_save): killed
    while a background write is parked in a random phase and the loop trains on, or at a random moment; the rerun
    gives the synchronous reference's losses."""
    summary = run_trials(
        tmp_path, ["--trials", "2", "--kinds", "async_kill", "--fsdp2-trials", "1", "--seed", "0"], timeout=1800
    )
    assert set(summary["by_kind"]) == {"async_kill", "fsdp2:async_kill"}
    total = summary["total"]
    assert total["trials"] == 3 and total["exact_resume"] == 3 and total["silent_corruption"] == 0, summary
    assert summary["outside_run_dir_touched"] is False


def test_an_out_of_an_earlier_call_is_refused(tmp_path, capsys):
    """A second call with the same --out resumed the first call's finished runs as its own trials (no fault ever
    landed) and overwrote its summary; a file as --out was a FileExistsError traceback."""
    from tests.benchmark_scripts import load

    (tmp_path / "fault_injection.json").write_text("{}")
    for out in (tmp_path, tmp_path / "fault_injection.json"):
        with pytest.raises(SystemExit) as e:
            load("fault_injection").main(["--trials", "1", "--out", str(out)])
        assert e.value.code == 2 and "is not a new or empty directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fault_injection.json"]
