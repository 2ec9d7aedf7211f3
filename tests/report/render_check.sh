#!/usr/bin/env bash
# Renders a `teraio report` page in headless Chromium: dumps the DOM Chromium built and checks that
# every chart's SVG is there with data (polyline points, bars, markers), that the page names no
# URL, and takes a full-page PNG screenshot to look at. Exit 77 (ctest SKIP) when chromium is absent.
# The checks run python3 from PATH (standard library only; under scripts/test.sh, the .venv's).
# Usage: render_check.sh TERAIO_BINARY OUT_DIR
set -euo pipefail
teraio=${1:?usage: render_check.sh TERAIO_BINARY OUT_DIR}
out=${2:?usage: render_check.sh TERAIO_BINARY OUT_DIR}
browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z "$browser" ]]; then
  echo "SKIP: chromium is not installed (apt-get install -y chromium)"
  exit 77
fi
command -v python3 >/dev/null || { echo "SKIP: python3 is not installed"; exit 77; }
mkdir -p "$out"
out=$(cd "$out" && pwd)

# A small synthetic iteration (two micro-batches), a plan at 60% of its peak, a measured run.
"$teraio" synth --model tiny --batch 2 --micro-batches 2 -o "$out/trace.json" >/dev/null
budget=$("$teraio" analyze --json "$out/trace.json" | python3 -c \
  'import json,sys; d=json.load(sys.stdin); print(max(2*d["active_max_bytes"], d["peak_bytes"]*6//10))')
"$teraio" plan "$out/trace.json" --budget "$budget" --tier ssd:1GiB:1:1 --tier host:1MiB:4:4 \
  --min-tensor 0 -o "$out/plan.json" >/dev/null
cat >"$out/run.json" <<'JSON'
{"format": "teraio.run", "version": 1, "iteration_us": 2000, "stall_us": 450, "peak_bytes": 1500000,
 "tiers": [{"name": "ssd", "offload_bytes": 9000000, "prefetch_bytes": 9100000}]}
JSON
"$teraio" report "$out/trace.json" --plan "$out/plan.json" --run "$out/run.json" --sweep-steps 4 \
  -o "$out/report.html" >/dev/null

if grep -qi 'http' "$out/report.html"; then
  echo "FAIL: the page names a URL:"; grep -oi '.\{40\}http.\{40\}' "$out/report.html" | head -3
  exit 1
fi

flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars
       --no-first-run --disable-extensions "--user-data-dir=$out/profile")
timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$out/report.html" >"$out/dom.html" 2>"$out/chromium.log"
timeout 120 "$browser" "${flags[@]}" --window-size=1200,4300 --screenshot="$out/report.png" \
  "file://$out/report.html" >>"$out/chromium.log" 2>&1

python3 - "$out/dom.html" "$out/report.png" <<'PY'
import re, sys
from html.parser import HTMLParser

class Charts(HTMLParser):
    """Counts, per chart <svg>, the marks that carry data."""
    def __init__(self):
        super().__init__()
        self.charts, self.current, self.depth = {}, None, 0
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg" and "chart" in (a.get("class") or "").split():
            self.current, self.depth = a.get("id"), 0
            self.charts[self.current] = {"declared": int(a.get("data-points", "0")), "marks": 0}
        elif self.current:
            if tag == "svg":
                self.depth += 1
            cls = (a.get("class") or "").split()
            if tag == "polyline" and len(re.findall(r"[-\d.]+,[-\d.]+", a.get("points", ""))) >= 2:
                self.charts[self.current]["marks"] += 1
            elif tag == "path" and "series" in cls and len(a.get("d", "")) > 10:
                self.charts[self.current]["marks"] += 1
            elif tag in ("rect", "circle") and ("bar" in cls or "point" in cls):
                self.charts[self.current]["marks"] += 1
    def handle_endtag(self, tag):
        if tag == "svg" and self.current:
            if self.depth == 0:
                self.current = None
            else:
                self.depth -= 1

dom = open(sys.argv[1], encoding="utf-8").read()
p = Charts()
p.feed(dom)
expected = ["chart-memory", "chart-periods", "chart-bandwidth", "chart-breakdown", "chart-roofline"]
bad = [c for c in expected if c not in p.charts or p.charts[c]["declared"] <= 0 or p.charts[c]["marks"] <= 0]
for c in expected:
    print(f"{c:16} {p.charts.get(c)}")
png = open(sys.argv[2], "rb").read()
if not png.startswith(b"\x89PNG") or len(png) < 20000:
    bad.append(f"screenshot {sys.argv[2]} ({len(png)} bytes)")
if "<table" not in dom or "summary-plan" not in dom:
    bad.append("summary table")
if bad:
    print("FAIL: no data in", ", ".join(bad)); sys.exit(1)
print(f"OK: {len(expected)} charts with data; screenshot {sys.argv[2]} ({len(png) // 1024} KiB)")
PY
