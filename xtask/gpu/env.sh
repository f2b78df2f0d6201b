# Source on the GPU machine, in the repository root: CUDA libraries from the Python wheels,
# libnccl.so beside them (the wheel ships only libnccl.so.2), and the build machine's
# repository path, which the test binaries have compiled in, pointing here.
SP=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
mkdir -p /tmp/nccl && ln -sf "$SP/nvidia/nccl/lib/libnccl.so.2" /tmp/nccl/libnccl.so
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:$SP/nvidia/cudnn/lib:$SP/nvidia/nccl/lib:/tmp/nccl:${LD_LIBRARY_PATH:-}
root=$(cat gpu-carry/BUILD_ROOT)
[ -e "$root" ] || { mkdir -p "$(dirname "$root")" && ln -s "$PWD" "$root"; }
export PATH=$PWD/gpu-carry:$PATH
