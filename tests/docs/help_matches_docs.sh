#!/usr/bin/env bash
# Every command that `teraio --help` lists has a page in docs/ (README's command table names it)
# that documents every option its --help lists and says its exit statuses ("Exit status").
# Usage: help_matches_docs.sh BIN_DIR SOURCE_DIR
set -uo pipefail
bin=$1/teraio
src=$2
fail=0
declare -A page=(
  [analyze]=docs/analyze.md [plan]=docs/planner.md [synth]=docs/synth.md
  [simulate]=docs/simulator.md [iobench]=docs/storage.md [report]=docs/report.md
  [exact]=docs/exact.md [study]=docs/exact.md [train]=docs/train.md [clean]=docs/clean.md
  [transform]=docs/transform.md
)
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
commands=$("$bin" --help | sed -n '/^Subcommands:/,$p' | awk 'NR > 1 && NF {print $1}')
[[ -n $commands ]] || { echo "FAIL: teraio --help lists no commands"; exit 1; }
for cmd in $commands; do
  doc=${page[$cmd]:-}
  if [[ -z $doc ]]; then
    echo "FAIL: teraio $cmd has no page in this script's table (add it, and a docs/ page)"
    fail=1
    continue
  fi
  grep -qF -- "$doc" "$src/README.md" || { echo "FAIL: README's command table does not name $doc"; fail=1; }
  grep -q "Exit status" "$src/$doc" || { echo "FAIL: $doc does not say teraio $cmd's exit statuses"; fail=1; }
  case $cmd in
    study) check "study gap" "$doc"; check "study sensitivity" "$doc" ;;
    train) [[ -x $1/teraio-train ]] && check train "$doc" ;;  # teraio-train is built with PyTorch only
    *) check "$cmd" "$doc" ;;
  esac
done
if ((fail)); then exit 1; fi
echo "every command has a page; every --help option is documented"
