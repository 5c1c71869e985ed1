#!/usr/bin/env bash
# Builds .gpu_data/, the data mirror that the GPU transfer run (experiment=glue_transfer_gpu, which reads
# data=gutenberg_shards_bpe) carries to the device, whose calls take 64 MiB of files in all: the five GLUE
# tasks' train/dev files, WikiText-2 raw valid/test, the TinyStories slice, Gutenberg's validation shard and
# the first N of its ten training shards (~7.7 MB, ~6.5M tokens each).
#   benchmarks/gpu_transfer_data.sh 5 [../shared/data]     # then: run(carry=[".gpu_data"], command=...)
# On the device: LM_DATA_MIRROR=.gpu_data lm transfer --preset glue_transfer_gpu --tokens 300000000 ...
set -euo pipefail
n="${1:?usage: gpu_transfer_data.sh N_SHARDS [MIRROR]}"
src="${2:-${LM_DATA_MIRROR:-../shared/data}}"
out=.gpu_data
rm -rf "$out.tmp" && mkdir -p "$out.tmp/text/gutenberg" "$out.tmp/text/wikitext-2-raw" "$out.tmp/text/tinystories"
for task in CoLA SST-2 MRPC STS-B RTE; do
  mkdir -p "$out.tmp/glue_data/$task"
  cp "$src/glue_data/$task/train.tsv" "$src/glue_data/$task/dev.tsv" "$out.tmp/glue_data/$task/"
done
cp "$src/text/wikitext-2-raw/wiki.valid.raw" "$src/text/wikitext-2-raw/wiki.test.raw" "$out.tmp/text/wikitext-2-raw/"
cp "$src"/text/tinystories/*.txt "$out.tmp/text/tinystories/"
cp "$src/text/gutenberg/validation-00000-of-00001.jsonl.zst" "$out.tmp/text/gutenberg/"
for i in $(seq 0 $((n - 1))); do
  cp "$src/text/gutenberg/train-$(printf %05d "$i")-of-00010.jsonl.zst" "$out.tmp/text/gutenberg/"
done
rm -rf "$out" && mv "$out.tmp" "$out"  # never a half-built mirror under the real name
du -sh "$out"
