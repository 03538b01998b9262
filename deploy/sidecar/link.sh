#!/usr/bin/env bash
# The sidecar's linker (rustc's `-C linker`, from build.sh): links as `cc`
# would, then links again with the functions listed in startup.symbols placed
# together at the front of .text (lld's --symbol-ordering-file). The kernel
# maps 64 KiB around each page of program text a process touches, so start-up
# code scattered through 7 MB of text kept most of it resident in an idle
# proxy (bench/RESULTS.md, issue 23).
#
# The list (recorded by record.sh) names symbols with their hashes, the
# start-up section first. A name whose hash no longer matches (a new
# compiler, a changed dependency) falls back to every instantiation of that
# path, so a stale list costs some memory, never the build. A linker other than lld (which rustc uses by
# default on this target) gets the first link only.
set -euo pipefail
export LC_ALL=C
here=$(cd "$(dirname "$0")" && pwd)
list=${BALLAST_STARTUP_SYMBOLS:-$here/startup.symbols}
cc "$@"

# The output file: after -o, in the arguments or in an @response file.
expanded=()
for a in "$@"; do
  if [[ $a == @* && -f ${a#@} ]]; then
    mapfile -t lines <"${a#@}"
    expanded+=("${lines[@]}")
  else
    expanded+=("$a")
  fi
done
out=
for ((i = 0; i + 1 < ${#expanded[@]}; i++)); do
  if [[ ${expanded[i]} == -o ]]; then out=${expanded[i + 1]}; fi
done
if [[ -z $out || ! -f $list ]] || ! readelf -p .comment "$out" 2>/dev/null | grep -q 'Linker: LLD'; then
  exit 0
fi

order=$(mktemp)
trap 'rm -f "$order" "$order".all' EXIT
nm --defined-only "$out" | awk 'NF == 3 { print $3 }' >"$order.all"
# In the list's order, section by section (a comment line starts one): a
# section's names found exactly, then the instantiations standing in for its
# stale ones, so the start-up section stays together whatever went stale.
awk -v OFS='\t' '
  function path(name) { sub(/17h[0-9a-f]+E$/, "", name); return name }
  FNR == NR { have[$1] = 1; k = path($1); every[k] = every[k] " " $1; next }
  /^#/ { section++; next }
  NF == 0 { next }
  ($1 in have) { print section, 0, FNR, $1; next }
  { n = split(every[path($1)], s, " "); for (i = 1; i <= n; i++) print section, 1, FNR, s[i] }
' "$order.all" "$list" | sort -n -s -k1,1 -k2,2 -k3,3 | awk '!seen[$4]++ { print $4 }' >"$order"
cc "$@" -Wl,--symbol-ordering-file="$order" -Wl,--no-warn-symbol-ordering
