#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) for a fixed time on its seed
# corpus, and fails if any target finds a crash, a timeout or a leak.
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 20 s, all)
#
# Works on a stable toolchain: `-s none` leaves out the sanitizer flag,
# the one part of cargo-fuzz's build that needs nightly; coverage comes from
# stable `-C` flags and libFuzzer is built by libfuzzer-sys with the C++
# compiler. Needs cargo-fuzz (`cargo install --locked cargo-fuzz`).
set -euo pipefail
cd "$(dirname "$0")"

seconds=${1:-20}
shift || true
if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi

cargo fuzz build -s none

# New inputs go to a scratch corpus, so the committed seeds stay as they are.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
for target in "${targets[@]}"; do
  mkdir -p "$work/corpus/$target"
  log="$work/$target.log"
  start=$SECONDS
  if cargo fuzz run -s none "$target" "$work/corpus/$target" "corpus/$target" -- \
      -max_total_time="$seconds" -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
    echo "fuzz $target: ok, ${runs:-?} runs, ${rate:-?}/s, coverage ${cov:-?}, $((SECONDS - start)) s"
  else
    echo "fuzz $target: FAILED:"
    grep -A 4 -m 1 'panicked at\|ERROR: libFuzzer' "$log" || tail -n 40 "$log"
    grep 'Test unit written\|^Base64:' "$log" || true
    failed+=("$target")
  fi
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz: ${#failed[@]} of ${#targets[@]} targets failed: ${failed[*]}" \
    "(inputs in fuzz/artifacts/<target>/; replay with: cargo fuzz run -s none <target> <input>)"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${seconds} s each, no failure"
