#!/usr/bin/env bash
# Runs every libFuzzer target for $FUZZ_SECONDS seconds (default 60), starting from the committed
# seed corpus. New interesting inputs go to BUILD/corpus/<target>/ (not committed); a crash leaves
# its input in BUILD/crashes/<target>/ and fails the run — copy it to fuzz/regressions/<target>/
# once fixed, where ctest replays it forever. Per-target totals go to BUILD/fuzz-stats.txt.
# Usage: fuzz/run.sh BUILD_DIR   (from `make fuzz`)
set -euo pipefail
build="$1"
seconds="${FUZZ_SECONDS:-60}"
src="$(cd "$(dirname "$0")" && pwd)"
stats="$build/fuzz-stats.txt"
: > "$stats"
status=0
for t in npy_fuzz cli_args_fuzz attention_fuzz; do
  mkdir -p "$build/corpus/$t" "$build/crashes/$t"
  log="$build/$t.log"
  echo "fuzzing $t for ${seconds}s" >&2
  args=(-max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 -max_len=8192
        -artifact_prefix="$build/crashes/$t/" "$build/corpus/$t" "$src/corpus/$t")
  [[ -d "$src/regressions/$t" ]] && args+=("$src/regressions/$t")
  if ! "$build/bin/$t" "${args[@]}" > "$log" 2>&1; then
    echo "$t: FAILED, see $log and $build/crashes/$t/" >&2
    tail -n 30 "$log" >&2
    status=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  corpus=$(find "$build/corpus/$t" -type f | wc -l)
  echo "$t seconds=$seconds executions=${runs:-?} coverage_edges=${cov:-?} new_corpus_inputs=$corpus" | tee -a "$stats"
done
exit $status
