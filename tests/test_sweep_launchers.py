"""The sweep machinery in one process: a failing cell's exit becomes its failure, its logged reason
lands in error.txt (and in lm report), GPU slots are exclusive, a cell is a wandb run of the sweep's
group with its overrides as tags."""

import logging
import os
import threading
import time

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from lm.report.runs import load_run
from lm.sweep.callbacks import OwnSweepDir, RecordFailure
from lm.sweep.launchers import CellExited, ExitAsError, claim_slot, visible_gpus


def test_exit_becomes_the_cells_failure():
    def bad_config(cfg):
        raise SystemExit(1)

    def ok(cfg):
        return cfg * 2

    with pytest.raises(CellExited, match="exited with status 1"):
        ExitAsError(bad_config)(None)
    assert ExitAsError(ok)(21) == 42
    assert ExitAsError(lambda cfg: (_ for _ in ()).throw(SystemExit(0)))(None) is None
    with pytest.raises(ValueError, match="real"):  # other exceptions pass through for Hydra to record
        ExitAsError(lambda cfg: (_ for _ in ()).throw(ValueError("real")))(None)


def _job_config(run_dir):
    return OmegaConf.create(
        {
            "run_dir": str(run_dir),
            "hydra": {"overrides": {"task": ["model.n_heads=3", "seed=0"]}, "runtime": {"output_dir": str(run_dir)}},
        }
    )


def test_record_failure_writes_the_logged_reason(tmp_path):
    cb = RecordFailure()
    cfg = _job_config(tmp_path / "3")
    cb.on_job_start(config=cfg)
    logging.getLogger("lm").error("%s: %s", "ConfigError", "model.dim=64 is not divisible by model.n_heads=3")
    ret = JobReturn(status=JobStatus.FAILED, _return_value=CellExited("the cell exited with status 1"))
    cb.on_job_end(config=cfg, job_return=ret)
    text = (tmp_path / "3" / "error.txt").read_text()
    assert text.startswith("overrides: model.n_heads=3 seed=0\n")
    assert "CellExited: the cell exited with status 1" in text
    assert text.endswith("logged errors:\nConfigError: model.dim=64 is not divisible by model.n_heads=3\n")
    run = load_run(tmp_path / "3")
    assert run.status == "failed" and run.reason == "ConfigError: model.dim=64 is not divisible by model.n_heads=3"
    # the listener left with the cell: a later error is not collected
    assert not [h for h in logging.getLogger("lm").handlers if type(h).__name__ == "_ErrorLines"]


def test_record_failure_ignores_finished_cells(tmp_path):
    cb = RecordFailure()
    cfg = _job_config(tmp_path / "0")
    cb.on_job_start(config=cfg)
    cb.on_job_end(config=cfg, job_return=JobReturn(status=JobStatus.COMPLETED, _return_value=None))
    assert not (tmp_path / "0").exists()


def test_a_sweep_started_in_the_same_second_as_another_gets_a_directory_of_its_own(tmp_path, monkeypatch):
    """Two `lm train -m` started in one second made one stamp, so both sweeps ran their cells in runs/<stamp>/<N>:
    each was refused the cells the other held, and the directory mixed both sweeps' cells. Before any cell, a
    sweep now creates its directory, and one that exists gets the next suffix."""
    from lm import config as lm_config

    lm_config.register_train_configs()  # the ${lm.stamp:} resolver
    monkeypatch.setenv("LM_RUN_STAMP", "")
    monkeypatch.delenv("LM_RUN_STAMP")  # the undo removes the stamp made below
    monkeypatch.setattr(lm_config, "_made_here", set())
    stamp = lm_config.run_stamp()  # made by this process, as lm/cli/app.py makes it
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": f"{tmp_path}/runs/ablate_${{lm.stamp:}}"}}})
    other = tmp_path / "runs" / f"ablate_{stamp}"  # the other sweep's, started in the same second
    (other / "0").mkdir(parents=True)

    OwnSweepDir().on_multirun_start(config=cfg)
    assert os.environ["LM_RUN_STAMP"] == f"{stamp}-2"
    assert str(cfg.hydra.sweep.dir) == f"{tmp_path}/runs/ablate_{stamp}-2"
    assert (tmp_path / "runs" / f"ablate_{stamp}-2").is_dir()
    assert [p.name for p in other.iterdir()] == ["0"]

    os.environ["LM_RUN_STAMP"] = stamp  # a third sweep of that second
    OwnSweepDir().on_multirun_start(config=cfg)
    assert os.environ["LM_RUN_STAMP"] == f"{stamp}-3"

    # a stamp handed down (LM_RUN_STAMP set to rerun a sweep, a cell's own process) keeps its directory
    monkeypatch.setattr(lm_config, "_made_here", set())
    os.environ["LM_RUN_STAMP"] = stamp
    OwnSweepDir().on_multirun_start(config=cfg)
    assert os.environ["LM_RUN_STAMP"] == stamp


def test_slots_are_exclusive_and_freed_on_close(tmp_path):
    slot_a, held_a = claim_slot(["gpu0", "gpu1"], tmp_path, job_num=0)
    slot_b, held_b = claim_slot(["gpu0", "gpu1"], tmp_path, job_num=0)  # gpu0 is taken: the other one
    assert (slot_a, slot_b) == ("gpu0", "gpu1")
    got = {}
    t = threading.Thread(target=lambda: got.update(slot=claim_slot(["gpu0", "gpu1"], tmp_path, 2, poll_s=0.02)))
    t.start()
    time.sleep(0.3)
    assert t.is_alive() and not got  # both GPUs busy: the third cell waits
    held_b.close()
    t.join(timeout=5)
    assert got["slot"][0] == "gpu1"
    got["slot"][1].close()
    held_a.close()


def test_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert visible_gpus() == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the user hid every GPU
    assert visible_gpus() == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: no GPU
    assert visible_gpus() == []


def test_a_cell_is_a_wandb_run_in_the_sweeps_group_with_its_overrides_as_tags(tmp_path):
    """Offline wandb: the run record carries the group and the tags; wandb refuses tags over 64
    characters, so a long override is clipped instead of failing the cell."""
    wandb = pytest.importorskip("wandb")
    from lm.core.config import LoggerConfig
    from lm.core.tracking import Tracker

    long_tag = "data.source=" + "x" * 80
    cfg = LoggerConfig(
        wandb=True,
        mode="offline",
        group="ablate_ffn_norm_2026",
        name="model/ffn=swiglu,seed=1",
        tags=["model/ffn=swiglu", "seed=1", long_tag],
    )
    (tmp_path / "run").mkdir()
    tracker = Tracker(tmp_path / "run", cfg, {"model": {"dim": 64}})
    tracker.log({"step": 1, "loss": 2.0})
    tracker.close()
    wandb.teardown()  # the wandb service process writes the run file; stopping it flushes it
    (record_file,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    data = record_file.read_bytes()
    for expected in (
        b"ablate_ffn_norm_2026",
        b"model/ffn=swiglu,seed=1",
        b"model/ffn=swiglu",
        b"seed=1",
        long_tag[:64].encode(),
    ):
        assert expected in data, expected
    assert long_tag[:65].encode() not in data


def test_local_gpus_starts_cells_in_waves_of_one_process_per_slot(tmp_path, monkeypatch):
    """submitit's local executor starts every job it is given at once; the launcher hands it one wave
    of len(slots) cells at a time, numbered on from the previous wave, and returns every result in order."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the `slurm` extra (in dev too)")
    from lm.sweep.submitit_launchers import LocalGPUs

    # the class LocalGPUs really inherits from: Hydra's plugin discovery may import the plugin module a
    # second time under another name, so patching an imported name could miss it
    BaseSubmititLauncher = next(c for c in LocalGPUs.__mro__ if c.__name__ == "BaseSubmititLauncher")

    waves = []

    def fake_launch(self, job_overrides, initial_job_idx):
        waves.append((list(job_overrides), initial_job_idx))
        return [f"result {initial_job_idx + i}" for i in range(len(job_overrides))]

    monkeypatch.setattr(BaseSubmititLauncher, "launch", fake_launch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU: cpu_slots decide
    launcher = LocalGPUs.__new__(LocalGPUs)
    launcher.cpu_slots, launcher.poll_s = 2, 0.1
    launcher.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    cells = [[f"seed={i}"] for i in range(5)]
    assert launcher.launch(cells, 10) == [f"result {i}" for i in range(10, 15)]
    assert waves == [(cells[0:2], 10), (cells[2:4], 12), (cells[4:5], 14)]
