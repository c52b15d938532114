#!/usr/bin/env bash
# Coverage-guided fuzzing of smtp-once (cargo-fuzz / libFuzzer, fuzz/).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Default: 300 s for each of the targets in fuzz/fuzz_targets/. Installs
# cargo-fuzz if missing, builds, runs each target, and prints per target the
# executions, crashes (artifact files) and coverage. Exits non-zero when a
# target crashed: copy its artifact into tests/fuzz_regressions/<target>/ so
# `cargo test --test fuzz_regressions` replays it from then on.
#
# Stable toolchain: the address sanitizer needs nightly, so the targets are
# built with `-s none` (coverage instrumentation and libFuzzer work on
# stable; memory errors in unsafe code are not caught, panics and stack
# overflows are).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-300}
if ! [[ $seconds =~ ^[0-9]+$ ]] || [ "$seconds" -eq 0 ]; then
  echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]" >&2
  exit 2
fi
shift $(($# > 0 ? 1 : 0))

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "scripts/fuzz.sh: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi

all_targets=$(cd fuzz/fuzz_targets && ls -- *.rs | sed 's/\.rs$//')
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets <<<"$all_targets"
for t in "${targets[@]}"; do
  grep -qx -- "$t" <<<"$all_targets" || {
    echo "scripts/fuzz.sh: no target $t (have: $(echo $all_targets))" >&2
    exit 2
  }
done

build=(-s none)
echo "== building fuzz targets (cargo fuzz build ${build[*]})"
cargo fuzz build "${build[@]}"

logs=fuzz/target/fuzz-logs
mkdir -p "$logs"
summary=()
crashed=0
for t in "${targets[@]}"; do
  corpus=fuzz/corpus/$t
  artifacts=fuzz/artifacts/$t
  mkdir -p "$corpus" "$artifacts"
  before=$(ls -1 "$artifacts")
  args=(
    -max_total_time="$seconds"
    -print_final_stats=1
    -timeout=10
    -rss_limit_mb=2048
  )
  [ -f "fuzz/dict/$t.dict" ] && args+=(-dict="fuzz/dict/$t.dict")
  # MIME bombs need room (many parts, deep nesting); other inputs stay small.
  [ "$t" = fingerprint ] && args+=(-max_len=65536)
  echo "== fuzzing $t for ${seconds}s (log: $logs/$t.log)"
  status=0
  # The daemon parses on tokio workers, whose stacks are 2 MiB: give the
  # fuzzer's thread the same, so it finds what overflows there.
  (ulimit -s 2048 && exec cargo fuzz run "${build[@]}" "$t" "$corpus" -- "${args[@]}") \
    >"$logs/$t.log" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$logs/$t.log" | tail -1)
  cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$logs/$t.log" | tail -1 || true)
  # Coverage when the seeds were loaded: the growth shows instrumentation.
  cov0=$(grep -Eo 'INITED cov: [0-9]+' "$logs/$t.log" | head -1 | grep -Eo '[0-9]+$' || true)
  new=$(comm -13 <(echo "$before") <(ls -1 "$artifacts") | sed '/^$/d')
  crashes=$(printf '%s' "$new" | grep -c . || true)
  if [ "$status" -ne 0 ] && [ "$crashes" -eq 0 ]; then
    # Died without an artifact (build error, or a crash libFuzzer missed).
    crashes=1
    tail -20 "$logs/$t.log" >&2
  fi
  [ "$crashes" -eq 0 ] || crashed=1
  line=$(printf '%-12s execs %-10s crashes %-3s %s (seeds: cov %s)' \
    "$t" "${execs:-?}" "$crashes" "${cov:-cov: ?}" "${cov0:-?}")
  summary+=("$line")
  echo "$line"
  if [ -n "$new" ]; then
    sed "s|^|    artifact: $artifacts/|" <<<"$new"
    { grep -m1 -A1 'panicked at' "$logs/$t.log" || true
      grep -m1 -E 'deadly signal|timeout after|out-of-memory' "$logs/$t.log" || true; } |
      sed 's/^/    /'
  fi
done

echo
echo "== summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
if [ "$crashed" -ne 0 ]; then
  echo "crashes found: replay one with" \
    "'cargo fuzz run -s none <target> fuzz/artifacts/<target>/<file>';" \
    "then copy it to tests/fuzz_regressions/<target>/" >&2
  exit 1
fi
