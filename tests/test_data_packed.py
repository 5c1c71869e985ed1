"""Packed loader: windows, shifted labels, seeded epochs, disjoint ranks, exact resume, collators, model contract."""

import itertools

import numpy as np
import pytest
import torch

from lm.data.collate import SpanCorruption, t5_lengths
from lm.data.packed import VAL_ORDER, PackedLoader, permute
from lm.data.prepare import prepare
from lm.data.tokenizer import Tokenizer

T, B = 16, 4


@pytest.fixture(scope="module")
def data(tmp_path_factory, data_mirror):
    """The real TinyStories slice (first 400 stories), byte-level BPE, small shards so windows cross them."""
    root = tmp_path_factory.mktemp("packed")
    text = (data_mirror / "text/tinystories/tiny_stories_train_slice.txt").read_text().split("\n")
    (root / "stories.txt").write_text("\n".join(text[:400]))
    return prepare(
        {
            "source": str(root / "stories.txt"),
            "doc_split": "line",
            "tokenizer": "bpe",
            "vocab_size": 600,
            "n_sentinels": 20,
            "val_fraction": 0.1,
            "workers": 1,
            "shard_tokens": 5000,
        },
        root / "data",
        progress=False,
    )


def stream(root, split):
    import json

    meta = json.loads((root / "meta.json").read_text())
    return np.concatenate([np.fromfile(root / s["file"], dtype=meta["dtype"]) for s in meta["splits"][split]["shards"]])


def take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def test_clm_windows_are_contiguous_shifted_and_unpadded(data):
    tokens = stream(data, "train")
    loader = PackedLoader(data, "train", T, B, "clm", seed=3)
    assert loader.n_samples == (tokens.size - 1) // T
    batch = next(iter(loader))
    assert set(batch) == {"input_ids", "labels"}
    assert batch["input_ids"].dtype == torch.long and batch["input_ids"].shape == (B, T)
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])  # labels are the inputs shifted
    for row, i in zip(batch["input_ids"], loader.sample_ids(np.arange(B))):
        assert np.array_equal(row.numpy(), tokens[i * T : i * T + T])


def test_every_window_reads_the_joined_stream_also_across_shards(data):
    tokens = stream(data, "train")
    loader = PackedLoader(data, "train", 63, 4, "clm")
    shard_ends = loader.stream.starts[1:-1]
    assert len(shard_ends) >= 3  # 5000-token shards
    crossing = [i for i in range(loader.n_samples) if any(i * 63 < e < i * 63 + 64 for e in shard_ends)]
    assert len(crossing) >= 3
    ids = np.arange(loader.n_samples)
    windows = np.empty((ids.size, 64), dtype=np.int64)  # (B, T + 1)
    loader.stream.read_windows(ids * 63, windows)
    assert np.array_equal(windows, np.stack([tokens[i * 63 : i * 63 + 64] for i in ids]))
    batch = loader._batch(np.array(crossing[:4]), np.arange(4))
    assert np.array_equal(batch["input_ids"].numpy(), windows[crossing[:4], :-1])


def test_a_run_reads_the_data_it_opened_while_lm_prepare_force_replaces_it(data, tmp_path):
    """Another job's `lm prepare --force` of the directory a run reads (other settings): shards were mapped on first
    use, so the run read the new directory's shards from then on, without a word, or failed on one that no longer
    existed (a real run: FileNotFoundError train_00046.bin at step 178 of 400, the new data having 40 train shards
    where the old had 51). Every shard is now mapped when the loader opens: the run reads the data it started with."""
    import shutil

    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    tokens = stream(copy, "train")
    loader = PackedLoader(copy, "train", 63, 4, "clm")
    assert len(loader.stream.files) >= 3
    loader.stream.read_windows(np.array([0]), np.empty((1, 64), dtype=np.int64))  # the first step reads shard 0
    settings = {"source": str(data.parent / "stories.txt"), "doc_split": "line", "tokenizer": "bpe"}
    settings.update(vocab_size=600, n_sentinels=20, val_fraction=0.4, workers=1, shard_tokens=5000)
    prepare(settings, copy, force=True, progress=False)
    assert not np.array_equal(stream(copy, "train")[: tokens.size], tokens)  # the directory holds other data now
    ids = np.arange(loader.n_samples)
    windows = np.empty((ids.size, 64), dtype=np.int64)
    loader.stream.read_windows(ids * 63, windows)
    assert np.array_equal(windows, np.stack([tokens[i * 63 : i * 63 + 64] for i in ids]))


def test_a_shard_replaced_between_the_manifest_check_and_its_mapping_is_refused(data):
    """The directory replaced in the instant between open_prepared's size check and the mapping: the shard's size
    disagrees with the meta.json read before, and the run stops naming the file instead of reading other data."""
    import json

    from lm.data.errors import DataError
    from lm.data.packed import TokenStream

    meta = json.loads((data / "meta.json").read_text())
    shard = meta["splits"]["train"]["shards"][1]
    shard["tokens"] += 7  # the manifest of a directory prepared otherwise
    with pytest.raises(DataError, match=rf"{shard['file']}: \d+ tokens where its meta.json says {shard['tokens']}: "):
        TokenStream(data, meta, "train")


def test_an_epoch_visits_every_sample_once_and_epochs_differ(data):
    loader = PackedLoader(data, "train", T, 8, "clm", seed=0)
    n = loader.n_samples
    epoch0, epoch1 = loader.sample_ids(np.arange(n)), loader.sample_ids(np.arange(n, 2 * n))
    assert np.array_equal(np.sort(epoch0), np.arange(n)) and np.array_equal(np.sort(epoch1), np.arange(n))
    assert not np.array_equal(epoch0, epoch1)
    assert abs(np.corrcoef(epoch0, np.arange(n))[0, 1]) < 0.1  # shuffled, not a shifted identity


def test_permutation_is_a_seeded_bijection():
    for n in (1, 2, 7, 1000, 4097):
        p = permute(np.arange(n), n, [5, 0])
        assert np.array_equal(np.sort(p), np.arange(n))
    assert np.array_equal(permute(np.arange(50), 50, [1, 0]), permute(np.arange(50), 50, [1, 0]))
    assert not np.array_equal(permute(np.arange(50), 50, [1, 0]), permute(np.arange(50), 50, [2, 0]))


def test_same_seed_same_batches_other_seed_other_batches(data):
    a = take(PackedLoader(data, "train", T, B, seed=1), 3)
    b = take(PackedLoader(data, "train", T, B, seed=1), 3)
    c = take(PackedLoader(data, "train", T, B, seed=2), 3)
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b))
    assert not all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, c))


def test_ranks_get_disjoint_slices_that_cover_the_single_process_order(data):
    single = torch.cat([b["input_ids"] for b in take(PackedLoader(data, "train", T, 4), 3)])
    ranks = [take(PackedLoader(data, "train", T, 2, rank=r, world_size=2), 3) for r in range(2)]
    interleaved = torch.cat([torch.cat([ranks[0][s]["input_ids"], ranks[1][s]["input_ids"]]) for s in range(3)])
    assert torch.equal(interleaved, single)
    ids = [
        set(PackedLoader(data, "train", T, 2, rank=r, world_size=2).sample_ids(np.arange(r * 2, r * 2 + 2)))
        for r in range(2)
    ]
    assert not ids[0] & ids[1]


def test_train_stride_makes_every_offset_a_window_and_leaves_val_tiled(data):
    tokens = stream(data, "train")
    loader = PackedLoader(data, "train", T, B, "clm", seed=3, train_stride=1)
    assert loader.n_samples == tokens.size - T  # windows of T + 1 tokens start at 0 .. n - T - 1
    ids = loader.sample_ids(np.arange(loader.n_samples))
    assert np.array_equal(np.sort(ids), np.arange(loader.n_samples))  # an epoch is every offset once
    batch = next(iter(loader))
    for row, i in zip(batch["input_ids"], loader.sample_ids(np.arange(B))):
        assert np.array_equal(row.numpy(), tokens[i : i + T])
    last = np.empty((1, T + 1), dtype=np.int64)
    loader.stream.read_windows(np.array([loader.n_samples - 1]), last)
    assert np.array_equal(last[0], tokens[-T - 1 :])  # the last window ends at the last token
    three = PackedLoader(data, "train", T, B, "clm", train_stride=3)
    assert three.n_samples == (tokens.size - T - 1) // 3 + 1
    val = PackedLoader(data, "val", T, B, "clm", train_stride=1)
    assert val.stride == T and val.n_samples == (stream(data, "val").size - 1) // T
    state = loader.state_dict()
    with pytest.raises(Exception, match="n_samples=.* but this loader has"):
        PackedLoader(data, "train", T, B, "clm", seed=3).load_state_dict(state)
    with pytest.raises(Exception, match="data.train_stride=0 must be >= 1"):
        PackedLoader(data, "train", T, B, "clm", train_stride=0)


@pytest.mark.parametrize("objective", ["clm", "mlm", "span"])
def test_resume_continues_with_exactly_the_next_samples_after_a_split_change(data, objective):
    T_obj = 32
    reference = take(PackedLoader(data, "train", T_obj, 4, objective, seed=7), 5)  # 20 samples, one process
    first = PackedLoader(data, "train", T_obj, 4, objective, seed=7)
    take(first, 2)
    state = first.state_dict()
    assert state["samples_consumed"] == 8
    # resume on 2 ranks with micro-batch 2 (the same global batch of 4 per step, split differently)
    resumed = []
    for r in range(2):
        loader = PackedLoader(data, "train", T_obj, 2, objective, rank=r, world_size=2, seed=7)
        loader.load_state_dict(state)
        resumed.append(take(loader, 3))
    for step in range(3):
        for key in reference[0]:
            got = torch.cat([resumed[0][step][key], resumed[1][step][key]])
            assert torch.equal(got, reference[2 + step][key]), (objective, key, step)


def test_resume_refuses_another_data_order(data):
    state = PackedLoader(data, "train", T, B, seed=1).state_dict()
    with pytest.raises(Exception, match="seed=1 but this loader has 2"):
        PackedLoader(data, "train", T, B, seed=2).load_state_dict(state)
    with pytest.raises(Exception, match=r"(n_samples|window)=\d+ but this loader has \d+"):
        PackedLoader(data, "train", 2 * T, B, seed=1).load_state_dict(state)


def test_validation_is_finite_in_one_fixed_order_and_equal_across_ranks(data):
    tokens = stream(data, "val")
    val = PackedLoader(data, "val", T, 5)
    batches = list(val)
    assert len(batches) == len(val) == -(-val.n_samples // 5)
    got = torch.cat([b["input_ids"] for b in batches]).numpy()
    order = permute(np.arange(val.n_samples), val.n_samples, VAL_ORDER)
    want = np.stack([tokens[i * T : i * T + T] for i in order])
    assert np.array_equal(np.sort(order), np.arange(val.n_samples))  # every window once
    assert torch.equal(next(iter(PackedLoader(data, "val", T, 5, seed=7)))["input_ids"], batches[0]["input_ids"])
    assert np.array_equal(got, want)
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(batches, list(val)))  # same every pass
    ranks = [[b["input_ids"] for b in PackedLoader(data, "val", T, 5, rank=r, world_size=3)] for r in range(3)]
    assert len({len(r) for r in ranks}) == 1  # every rank runs the same number of forwards
    assert len({sum(len(b) for b in r) for r in ranks}) == 1 and sum(len(b) for b in ranks[0]) == val.n_samples // 3
    # micro-batch k of all ranks = micro-batch k of one process with 3x the batch: a pass cut after k
    # batches measures the same windows at any world size
    single = list(PackedLoader(data, "val", T, 15))
    for k, per_rank in enumerate(zip(*ranks)):
        assert torch.equal(torch.cat(per_rank), single[k]["input_ids"][: sum(len(b) for b in per_rank)])
    assert np.array_equal(torch.cat([torch.cat(k) for k in zip(*ranks)]).numpy(), want[: 3 * (val.n_samples // 3)])


def test_a_validation_pass_cut_short_samples_the_whole_split(data):
    # eval_batches cuts the pass: 4 micro-batches of 5 read 20 of the split's windows, which were its
    # first 20 (a corpus listed source by source validated on its first sources only)
    val = PackedLoader(data, "val", T, 5)
    starts = [int(np.flatnonzero((stream(data, "val")[: val.n_samples * T].reshape(-1, T) == w).all(1))[0]) for
              b in take(val, 4) for w in b["input_ids"].numpy()]  # fmt: skip
    assert val.n_samples == 139 and len(set(starts)) == 20
    assert 0.3 < np.mean(np.array(starts) >= val.n_samples / 2) < 0.7  # 10 of 20 from the second half (first 20: none)
    assert max(starts) > 0.8 * val.n_samples


@pytest.mark.parametrize("objective", ["mlm", "span"])
def test_validation_masks_are_the_same_for_every_seed(data, objective):
    """The val batches' masks (and spans) were keyed by the run's seed: two seeds of an ablation were validated on
    different masks, noise added to the seed-to-seed spread the report's Welch test reads."""

    def first(split, seed):
        return next(iter(PackedLoader(data, split, 64, 4, objective, seed=seed)))

    for key in ("input_ids", "labels"):
        assert torch.equal(first("val", 0)[key], first("val", 1)[key])
    assert not torch.equal(first("train", 0)["input_ids"], first("train", 1)["input_ids"])  # training's still differ


def test_mlm_masks_15_percent_80_10_10_never_specials(data):
    tok = Tokenizer.load(data)
    loader = PackedLoader(data, "train", 128, 16, "mlm", seed=0)
    it = iter(loader)
    n = chosen = masked = kept = 0
    for _ in range(10):
        positions = np.arange(loader.consumed, loader.consumed + 16)
        batch = next(it)
        orig = torch.stack(
            [
                torch.from_numpy(np.concatenate([stream(data, "train")[i * 128 : i * 128 + 128]]))
                for i in loader.sample_ids(positions)
            ]
        ).long()
        target = batch["labels"] != -100
        assert torch.equal(batch["labels"][target], orig[target])
        assert not torch.isin(orig[target], torch.tensor(tok.special_ids)).any()  # EOS etc. are never targets
        assert torch.equal(batch["input_ids"][~target], orig[~target])
        n += orig.numel()
        chosen += target.sum().item()
        masked += (batch["input_ids"][target] == tok.mask_id).sum().item()
        kept += (batch["input_ids"][target] == orig[target]).sum().item()
    assert 0.13 < chosen / n < 0.17
    assert 0.77 < masked / chosen < 0.83 and 0.08 < kept / chosen < 0.12 + 0.01  # 10% kept (+ rare random hits)


def test_electra_masks_85_percent_and_keeps_15_with_no_random_tokens(data):
    """ELECTRA's code masks 85% of the predicted positions and keeps 15%, with no random tokens (BERT's 10% would
    reach the generator's input); lm train gives the loader the model's mlm_corruption."""
    from types import SimpleNamespace

    from lm.cli.train import _packed_loaders
    from lm.core.config import TrainConfig
    from lm.data.config import DataConfig
    from lm.model.config import model_preset

    tok = Tokenizer.load(data)
    electra = model_preset("tiny", ["model.arch=encoder", "model/family=electra"])
    assert electra.mlm_corruption == (0.85, 0.0) and model_preset("tiny", ["model.arch=encoder"]).mlm_corruption == (
        0.8,
        0.1,
    )
    dist = SimpleNamespace(rank=0, world_size=1, is_main=True)
    train_cfg = TrainConfig(seq_len=128, micro_batch_size=16)
    loader = _packed_loaders(DataConfig(dir=str(data), source=None), train_cfg, dist, "mlm", 0, None, (0.85, 0.0))[0]
    bert = PackedLoader(data, "train", 128, 16, "mlm", seed=0)
    chosen = masked = 0
    for batch, same in zip(itertools.islice(loader, 10), itertools.islice(bert, 10)):
        target = batch["labels"] != -100
        assert torch.equal(target, same["labels"] != -100)  # the same positions are chosen, only what they get differs
        inputs, labels = batch["input_ids"][target], batch["labels"][target]
        assert torch.all((inputs == tok.mask_id) | (inputs == labels))  # [MASK] or the original: never random
        chosen, masked = chosen + target.sum().item(), masked + (inputs == tok.mask_id).sum().item()
    assert 0.82 < masked / chosen < 0.88


def test_lm_train_starts_span_targets_with_the_models_decoder_start_token(data):
    """lm train's span batches began with the tokenizer's pad id whatever model.decoder_start_token_id said, which
    generation, the eval harness and hf/'s config use: an override of it trained one start token and decoded another."""
    from types import SimpleNamespace

    from lm.cli.train import _packed_loaders
    from lm.core.config import TrainConfig
    from lm.data.config import DataConfig

    train_cfg = TrainConfig(seq_len=64, micro_batch_size=4)
    dist = SimpleNamespace(rank=0, world_size=1, is_main=True)
    for start in (5, 0):
        loaders = _packed_loaders(DataConfig(dir=str(data), source=None), train_cfg, dist, "span", 0, start)
        for loader in loaders[:2]:
            assert (next(iter(loader))["decoder_input_ids"][:, 0] == start).all()


def test_span_corruption_hides_spans_behind_sentinels_and_targets_restore_them(data):
    tok = Tokenizer.load(data)
    loader = PackedLoader(data, "train", 64, 8, "span", seed=0)
    raw, inp, tgt = t5_lengths(64, 0.15, 3.0)
    assert inp == 64 and loader.window == raw and raw > 64
    batch = next(iter(loader))
    assert batch["input_ids"].shape == (8, 64) and batch["labels"].shape == (8, tgt)
    assert torch.equal(batch["decoder_input_ids"][:, 1:], batch["labels"][:, :-1])
    assert (batch["decoder_input_ids"][:, 0] == tok.pad_id).all()
    tokens = stream(data, "train")
    sentinels = set(tok.sentinel_ids)
    for row, labels, i in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), loader.sample_ids(np.arange(8))):
        assert row[-1] == tok.eos_id and labels[-1] == tok.eos_id
        spans, current = {}, None
        for t in labels[:-1]:
            if t in sentinels:
                current = t
                spans[current] = []
            else:
                spans[current].append(t)
        restored = [t for s in row[:-1] for t in (spans[s] if s in sentinels else [s])]
        assert restored == tokens[i * raw : i * raw + raw].tolist()
        used = [t for t in row if t in sentinels]
        assert used == tok.sentinel_ids[: len(used)] and 0.1 < sum(map(len, spans.values())) / raw < 0.2


def test_span_corruption_input_never_exceeds_seq_len():
    # a window of seq_len tokens hid 1 token behind 1 sentinel and added EOS: 8 -> 9 encoder tokens
    assert t5_lengths(8, 0.15, 3.0) == (7, 8, 3) and t5_lengths(9, 0.15, 3.0) == (8, 9, 3)
    assert t5_lengths(10, 0.15, 3.0) == (10, 10, 4) and t5_lengths(128, 0.15, 3.0) == (141, 128, 29)
    for seq_len in range(3, 600):
        for density, mean in [(0.15, 3.0), (0.5, 3.0), (0.3, 1.0), (0.9, 8.0)]:
            assert t5_lengths(seq_len, density, mean)[1] <= seq_len, (seq_len, density, mean)
    collate = SpanCorruption(8, list(range(7, 27)), 2, 0)
    windows = np.arange(100, 100 + 2 * collate.window).reshape(2, -1)
    assert collate(windows, np.arange(2))["input_ids"].shape == (2, 8)
    with pytest.raises(Exception, match="seq_len >= 3"):
        t5_lengths(2, 0.15, 3.0)


def test_span_corruption_needs_enough_sentinels():
    with pytest.raises(Exception, match=r"needs \d+ sentinel tokens, the tokenizer has 2"):
        SpanCorruption(512, [7, 8], 2, 0)


@pytest.mark.parametrize("arch,objective", [("decoder", "clm"), ("encoder", "mlm"), ("encoder_decoder", "span")])
def test_batches_fit_the_model_contract(data, arch, objective):
    from lm.model import build_model
    from lm.model.config import ModelConfig

    loader = PackedLoader(data, "train", 32, 2, objective)
    model = build_model(
        ModelConfig(arch=arch, vocab_size=loader.vocab_size, dim=32, n_layers=1, n_heads=2, max_seq_len=64)
    )
    out = model(**next(iter(loader)))
    assert torch.isfinite(out.loss) and abs(out.loss.item() - np.log(loader.vocab_size)) < 1.5


def test_lm_train_hands_its_loaders_the_models_mlm_corruption(tmp_path, monkeypatch):
    """The test above gives _packed_loaders ELECTRA's masking by hand; this one checks that lm train passes the
    model's own (model/family=electra: 85/0; a plain encoder: BERT's 80/10)."""
    import lm.cli.train as lm_train
    from tests.engine_support import compose, tiny_overrides

    class Built(Exception):
        pass

    seen = []

    def record(data, train_cfg, dist, objective, seed, decoder_start_id=None, mlm_corruption=None):
        seen.append((objective, mlm_corruption))
        raise Built  # the loaders are all this test reads

    monkeypatch.setattr(lm_train, "_packed_loaders", record)
    for family in (["model/family=electra"], []):
        with pytest.raises(Built):
            lm_train.train(compose(tiny_overrides(tmp_path / "run") + ["model.arch=encoder", *family]))
    assert seen == [("mlm", (0.85, 0.0)), ("mlm", (0.8, 0.1))]


def test_the_electra_collapse_benchmark_masks_as_lm_train_does(data):
    """benchmarks/electra_collapse.py built its batches with BERT's 80/10/10 for ELECTRA's model, which lm train
    masks 85/0 (a tenth of the predicted positions held a random token there and never in a run)."""
    from omegaconf import OmegaConf

    from lm.model.config import model_preset
    from tests.benchmark_scripts import load

    tok, bench = Tokenizer.load(data), load("electra_collapse")
    for family, share in ((["model/family=electra"], 0.85), ([], 0.8)):
        model = OmegaConf.structured(model_preset("tiny", ["model.arch=encoder", *family]))
        batches = bench.windows(OmegaConf.create({"data": {"dir": str(data)}, "model": model}), 0)
        chosen = masked = randomised = 0
        for inputs, labels in itertools.islice(batches, 10):
            target = labels != -100
            got, original = inputs[target], labels[target]
            chosen, masked = chosen + target.sum().item(), masked + (got == tok.mask_id).sum().item()
            randomised += ((got != tok.mask_id) & (got != original)).sum().item()
        assert abs(masked / chosen - share) < 0.03, (family, masked / chosen)
        assert (randomised == 0) == bool(family), (family, randomised / chosen)
