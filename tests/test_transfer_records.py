"""lm transfer's records in --out and in a scratch arm, checked without running the recipe: which files there are
its own, and which reruns are the same arm."""

import json

import pytest

from lm.cli.transfer_recipe import Recipe, TransferError


def test_a_rerun_adding_a_finetune_override_that_changes_nothing_computed_keeps_the_scratch_arm(tmp_path):
    """A stopped call run again with --finetune train.threads=1 (or train.progress=true) was refused as another
    recipe's scratch arm (differs in ['finetune'], no more said), advising to remove the finished arm; lm finetune
    itself resumes a pair across those. An override that changes what is computed is still refused, naming it."""
    from lm.cli.transfer_recipe import check_scratch_arm

    r = Recipe(out=tmp_path / "run", scratch=tmp_path / "scratch")
    r.scratch.mkdir()
    (r.scratch / "transfer_arm.json").write_text(json.dumps({"seeds": [0], "finetune": ["optim.lr=3e-3"]}))
    check_scratch_arm(r, {"seeds": [0], "finetune": ["optim.lr=3e-3", "train.threads=1", "train.progress=true"]})
    with pytest.raises(
        TransferError, match=r"differs in \['finetune'\]; finetune: \['optim.lr=3e-3'\] -> \['optim.lr=1e-3'\]; see "
    ):
        check_scratch_arm(r, {"seeds": [0], "finetune": ["optim.lr=1e-3"]})


def test_a_users_seconds_file_at_out_is_refused_not_counted(tmp_path):
    """A user's transfer_seconds.json in --out was read as the point's running total (its 5 s added to the run
    record's seconds) and replaced; lm transfer's own is accepted."""
    from lm.cli.transfer_point import check_own_files

    (tmp_path / "transfer_seconds.json").write_text('{"elapsed": 5}\n')
    with pytest.raises(TransferError, match=r"transfer_seconds.json exists and is not a file lm transfer wrote"):
        check_own_files(tmp_path)
    (tmp_path / "transfer_seconds.json").write_text('{"seconds": 5.0}\n')
    check_own_files(tmp_path)


def test_a_point_is_the_same_whatever_order_its_overrides_were_typed_in(tmp_path):
    """--pretrain model.dim=48 train.seq_len=64 then --pretrain train.seq_len=64 model.dim=48 in the same --out was
    refused as another recipe's point; a key given twice in another order is another point (the last one wins)."""
    from lm.cli.transfer_point import POINT, check_point

    point = {"preset": "p", "steps": 4, "tokens_per_step": 128, "pretrain_schedule": []}
    (tmp_path / POINT).write_text(json.dumps(point | {"pretrain_overrides": ["model.dim=48", "train.seq_len=64"]}))
    check_point(tmp_path, point | {"pretrain_overrides": ["train.seq_len=64", "model.dim=48"]})
    (tmp_path / POINT).write_text(json.dumps(point | {"pretrain_overrides": ["model.dim=48", "model.dim=64"]}))
    with pytest.raises(TransferError, match="holds the point of another recipe"):
        check_point(tmp_path, point | {"pretrain_overrides": ["model.dim=64", "model.dim=48"]})
