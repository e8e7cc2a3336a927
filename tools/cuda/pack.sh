#!/usr/bin/env bash
# pack.sh: prepare the kit a run on the lent GPU machine carries (device
# tool, carry [".gpu"]): the shared kit's Go toolchain and env.sh
# (../shared/gpu) and the module's vendored dependencies as one xz archive,
# vendor.tar.xz (~8 MiB instead of ~50 MiB of files: the tokenizers' rank
# files and golang.org/x/sys would otherwise push what travels past the
# 64 MiB a call may carry). SPILL_GPU_DIR (default .gpu) names the folder,
# which git must ignore. On the GPU machine, source tools/cuda/gpuenv.sh
# (with SPILL_GPU_DIR set the same) instead of .gpu/env.sh.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
kit=${SPILL_GPU_KIT:-$root/../shared/gpu}
dir=${SPILL_GPU_DIR:-.gpu}
grep -qxF "/$dir/" .git/info/exclude 2>/dev/null || echo "/$dir/" >>.git/info/exclude
mkdir -p "$dir"
rm -rf "$dir/vendor" "$dir/vendor.tar.xz"
cmp -s "$kit/go-toolchain.tar.xz" "$dir/go-toolchain.tar.xz" 2>/dev/null || cp "$kit/go-toolchain.tar.xz" "$dir/"
cp "$kit/env.sh" "$dir/env.sh"
tmp=$(mktemp -d)
go mod vendor -o "$tmp/vendor"
[ -f "$tmp/vendor/modules.txt" ] || { echo "pack.sh: vendoring failed" >&2; exit 1; }
tar -C "$tmp" -cJf "$dir/vendor.tar.xz" vendor
rm -rf "$tmp"
echo "pack.sh: $dir/ holds $(du -sm "$dir" | cut -f1) MiB: the toolchain, env.sh and vendor.tar.xz ($(du -sm "$dir/vendor.tar.xz" | cut -f1) MiB)"
