#!/usr/bin/env bash
# The long fuzz run, outside CI: every fuzz test of tests/fuzz with PXVM_FUZZ_EXAMPLES
# cases (10,000 unless set), each case bounded by tests/fuzz/harness.py (1.5 GB of address
# space, 30 s), then a table of the figures saved in artifacts/fuzz/ (README, "Reliability").
# Usage: bash scripts/fuzz.sh [pytest arguments, e.g. -k gguf]
set -uo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" PXVM_FUZZ_EXAMPLES="${PXVM_FUZZ_EXAMPLES:-10000}"
rm -rf artifacts/fuzz
start=$(date +%s)
python3 -m pytest tests/fuzz -q -p no:cacheprovider "$@"
status=$?
echo "fuzz run: $(( $(date +%s) - start )) s, PXVM_FUZZ_EXAMPLES=$PXVM_FUZZ_EXAMPLES, pytest exit $status"
python3 - <<'PY'
import json
import pathlib

print("| input kind | cases | results | clear errors | crashes | hangs | slowest case | peak memory |")
print("|---|---|---|---|---|---|---|---|")
for path in sorted(pathlib.Path("artifacts/fuzz").glob("*.json")):
    s = json.loads(path.read_text())
    o = s["outcomes"]
    print(f"| {s['kind']} | {s['cases']:,} | {o['ok']:,} | {o['error']:,} | {o['crash']} | "
          f"{o['hang']} | {s['slowest_seconds']:.2f} s | {s['peak_rss_bytes'] / 2**20:.0f} MB |")
    for finding in s["findings"]:
        print("  finding:", finding.splitlines()[-1][:300])
PY
exit $status
