"""GLUE (Wang et al. 2019): readers, label maps, metrics, pair encoding, submission and results files.

The package's public API; the code lives in one file per responsibility beside this one.

Registry (lm.glue.tasks)
    TASKS            {name: GlueTaskSpec}: cola sst2 mrpc stsb qqp mnli qnli rte wnli ax; each GlueTaskSpec has
                     .dir, .files (split -> file), .labels (leaderboard label strings, class-id order;
                     None for STS-B), .n_labels, .is_regression, .evals
    EVALS            {name: Eval}: the leaderboard columns cola sst2 mrpc stsb qqp mnli_m mnli_mm qnli
                     rte wnli ax, each with .dev/.test splits, .submission file stem, .metrics
    GLUE_TASKS       the nine tasks of the GLUE score (AX is not one)
    get_task, get_eval, scored_evals

Data (lm.glue.readers)
    load_split(task, split, root=None, hf=True) -> [Example(index, text_a, text_b, label)]
                     splits: train dev test; MNLI: train dev_matched dev_mismatched test_matched
                     test_mismatched; AX: test. label = class id, STS-B float, None on test.
                     root defaults to $LM_DATA_MIRROR/glue_data, else ./glue_data; with no local file
                     and hf=True, the Hugging Face copy (nyu-mll/glue) is tried.
    load_eval(column, "dev" | "test", root=None, hf=True)
    GlueDataError (malformed file: names file:line), GlueDataMissing (also a FileNotFoundError)

Metrics (lm.glue.metrics), in points (x100) like the leaderboard
    compute_metrics(column, preds, labels) -> {"mcc"|"acc"|"f1"|"pearson"|"spearman": ..., "score": ...}
                     preds: class ids, (N, C) logits, or STS-B scores (clipped to [0, 5])
    task_score(task, {column: metrics}), glue_score({column: metrics}, partial=False),
    main_metric(task, {column: metrics}, key="score")

Model inputs (lm.glue.encode)
    encode_pair(tokenizer, text_a, text_b, max_len, arch) -> {input_ids, attention_mask, token_type_ids}
                     encoder [CLS] a [SEP] b [SEP]; decoder / encoder_decoder [BOS] a [SEP] b [EOS];
                     longest-first truncation
    encode_examples(tokenizer, examples, max_len, arch) -> list of those, plus "labels"
    collate(features, pad_id) -> right-padded (B, T) long tensors; labels long, or float for STS-B

Files (lm.glue.submission, lm.glue.results), written atomically
    write_submission(column, preds, out_dir, indices=None) -> <out_dir>/<CoLA|...|AX>.tsv
    check_submission(out_dir) -> problems the leaderboard would reject
    write_results({column: {seed: metrics}}, out_dir) -> results.json, results.md

Config (lm.glue.config): GlueTaskConfig (conf/task/glue/*.yaml, composed under tasks.<name>), FinetuneSchema.
Training (lm.glue.trainer): GlueTask, the lm.core.task.TrainTask that lm.core.loop.run trains.
"""

from lm.glue.encode import collate, encode_examples, encode_pair, truncate_longest_first
from lm.glue.metrics import compute_metrics, glue_score, main_metric, task_score
from lm.glue.readers import Example, GlueDataError, GlueDataMissing, data_root, load_eval, load_split, split_path
from lm.glue.results import results_table, summarize, write_results
from lm.glue.submission import check_submission, write_submission
from lm.glue.tasks import EVALS, GLUE_TASKS, TASKS, Eval, GlueTaskSpec, get_eval, get_task, scored_evals

__all__ = [
    "TASKS",
    "EVALS",
    "GLUE_TASKS",
    "GlueTaskSpec",
    "Eval",
    "get_task",
    "get_eval",
    "scored_evals",
    "Example",
    "GlueDataError",
    "GlueDataMissing",
    "data_root",
    "split_path",
    "load_split",
    "load_eval",
    "compute_metrics",
    "task_score",
    "glue_score",
    "main_metric",
    "encode_pair",
    "encode_examples",
    "collate",
    "truncate_longest_first",
    "write_submission",
    "check_submission",
    "write_results",
    "summarize",
    "results_table",
]
