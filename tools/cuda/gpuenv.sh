# gpuenv.sh: source on the GPU machine from the project's root after
# tools/cuda/pack.sh. It makes the carried kit ($SPILL_GPU_DIR, default
# .gpu) available as .gpu, unpacks its vendor.tar.xz once, and sources the
# shared kit's env.sh (Go toolchain, -mod=vendor, CUDA on PATH). Source
# tools/cuda/env.sh after it for a cuda build: that one also finds NCCL
# (SPILL_NCCL_LIBRARY, nccl.h) in PyTorch's wheel.
_kit=${SPILL_GPU_DIR:-.gpu}
if [ "$_kit" != .gpu ] && [ ! -e .gpu ]; then ln -s "$_kit" .gpu; fi
if [ -f .gpu/vendor.tar.xz ] && [ ! -d .gpu/vendor ]; then
  tar -C .gpu/ -xJf .gpu/vendor.tar.xz || return 1
fi
source .gpu/env.sh
