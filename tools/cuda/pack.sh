#!/usr/bin/env bash
# pack.sh: prepare .gpu/ for a run on the lent GPU machine (device tool,
# carry [".gpu"]): the shared kit's Go toolchain and env.sh
# (../shared/gpu/pack), then the vendored modules. The shared script's own
# vendoring step never runs (under pipefail its `go list | grep -q` check
# fails when grep exits early), so this script vendors itself and checks
# that vendor/modules.txt is there.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
kit=${SPILL_GPU_KIT:-$root/../shared/gpu/pack}
"$kit"
rm -rf .gpu/vendor
go mod vendor -o .gpu/vendor
[ -f .gpu/vendor/modules.txt ] || { echo "pack.sh: vendoring failed" >&2; exit 1; }
echo "pack.sh: .gpu/ holds $(du -sm .gpu | cut -f1) MiB with vendor/ ($(grep -c '^# ' .gpu/vendor/modules.txt) modules)"
