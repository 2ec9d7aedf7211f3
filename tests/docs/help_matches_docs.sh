#!/usr/bin/env bash
# Every option that `teraio CMD --help` lists is documented on CMD's page in docs/ (README's command
# table names the page). Usage: help_matches_docs.sh BIN_DIR SOURCE_DIR
set -uo pipefail
bin=$1/teraio
src=$2
fail=0
check() {  # $1: subcommand words, $2: doc page
  local help
  help=$("$bin" $1 --help 2>&1) || { echo "FAIL: teraio $1 --help exited non-zero"; fail=1; return; }
  for opt in $(printf '%s\n' "$help" | grep -oE '(^|[ ,])--[a-z][a-z0-9-]+' | sed 's/^[ ,]*//' | sort -u); do
    [[ "$opt" == "--help" ]] && continue
    if ! grep -qF -- "$opt" "$src/$2"; then
      echo "FAIL: teraio $1 $opt is not documented in $2"
      fail=1
    fi
  done
}
check analyze docs/analyze.md
check plan docs/planner.md
check synth docs/synth.md
check simulate docs/simulator.md
check iobench docs/storage.md
check report docs/report.md
check exact docs/exact.md
check "study gap" docs/exact.md
check "study sensitivity" docs/exact.md
if ((fail)); then exit 1; fi
echo "every --help option is documented"
