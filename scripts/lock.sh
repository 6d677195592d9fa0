#!/usr/bin/env bash
# Regenerates requirements/ci.lock (every version a fresh CPU machine installs for CI and the tests)
# from requirements/ci.in with pip-tools, in a throw-away venv. Run after changing setup.py's
# requirements or requirements/ci.in, then run `bash .ci/run` and commit both files.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${TOOLS:-/tmp/pacs_fast-pip-tools}
[ -x "$TOOLS/bin/pip-compile" ] || { python3 -m venv "$TOOLS" && "$TOOLS/bin/pip" install -q "pip==26.3" "pip-tools==7.6.2"; }
tmp=$(mktemp)
"$TOOLS/bin/pip-compile" --quiet --strip-extras --no-emit-index-url --no-emit-find-links \
    --output-file "$tmp" requirements/ci.in
# The project itself is installed editable by setup.sh; a constraints file cannot hold it.
python3 - "$tmp" requirements/ci.lock <<'PY'
import os, re, sys
lines = open(sys.argv[1]).read().splitlines()
out, skip = [], False
for line in lines:
    if line.startswith("-e "):
        skip = True
        continue
    if skip and line.startswith("    #"):
        continue
    skip = False
    out.append(re.sub(r"pip-compile .*", "bash scripts/lock.sh", line))
tmp = sys.argv[2] + ".tmp"
open(tmp, "w").write("\n".join(out) + "\n")
os.replace(tmp, sys.argv[2])
PY
rm -f "$tmp"
echo "wrote requirements/ci.lock ($(grep -c '==' requirements/ci.lock) pins)"
