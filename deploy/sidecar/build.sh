#!/usr/bin/env bash
# Builds the sidecar binary as the images carry it, target/sidecar/ballast-proxy:
# the `sidecar` profile (release without unwinding: a panic ends the process,
# whose supervisor restarts it), linked statically (no shared libraries to
# map), with relative relocations packed (RELR: start-up reads 3 KB of
# relocations instead of 200 KB), and the functions it runs at start and on
# its request paths placed together (link.sh): an idle sidecar's memory is
# mostly the program text it has touched (bench/RESULTS.md).
# Extra arguments go to rustc.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec cargo rustc --profile sidecar -p ballast-sidecar --bin ballast-proxy -- \
  -C target-feature=+crt-static -C link-arg=-Wl,-z,pack-relative-relocs \
  -C linker="$PWD/deploy/sidecar/link.sh" -C linker-flavor=gcc "$@"
