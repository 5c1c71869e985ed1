"""An LM_PLUGINS module for the elastic-resume tests: logs a digest of every training sample each global step
consumes, per rank, so a resumed run's token stream can be compared with an uninterrupted one's.

    LM_PLUGINS=tests/token_log.py LM_TOKEN_LOG=<dir> LM_TOKEN_SEGMENT=<k-th launch> lm train ...
    steps(<dir>)  ->  {step: sorted sample digests of all ranks}   (a step run by several launches: the
                                                                   latest one's, as after a kill)
"""

import hashlib
import json
import os
from collections import defaultdict
from pathlib import Path


def sample_digests(micro: list[dict]) -> list[str]:
    """One digest per sample row (its real input ids, and its labels) of a step's micro-batches; padding (GLUE
    batches are padded to their longest row, which depends on how a step is cut into micro-batches) is left out."""
    out = []
    for batch in micro:
        ids, labels = batch["input_ids"].cpu().numpy(), batch["labels"].cpu().numpy()
        real = batch["attention_mask"].cpu().numpy().astype(bool) if "attention_mask" in batch else ids >= -1
        out += [
            hashlib.sha1(i[m].tobytes() + b"|" + t.tobytes()).hexdigest()[:16] for i, m, t in zip(ids, real, labels)
        ]
    return out


def install(hooks) -> None:
    root = Path(os.environ["LM_TOKEN_LOG"])
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{int(os.environ.get('LM_TOKEN_SEGMENT', 0))}-rank{int(os.environ.get('RANK', 0))}.jsonl"

    def log(step: int, micro: list[dict]) -> None:
        with open(path, "a") as f:
            f.write(json.dumps({"step": step, "samples": sample_digests(micro)}) + "\n")

    hooks.step_batches.append(log)


def steps(root) -> dict[int, list[str]]:
    """{0-based step: the sorted digests of the samples every rank consumed in it}."""
    by_segment: dict[int, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in Path(root).glob("*.jsonl"):
        segment = int(path.name.split("-")[0])
        for line in path.read_text().splitlines():
            record = json.loads(line)
            by_segment[segment][record["step"]] += record["samples"]
    out: dict[int, list[str]] = {}
    for segment in sorted(by_segment):  # a later launch's steps replace an earlier one's
        out.update({s: sorted(v) for s, v in by_segment[segment].items()})
    return out
