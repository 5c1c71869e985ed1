"""A full disk under the files a run or lm prepare keeps open (metrics.jsonl, train.log, a token shard): the error
names the file, so the one line lm/cli/errors.py prints says which disk to free, and what was written stays.
/dev/full is the full disk: every write to it fails with ENOSPC. (A checkpoint's full disk:
tests/test_checkpoint_safety.py and tests/test_checkpoint_async.py.)"""

import errno
import json
import logging

import numpy as np
import pytest

FULL = "No space left on device"


def test_a_full_disk_under_metrics_jsonl_names_it_and_keeps_the_written_lines(tmp_path):
    from lm.cli.errors import describe
    from lm.core.config import LoggerConfig
    from lm.core.tracking import Tracker

    tracker = Tracker(tmp_path, LoggerConfig(), {})
    tracker.log({"step": 1, "loss": 2.5})
    kept, tracker.file = tracker.file, open("/dev/full", "w")  # noqa: SIM115 - the tracker closes it
    kept.close()
    with pytest.raises(OSError) as e:
        tracker.log({"step": 2, "loss": 2.25})
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "metrics.jsonl")
    assert (
        describe(e.value) == f"{FULL} ({tmp_path / 'metrics.jsonl'}) — free space on that disk, or write somewhere else"
    )
    tracker.close(failed=True)  # the refused line flushed again: the run's own error stays the one raised
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        {"step": 1, "loss": 2.5}
    ]


def test_a_full_disk_under_train_log_is_said_once_naming_it(tmp_path, capsys):
    from lm.core.setup import log_to_file, stop_logging_to_file

    log = logging.getLogger("lm")
    console = logging.StreamHandler()  # the terminal (lm's CLI installs its own)
    log.addHandler(console)
    (tmp_path / "train.log").symlink_to("/dev/full")
    handler = log_to_file(tmp_path / "train.log")
    try:
        for step in range(1, 4):
            log.warning("step %d", step)
        stop_logging_to_file(handler)  # its close flushes again: no second error
    finally:
        log.removeHandler(console)
        log.removeHandler(handler)
    err = capsys.readouterr().err
    assert "Logging error" not in err and "Traceback" not in err  # logging's default: a traceback per line
    said = [line for line in err.splitlines() if "cannot be written" in line]
    assert said == [
        f"{tmp_path / 'train.log'} cannot be written ({FULL}); it ends here, the terminal and "
        "metrics.jsonl go on: free space on that disk"
    ]
    assert [line for line in err.splitlines() if line.startswith("step")] == ["step 1", "step 2", "step 3"]


def test_a_full_disk_under_a_token_shard_names_it(tmp_path):
    from lm.data.shards import ShardWriter

    writer = ShardWriter(tmp_path, "train", np.uint16, 100)
    writer.write(np.arange(10, dtype=np.uint16))
    shard = tmp_path / "train_00000.bin.tmp"
    assert writer.state() == {"shards": [], "current": 10} and shard.stat().st_size == 20
    writer.f.close()
    writer.f = open("/dev/full", "wb", buffering=0)  # noqa: SIM115 - the writer closes it
    with pytest.raises(OSError) as e:
        writer.write(np.arange(5, dtype=np.uint16))
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(shard)
    writer.release()
    assert shard.stat().st_size == 20  # what the progress record counts is still there
