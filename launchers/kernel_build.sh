#!/usr/bin/env bash
# Build a GPU attention library's wheel on this machine (no GPU needed) for lcab's GPU image:
# Python 3.12, torch 2.11.0+cu130, nvcc 13.0, sm_90a (H100 / H200). What a lent GPU's minutes
# cannot pay — tens of minutes of nvcc — is paid here, once; the wheel is cached and travels.
#
#   bash launchers/wheelhouse.sh build NAME [--src DIR] [--jobs N] [--force]
#   bash launchers/kernel_build.sh NAME ...        (the same; wheelhouse.sh calls this)
#   bash launchers/kernel_build.sh toolchain       (only the build venv)
#   bash launchers/kernel_build.sh list            (the recipes: pins, flags, restrictions)
#   bash launchers/kernel_build.sh schemas NAME    (record the cached wheel's real operator
#                                                   schemas into tests/unit/data/real_schemas/)
#   bash launchers/kernel_build.sh check NAME WHEEL  (hold any wheel to recipe NAME's checks)
#
# NAME is one of the recipes below (fa3 first). Each builds only what lcab sweeps — bf16, head
# dims 64 and 128, forward and backward, varlen, local windows, GQA — from the library's own
# setup script with its own switches; every restriction is printed and recorded. Only the
# recipe's switches reach the build: the libraries' variables in the environment
# (FLASH_ATTENTION_*, FLASH_MASK_*, MAGI_ATTENTION_*, BLOCK_SPARSE_ATTN_*, any *_SKIP_CUDA_BUILD,
# NVCC_APPEND_FLAGS, ...) are cleared and named. A failed build caches nothing, and every wheel
# is checked before it is cached (launchers/wheel_check.py: a compiled extension inside, the
# device code of the recipe's architectures, NEEDED libraries that torch's wheels provide, an
# import in the toolchain with the build-only packages hidden and its real schemas compared);
# a refused wheel is set aside in wheels/NAME/KEY/refused/.
#
# Sources: a repository at the recipe's pinned commit, with its submodules (CUTLASS) at the
# commits the repository pins. On a machine that reaches GitHub the script clones them into
# the cache; elsewhere `--src DIR` names a checkout brought in (its commit is read with git and
# compared with the pin). A recipe with a PyPI sdist (fa2) needs neither.
#
# The toolchain is a venv of its own (never .venv): Python 3.12 (LCAB_BUILD_PYTHON, else
# python3.12 on PATH, else a pyenv 3.12), torch 2.11.0's CUDA wheel with its CUDA libraries (so
# the built extension can also be imported here, on the CPU, for its real op schemas), and
# nvcc 13.0 from NVIDIA's PyPI wheels (CUDA_HOME = the venv's nvidia/cu13).
#
# Cache (LCAB_CACHE, default ~/.cache/lcab): build/toolchain-*/ (the venv), build/src/ (clones),
# build/work/NAME-KEY/ (the build folder: a rerun resumes where ninja stopped),
# wheels/NAME/KEY/ (the wheel and build.json: commits, flags, restrictions, toolchain, the
# measured wall time, peak memory of the whole process tree and wheel size, and the checks'
# findings; the wheel is not byte-reproducible: a rebuild has another sha256). KEY hashes the
# sources' content, the flags and the toolchain, so a changed input builds anew. `wheelhouse.sh
# make` packs every cached wheel into the parts it carries (LCAB_WHEEL_BUILT picks names).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo_root=$(pwd)

CACHE=${LCAB_CACHE:-$HOME/.cache/lcab}
TORCH_BUILD=2.11.0+cu130 TORCH_CUDA=13.0 # the GPU image's torch, as its torch/version.py says
TORCH_PIN=torch==${TORCH_BUILD%+*}        # PyPI's 2.11.0 is the cu130 build (checked: a +cpu fits too)
# nvcc 13.0 as the GPU image has it (release 13.0, V13.0.88), from NVIDIA's PyPI wheels
NVCC_PINS=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
  nvidia-cuda-cccl==13.0.85)
# cuobjdump lists a built wheel's device code (PyPI's oldest is 13.2; it reads 13.0's cubins)
CHECK_PINS=(nvidia-cuda-cuobjdump==13.2.86)
# what the libraries' setup scripts import (setuptools as torch 2.11 pins it, <82), and what
# the tests that load a built wheel here need of lcab's (tests/unit/test_real_wheels.py); all
# of them are in a CUDA image with torch too, so a library that imports one at run time
# imports it there
BUILD_PINS=(setuptools==81.0.0 wheel==0.45.1 ninja==1.13.2 packaging==26.4 psutil==7.2.2
  einops==0.8.2 pybind11==3.1.0 numpy==2.3.5 typing_extensions==4.15.0 pytest==9.2.0)
# needed by a build only and absent from the image: the wheel check imports a library with
# these hidden (MagiAttention's setup reads its version with versioningit)
BUILD_ONLY_PINS=(versioningit==3.3.0)
TOOLCHAIN=$CACHE/build/toolchain-py312-torch2.11.0-cu130

die() {
  echo "kernel_build: $*" >&2
  exit 2
}
say() { echo "kernel_build: $*" >&2; }

# ---------------------------------------------------------------------------- recipes
# A recipe sets: REPO (owner/name), PIN (commit), SUBMODULES ("path=commit" each), SETUP_DIR
# (where its setup script is, relative to the checkout), SETUP (the script), NEEDS (paths the
# build reads, copied into the build folder), ENV (VAR=value each), RESTRICTIONS (one line
# each), ABI ("abi3": loads on any Python >= 3.9, or "cp312"), DIST (the wheel's name),
# SDIST (a PyPI requirement to build from instead of a repository), PATCHES ("FILE|SED|why"
# each), SASS and PTX (the architectures its device code is promised in: launchers/
# wheel_check.py refuses a wheel without them), IMPORTS (modules the check imports besides
# those tests/helpers/real_schemas.py's SPECS names for it).
recipe() {
  REPO="" PIN="" SUBMODULES=() SETUP_DIR="" SETUP=setup.py NEEDS=() ENV=() RESTRICTIONS=()
  ABI="" DIST="" SDIST="" PATCHES=() SASS=() PTX=() IMPORTS=()
  case $1 in
    fa3)
      REPO=Dao-AILab/flash-attention
      PIN=0251105a2fb19d2957484b7f023cd8c115286ced # 2026-08-15, the hopper/ lcab's rows read
      SUBMODULES=(csrc/cutlass=7127592069c2fe01b041e174ba4345ef9b279671) # v4.3.0-48
      SETUP_DIR=hopper NEEDS=(hopper README.md csrc/cutlass/include)
      ABI=abi3 DIST=flash_attn_3 SASS=(sm_90a)
      ENV=(FLASH_ATTENTION_FORCE_BUILD=TRUE # offline: its wheel download catches HTTPError only
        FLASH_ATTENTION_DISABLE_SM80=TRUE FLASH_ATTENTION_DISABLE_FP16=TRUE
        FLASH_ATTENTION_DISABLE_FP8=TRUE FLASH_ATTENTION_DISABLE_HDIM96=TRUE
        FLASH_ATTENTION_DISABLE_HDIM192=TRUE FLASH_ATTENTION_DISABLE_HDIM256=TRUE
        FLASH_ATTENTION_DISABLE_HDIMDIFF64=TRUE FLASH_ATTENTION_DISABLE_HDIMDIFF192=TRUE
        FLASH_ATTENTION_DISABLE_SPLIT=TRUE FLASH_ATTENTION_DISABLE_PAGEDKV=TRUE
        FLASH_ATTENTION_DISABLE_APPENDKV=TRUE FLASH_ATTENTION_DISABLE_SOFTCAP=TRUE
        FLASH_ATTENTION_DISABLE_PACKGQA=TRUE)
      RESTRICTIONS=("sm_90a only (H100/H200): no sm80 kernels"
        "bf16 only: fp16 and fp8 off"
        "head dims 64 and 128 (q and v alike): 96, 192, 256 and the mixed (64,256/512), (192,128) off"
        "no split-KV (num_splits must be 1), no paged KV, no append-KV, no softcap"
        "no PackGQA: GQA runs without packing query heads (the heuristic's choice is off; same numbers, possibly slower for decoding shapes lcab does not sweep)"
        "kept: forward and backward, varlen, causal and local windows, thread-block clusters (FA3's hdim-128 non-causal path)")
      ;;
    flashmask)
      REPO=PaddlePaddle/flash-attention
      PIN=9985af538d20bd7a56c7a5f5ea13294d454a011a # 2026-08-17, the torch build lcab's rows read
      local v3=flashmask/flash_mask/flashmask_attention_v3
      SUBMODULES=("$v3/cutlass=afa1772203677c5118fcd82537a9c8fefbcc7008") # CUTLASS v3.8.0
      SETUP_DIR=$v3 SETUP=setup_torch.py NEEDS=("$v3") ABI=abi3 DIST=flashmask
      SASS=(sm_90a)
      ENV=(FLASH_MASK_V3_FORCE_BUILD=TRUE # offline: its wheel download catches HTTPError only
        FLASH_MASK_V3_OFFLINE_BUILD=1 FLASH_MASK_V3_DISABLE_APPENDKV=TRUE
        FLASH_MASK_V3_DISABLE_HDIMDIFF192=TRUE)
      PATCHES=("setup_torch.py|s/^DISABLE_HDIM256 = False.*/DISABLE_HDIM256 = True/|its \
setup_torch.py sets the head-dim switches in code (L362-378, over the environment's); head dim \
256 is switched off there")
      RESTRICTIONS=("sm_90a only; bf16 only; no split-KV, paged KV, softcap or PackGQA (all \
switched off in setup_torch.py itself, L362-378, whatever the environment says)"
        "head dims 64 and 128: 256 patched off in setup_torch.py (no switch reaches it)"
        "no append-KV, no (192,128) head dims"
        "kept: forward and backward (causal and deterministic variants), varlen, local windows"
        "abi3 in its tag only: its C++ calls torch's unstable C++ ABI, so it loads with torch \
2.11.0 alone (build.json's checks.torch_abi counts the calls)")
      ;;
    ffa)
      REPO=SandAI-org/MagiAttention
      PIN=d7ea8afd44c790b65fab68a04a6a0fdd5adbf182 # v1.1.1
      SUBMODULES=(magi_attention/csrc/cutlass=81a43e6d92cdd8c20d22392f9579604ed5f710a1)
      NEEDS=(setup.py pyproject.toml README.md MANIFEST.in magi_attention) ABI=cp312
      DIST=magi_attention SASS=(sm_90a sm_90) PTX=(sm_90) # FFA's modules; magi_attn_ext's
      # CMake architecture "90" (SASS and PTX)
      ENV=(MAGI_ATTENTION_BUILD_COMPUTE_CAPABILITY=90 # no GPU to ask
        MAGI_ATTENTION_SKIP_MAGI_ATTN_COMM_BUILD=1 MAGI_ATTENTION_PREBUILD_FFA=1)
      local ext=magi_attention/csrc/extensions/CMakeLists.txt
      PATCHES=("setup.py|/(torch.float16, torch.float\(16\|32\)),/d|its prebuild list \
(setup.py L691-696) has no switch: the fp16 rows are deleted"
        "$ext|s/^    Python3::Python$/    Python3::Module/|magi_attn_ext is a Python module but \
linked Python3::Python (CMakeLists.txt L100), so it NEEDED libpython3.12.so, which a Python built \
without a shared library (the GPU image's may be) lacks; Python3::Module links none, as \
extensions do"
        "magi_attention/utils/debug.py|s/^import debugpy$//;s/^        if rank in debug_ranks:$/&\n\
            import debugpy/|its utils import debugpy at the top (debug.py L17), which the GPU image \
lacks, for a remote debugger that only MAGI_ATTENTION_ENABLE_REMOTE_DEBUG starts: imported there")
      RESTRICTIONS=("sm_90a only (FFA is Hopper-only: check_cuda_compute_capability asserts 9.0)"
        "prebuilt FFA kernels: forward and backward, head dims 64 and 128, bf16 computing into bf16 or fp32, atomic reduction on and off (16 modules; fp16 deleted from setup.py's prebuild list); any other variant (deterministic, softcap, another head dim) is JIT-compiled on first call and needs nvcc 13 on the GPU machine"
        "no magi_attn_comm (NVSHMEM group collectives): kernel-only, lcab's CP is its own"
        "patched to import on the GPU image: magi_attn_ext links no libpython3.12.so, and debugpy \
is imported only when MAGI_ATTENTION_ENABLE_REMOTE_DEBUG asks for the remote debugger")
      ;;
    bsa)
      REPO=mit-han-lab/Block-Sparse-Attention
      PIN=49d6c39e4dc0303442cda3bb758b3925d4399c49 # 2026-01-17
      SUBMODULES=(csrc/cutlass=a75b4ac483166189a45290783cb0a18af5ff0ea5) # CUTLASS v3.3.0
      NEEDS=(setup.py README.md block_sparse_attn csrc/block_sparse_attn csrc/cutlass/include)
      ABI=cp312 DIST=block_sparse_attn SASS=(sm_90) PTX=(sm_90) # setup.py L122-126: PTX of
      # the newest architecture asked for
      ENV=(BLOCK_SPARSE_ATTN_FORCE_BUILD=TRUE BLOCK_SPARSE_ATTN_CUDA_ARCHS=90)
      local switch=csrc/block_sparse_attn/src/static_switch.h api=csrc/block_sparse_attn/flash_api.cpp
      PATCHES=("setup.py|/_block_hdim32_/d;/_block_hdim[0-9]*_fp16_/d|setup.py lists every head \
dim and dtype with no switch: its hdim-32 and fp16 kernel files are deleted from the sources"
        "$switch|s/using elem_type = cutlass::half_t;/using elem_type = cutlass::bfloat16_t;/|the \
dtype switch names only bf16 kernels (fp16 is refused before it, below)"
        "$switch|s/constexpr static int kHeadDim = 32;/constexpr static int kHeadDim = 64;/|head \
dims up to 32 run the 64 kernel (the kernels predicate a head dim below their tile's)"
        "$api|s/q_dtype == torch::kFloat16 || q_dtype == torch::kBFloat16/q_dtype == torch::kBFloat16/|\
fp16 inputs are refused: this build has bf16 kernels only"
        "$api|s/round_multiple(head_size, head_size <= 128 ? 32 : 64)/round_multiple(head_size, 64)/|\
the rounded head dim is the kernel's (a head dim of 32 runs the 64 kernel)"
        "$api|s/head_size <= 256, \"BlockSparseAttention \([a-z]*\) only supports head dimension at most 256\"/head_size <= 128, \"BlockSparseAttention \1 only supports head dimension at most 128\"/|\
head dims above 128 are refused: the head-dim switch has no kernel for them (upstream then runs \
none, silently)")
      RESTRICTIONS=("sm_90 (FA2-class kernels: no wgmma) plus sm_90 PTX; bf16 only (fp16 \
refused by a patched check); head dims 64 and 128 (up to 32 runs the 64 kernel; above 128 \
refused, where upstream silently ran no kernel)"
        "kept: forward and backward block-sparse kernels, causal and not, 128x128 tiles, \
streaming heads, GQA")
      ;;
    fa2)
      SDIST=flash-attn==2.8.3.post2 # its csrc/ carries CUTLASS (4.0, dc48179)
      REPO=Dao-AILab/flash-attention NEEDS=(setup.py README.md flash_attn csrc/flash_attn \
        csrc/cutlass/include)
      ABI=cp312 DIST=flash_attn SASS=(sm_90) # setup.py L184-185: code=sm_90, no PTX
      ENV=(FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=90)
      local switch=csrc/flash_attn/src/static_switch.h api=csrc/flash_attn/flash_api.cpp
      local off='"-DFLASHATTENTION_DISABLE_DROPOUT", "-DFLASHATTENTION_DISABLE_ALIBI", "-DFLASHATTENTION_DISABLE_SOFTCAP"'
      PATCHES=("setup.py|/_hdim32_/d;/_hdim96_/d;/_hdim192_/d;/_hdim256_/d;/_fp16_/d|setup.py \
lists every head dim and dtype with no switch: all but the hdim-64/128 bf16 files are deleted"
        "setup.py|s/# \"-DFLASHATTENTION_DISABLE_\(DROPOUT\|ALIBI\|SOFTCAP\)\"/\"-DFLASHATTENTION_DISABLE_\1\"/|\
dropout, ALiBi and softcap compiled out of the kernels (its own switches, commented out in setup.py)"
        "setup.py|s/\"cxx\": compiler_c17_flag,/\"cxx\": compiler_c17_flag + [$off],/|and \
out of flash_api.cpp, which checks the same macros"
        "$switch|s/using elem_type = cutlass::half_t;/using elem_type = cutlass::bfloat16_t;/|the \
dtype switch names only bf16 kernels (fp16 is refused before it, below)"
        "$switch|s/kHeadDim = \(32\|96\|192\|256\);/kHeadDim = \1 <= 64 ? 64 : 128;/|head \
dims up to 64 run the 64 kernel, the rest the 128 one (more than 128 is refused, below)"
        "$api|s/q_dtype == torch::kFloat16 || q_dtype == torch::kBFloat16/q_dtype == torch::kBFloat16/|\
fp16 inputs are refused: this build has bf16 kernels only"
        "$api|s/head_size <= 256, \"FlashAttention \([a-z]*\) only supports head dimension at most 256\"/head_size <= 128, \"FlashAttention \1 only supports head dimension at most 128 in this build\"/|\
head dims above 128 are refused: this build has no such kernels"
        "$api|s/round_multiple(head_size, head_size <= 128 ? 32 : 64)/round_multiple(head_size, 64)/|\
the rounded head dim is the kernel's (up to 64 runs the 64 kernel, up to 128 the 128 one)")
      RESTRICTIONS=("sm_90 SASS only, no PTX (FA2's kernels: no wgmma); bf16 only (fp16 refused \
by a patched check); head dims 64 and 128 (up to 64 runs the 64 kernel, up to 128 the 128 one, \
more is refused)"
        "no dropout, ALiBi or softcap (compiled out with FA2's own FLASHATTENTION_DISABLE_*)"
        "kept: forward, backward and split-KV forward, causal and not, varlen, local windows, \
uneven head dims, GQA")
      ;;
    *) die "unknown kernel '$1' (valid: $(recipes))" ;;
  esac
}
recipes() { echo fa3 flashmask ffa bsa fa2; }

# ---------------------------------------------------------------------------- toolchain
find_python312() {
  local candidate
  for candidate in "${LCAB_BUILD_PYTHON:-}" "$(command -v python3.12 || true)" \
    "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    [ -n "$candidate" ] && [ -x "$candidate" ] || continue
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

toolchain() {
  local py stamp=$TOOLCHAIN/.lcab-toolchain want
  want=$(printf '%s\n' "$TORCH_PIN" "${NVCC_PINS[@]}" "${CHECK_PINS[@]}" "${BUILD_PINS[@]}" \
    "${BUILD_ONLY_PINS[@]}" | sha256sum | cut -c1-16)
  if [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ]; then
    toolchain_torch
    return 0
  fi
  py=$(find_python312) || die "no Python 3.12 found (the GPU image's): set LCAB_BUILD_PYTHON \
to a CPython 3.12 (tried python3.12 on PATH and ~/.pyenv/versions/3.12*)"
  say "toolchain: $TOOLCHAIN ($("$py" -V), $TORCH_PIN with its CUDA libraries, nvcc 13.0.88)"
  rm -rf "$TOOLCHAIN"
  "$py" -m venv "$TOOLCHAIN"
  "$TOOLCHAIN/bin/python" -m pip install -q --disable-pip-version-check \
    "$TORCH_PIN" "${NVCC_PINS[@]}" "${CHECK_PINS[@]}" "${BUILD_PINS[@]}" "${BUILD_ONLY_PINS[@]}" \
    2>&1 | { grep -v "^WARNING: Location" >&2 || true; }
  local cuda
  cuda=$(cuda_home)
  # torch's extension builder links -L$CUDA_HOME/lib64 -lcudart: the wheels ship lib/ and only
  # the versioned libcudart.so.13
  ln -sfn lib "$cuda/lib64"
  ln -sfn libcudart.so.13 "$cuda/lib/libcudart.so"
  ln -sfn libnvrtc.so.13 "$cuda/lib/libnvrtc.so" # MagiAttention's CMake looks for it
  "$cuda/bin/nvcc" --version | grep -q 'release 13.0' || die "nvcc in $cuda is not 13.0"
  toolchain_torch
  echo "$want" >"$stamp"
}

toolchain_torch() {  # the toolchain's torch is the image's build, or die (read, not imported)
  local version_py found cuda
  version_py=$(echo "$TOOLCHAIN"/lib/python3.12/site-packages/torch/version.py)
  found=$(sed -n "s/^__version__.* = '\(.*\)'.*/\1/p" "$version_py" 2>/dev/null || true)
  cuda=$(sed -n "s/^cuda.* = '\(.*\)'.*/\1/p" "$version_py" 2>/dev/null || true)
  [ "$found" = "$TORCH_BUILD" ] && [ "$cuda" = "$TORCH_CUDA" ] && return 0
  rm -f "$TOOLCHAIN/.lcab-toolchain"  # the next run installs it anew
  die "the toolchain's torch is '${found:-none}' (CUDA '${cuda:-none}'), not $TORCH_BUILD \
(CUDA $TORCH_CUDA): an index or find-links served another build for $TORCH_PIN (see \
PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS, pip config list); a wheel built on it would \
not load on the GPU image"
}

cuda_home() {
  "$TOOLCHAIN/bin/python" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))'
}

# ---------------------------------------------------------------------------- sources
commit_of() {  # the commit of a checkout (a sdist's: what fetch_source wrote of it)
  cat "$1/.lcab-source" 2>/dev/null || git -C "$1" rev-parse HEAD 2>/dev/null || echo unknown
}

fetch_sdist() {  # fetch_sdist NAME: the recipe's PyPI sdist, unpacked (its setup imports torch)
  local dest=$CACHE/build/src/$1-${SDIST//[^A-Za-z0-9.]/_} scratch tarball
  if [ ! -e "$dest/.lcab-source" ]; then
    scratch=$(mktemp -d)
    say "downloading the $SDIST sdist from PyPI"
    FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE "$TOOLCHAIN/bin/python" -m pip download -q \
      --disable-pip-version-check --no-deps --no-binary :all: --no-build-isolation \
      "$SDIST" -d "$scratch" 2>&1 | { grep -v "^WARNING: Location" >&2 || true; }
    tarball=$(ls "$scratch"/*.tar.gz)
    rm -rf "$dest" && mkdir -p "$dest"
    tar -C "$dest" --strip-components=1 -xzf "$tarball"
    echo "sdist $(basename "$tarball") sha256:$(sha256sum <"$tarball" | cut -c1-64)" \
      >"$dest/.lcab-source"
    rm -rf "$scratch"
  fi
  echo "$dest"
}

fetch_source() {  # fetch_source NAME: a checkout at the pin with its submodules, or die
  [ -z "$SDIST" ] || { fetch_sdist "$1"; return; }
  local dest=$CACHE/build/src/$1-${PIN:0:12} path commit
  if [ ! -e "$dest/.lcab-complete" ]; then
    say "cloning https://github.com/$REPO at ${PIN:0:12} into $dest"
    rm -rf "$dest"
    if ! timeout 600 git clone -q --no-checkout "https://github.com/$REPO" "$dest" 2>&1 ||
      ! git -C "$dest" checkout -q "$PIN"; then
      rm -rf "$dest"
      die "could not clone https://github.com/$REPO (no access to GitHub?): bring a checkout \
of $REPO at $PIN with ${SUBMODULES[*]:-no submodules} and pass --src DIR"
    fi
    for entry in "${SUBMODULES[@]}"; do
      path=${entry%%=*} commit=${entry#*=}
      git -C "$dest" submodule update --init -q "$path" ||
        die "could not fetch submodule $path of $REPO: pass --src DIR with it checked out"
      [ "$(commit_of "$dest/$path")" = "$commit" ] || die "submodule $path is not at $commit"
    done
    touch "$dest/.lcab-complete"
  fi
  echo "$dest"
}

check_source() {  # check_source DIR: has what the build reads; commits compared with the pins
  local dir=$1 path entry commit found
  for path in "${NEEDS[@]}"; do
    [ -e "$dir/$path" ] || die "--src $dir has no $path (a checkout of $REPO at $PIN with \
${SUBMODULES[*]:-no submodules} is expected)"
  done
  found=$(commit_of "$dir")
  [ -z "$PIN" ] || [ "$found" = "$PIN" ] || say "warning: $dir is at $found, not the pinned $PIN"
  for entry in "${SUBMODULES[@]}"; do
    path=${entry%%=*} commit=${entry#*=}
    found=$(commit_of "$dir/$path")
    [ "$found" = "$commit" ] || say "warning: $dir/$path is at $found, not the pinned $commit"
  done
}

content_hash() {  # content_hash DIR PATHS...: one hash over every file's path and bytes
  local dir=$1
  shift
  (cd "$dir" && find "$@" -type f ! -path '*/.git/*' -print0 | LC_ALL=C sort -z |
    xargs -0 sha256sum | sha256sum | cut -c1-16)
}

# ---------------------------------------------------------------------------- build
build() {
  local name=$1 src="" jobs force=0
  shift
  jobs=$(nproc)
  while [ $# -gt 0 ]; do
    case $1 in
      --src) [ $# -ge 2 ] || die "--src needs a folder"; src=$2; shift 2 ;;
      --jobs) [ $# -ge 2 ] || die "--jobs needs a number"; jobs=$2; shift 2 ;;
      --force) force=1; shift ;;
      *) die "unknown option '$1' for build (valid: --src DIR, --jobs N, --force)" ;;
    esac
  done
  [[ $jobs =~ ^[1-9][0-9]*$ ]] || die "--jobs '$jobs' is not a positive whole number"
  recipe "$name"
  clear_inherited
  toolchain
  if [ -n "$src" ]; then
    [ -d "$src" ] || die "--src '$src' is not a folder"
    src=$(cd "$src" && pwd)
  else
    src=$(fetch_source "$name")
  fi
  check_source "$src"

  local cuda key out work report status
  cuda=$(cuda_home)
  key=$( {
    content_hash "$src" "${NEEDS[@]}"
    printf '%s\n' "${ENV[@]}" "${PATCHES[@]}" "$TORCH_PIN" "${NVCC_PINS[@]}" "$ABI"
  } | sha256sum | cut -c1-16)
  out=$CACHE/wheels/$name/$key
  if [ "$force" = 0 ] && compgen -G "$out/*.whl" >/dev/null && [ -f "$out/build.json" ]; then
    # a wheel cached before the checks existed is checked now (build.json then says so)
    grep -q '"checks"' "$out/build.json" || verify "$name" "$out" "$(commit_of "$src")"
    say "cached: $(ls "$out"/*.whl) (--force builds it again)"
    return 0
  fi
  work=$CACHE/build/work/$name-$key
  mkdir -p "$work" "$out"
  # a copy without .git (setup scripts' `git submodule update` then does nothing), mtimes kept
  # (a rerun recompiles only what changed)
  tar -C "$src" --exclude=.git -cf - "${NEEDS[@]}" | tar -C "$work" -xf -
  apply_patches "$work/$SETUP_DIR"
  say "building $name ($REPO@${PIN:0:12}) in $work with $jobs jobs; restrictions:"
  printf '  - %s\n' "${RESTRICTIONS[@]}" >&2

  report=$out/monitor.json status=0
  rm -f "$out"/*.whl "$out/build.json"
  (
    cd "$work/$SETUP_DIR"
    export CUDA_HOME=$cuda CUDA_PATH=$cuda PATH=$cuda/bin:$TOOLCHAIN/bin:$PATH MAX_JOBS=$jobs
    export NVCC_THREADS=1 TORCH_CUDA_ARCH_LIST=9.0a
    # FFA's prebuild: as many kernels at once as jobs, its JIT workspace inside the build folder
    export MAGI_ATTENTION_PREBUILD_FFA_JOBS=$jobs MAGI_ATTENTION_WORKSPACE_BASE=$work/workspace
    for assignment in "${ENV[@]}"; do export "${assignment?}"; done
    "$TOOLCHAIN/bin/python" "$repo_root/launchers/build_monitor.py" "$report" -- \
      "$TOOLCHAIN/bin/python" "$SETUP" bdist_wheel -d "$out" # bdist_wheel first: FFA's setup
      # decides what to build from sys.argv[1]
  ) 2>&1 | tee "$out/build.log" | awk '/^\[[0-9]+\/[0-9]+\]/ { out = ""
      if (match($0, / -o [^ ]+/)) { out = substr($0, RSTART + 4, RLENGTH - 4); sub(/.*\//, "", out) }
      print "  " $1 " " out; fflush() } / error|^error/ { print; fflush() }' >&2 || status=$?
  if [ "$status" != 0 ]; then  # a wheel a failed build left is no build
    rm -f "$out"/*.whl
    tail -n 5 "$out/build.log" >&2
    die "the build failed (exit $status); nothing cached: see $out/build.log"
  fi
  compgen -G "$out/*.whl" >/dev/null || die "no wheel built: see $out/build.log"
  verify "$name" "$out" "$(commit_of "$src")"
  record "$name" "$src" "$out" "$jobs" "$key"
}

apply_patches() {  # apply_patches DIR: the recipe's patches, each of which must change its file
  local patch file rest before
  for patch in "${PATCHES[@]}"; do  # FILE|SED|why: the sed expression may hold "|", why not
    file=$1/${patch%%|*} rest=${patch#*|}
    before=$(sha256sum <"$file")
    sed -i "${rest%|*}" "$file"
    [ "$(sha256sum <"$file")" != "$before" ] ||
      die "patch of ${patch%%|*} changed nothing (${rest%|*}): the recipe no longer fits this source"
    say "patched ${patch%%|*}: ${rest%|*}"
  done
}

clear_inherited() {  # a build's switches are the recipe's alone: none inherited, none cached
  local var cleared=()  # unseen (the key hashes the recipe, not the environment)
  for var in $(compgen -e); do
    case $var in
      *_SKIP_CUDA_BUILD | FLASH_ATTENTION_* | FLASH_ATTN_* | FLASH_MASK_* | MAGI_ATTENTION_* | \
        BLOCK_SPARSE_ATTN_* | NVCC_APPEND_FLAGS | NVCC_PREPEND_FLAGS | CUDAARCHS)
        unset "$var"
        cleared+=("$var")
        ;;
    esac
  done
  [ "${#cleared[@]}" -eq 0 ] || say "cleared from the environment: ${cleared[*]}"
}

wheel_check() {  # wheel_check NAME WHEEL COMMIT [OUT]: the recipe's promises checked
  local args=(--name "$1" --cuobjdump "$(cuda_home)/bin/cuobjdump" --torch "${TORCH_BUILD%+*}"
    --commit "$3") arch pin module
  for arch in "${SASS[@]}"; do args+=(--sass "$arch"); done
  for arch in "${PTX[@]}"; do args+=(--ptx "$arch"); done
  for pin in "${BUILD_ONLY_PINS[@]}"; do args+=(--hide-dist "${pin%%==*}"); done
  for module in "${IMPORTS[@]}"; do args+=(--import "$module"); done
  [ -z "${4:-}" ] || args+=(--out "$4")
  "$TOOLCHAIN/bin/python" "$repo_root/launchers/wheel_check.py" "$2" "${args[@]}"
}

verify() {  # verify NAME OUT COMMIT: the wheel in OUT checked, or set aside and die
  local wheel
  wheel=$(ls "$2"/*.whl)
  if ! wheel_check "$1" "$wheel" "$3" "$2/checks.json"; then
    mkdir -p "$2/refused"
    mv "$wheel" "$2/refused/"
    [ ! -f "$2/build.json" ] || mv "$2/build.json" "$2/refused/"
    die "refused $(basename "$wheel") (kept in $2/refused/, not cached): see the lines above"
  fi
  [ -f "$2/build.json" ] || return 0  # a new build: `record` writes build.json with the checks
  "$TOOLCHAIN/bin/python" - "$2" <<'PY'
import json, os, sys
facts_file = os.path.join(sys.argv[1], "build.json")
facts = json.load(open(facts_file))
facts["checks"] = json.load(open(os.path.join(sys.argv[1], "checks.json")))
json.dump(facts, open(facts_file, "w"), indent=1)
PY
}

record() {  # record NAME SRC OUT JOBS KEY: build.json beside the wheel, and one line for people
  local name=$1 src=$2 out=$3 jobs=$4 key=$5 wheel submodules=() entry
  wheel=$(ls "$out"/*.whl)
  for entry in "${SUBMODULES[@]}"; do
    submodules+=("${entry%%=*}=$(commit_of "$src/${entry%%=*}")")
  done
  # lists travel one item a line
  FLAGS=$(printf '%s\n' "${ENV[@]}") RESTRICTED=$(printf '%s\n' "${RESTRICTIONS[@]}") \
    PATCHED=$(printf '%s\n' "${PATCHES[@]}") SUBMODULE_COMMITS=$(printf '%s\n' "${submodules[@]}") \
    CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') \
    "$TOOLCHAIN/bin/python" - "$out" "$wheel" "$name" "$REPO" "$(commit_of "$src")" "$jobs" \
    "$key" "$(nproc)" "$(cuda_home)" "${SASS[*]}" <<'PY'
import datetime, hashlib, json, os, platform, subprocess, sys
out, wheel, name, repo, commit, jobs, key, cores, cuda, arch = sys.argv[1:11]
lines = lambda var: [line for line in os.environ[var].splitlines() if line]
monitor = json.load(open(os.path.join(out, "monitor.json")))
import torch
nvcc = subprocess.run([os.path.join(cuda, "bin", "nvcc"), "--version"], capture_output=True,
                      text=True).stdout.strip().splitlines()[-2]
facts = {
    "kernel": name, "wheel": os.path.basename(wheel), "wheel_bytes": os.path.getsize(wheel),
    "wheel_sha256": hashlib.sha256(open(wheel, "rb").read()).hexdigest(),
    "source": repo, "commit": commit,
    "submodules": dict(s.split("=", 1) for s in lines("SUBMODULE_COMMITS")),
    "flags": lines("FLAGS"), "patches": lines("PATCHED"), "restrictions": lines("RESTRICTED"),
    "key": key,
    "toolchain": {"python": platform.python_version(), "torch": torch.__version__,
                  "torch_cuda": torch.version.cuda, "nvcc": nvcc, "arch": arch},
    "machine": {"cores": int(cores), "cpu": os.environ["CPU"], "jobs": int(jobs)},
    "built": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    **monitor,
    "checks": json.load(open(os.path.join(out, "checks.json"))),
    "sha256_reproducible": "no: the same recipe built again gives a wheel with another sha256 "
    "(FA3, 2026-12); compare builds by commit, flags, patches and checks",
}
json.dump(facts, open(os.path.join(out, "build.json"), "w"), indent=1)
print(f"kernel_build: {facts['wheel']}: {facts['wheel_bytes'] / 2**20:.1f} MiB, built in "
      f"{facts['wall_s'] / 60:.1f} min on {cores} cores ({jobs} jobs), peak memory "
      f"{facts['peak_tree_rss_mib'] / 1024:.1f} GiB (largest process "
      f"{facts['peak_process_rss_mib'] / 1024:.1f} GiB)", file=sys.stderr)
PY
  echo "$wheel"
}

list_recipes() {
  local name
  for name in $(recipes); do
    recipe "$name"
    if [ -n "$SDIST" ]; then
      echo "$name: $SDIST (PyPI sdist) -> $DIST ($ABI)"
    else
      echo "$name: $REPO@$PIN ${SUBMODULES[*]} -> $DIST ($ABI)"
    fi
    echo "  flags: ${ENV[*]}"
    echo "  device code: SASS ${SASS[*]}; PTX ${PTX[*]:-none}"
    printf '  - %s\n' "${RESTRICTIONS[@]}"
  done
}

schemas() {  # schemas NAME: the real interface of the newest cached wheel, into tests/unit/data
  local name=${1:?usage: schemas NAME} facts folder wheel
  recipe "$name"
  facts=$(ls -t "$CACHE/wheels/$name"/*/build.json 2>/dev/null | head -n 1)
  [ -n "$facts" ] && [ -x "$TOOLCHAIN/bin/python" ] ||
    die "no $name wheel cached: bash launchers/wheelhouse.sh build $name first"
  folder=$(dirname "$facts")
  wheel=$(ls "$folder"/*.whl)
  rm -rf "$folder/site" && mkdir -p "$folder/site"
  (cd "$folder/site" && "$TOOLCHAIN/bin/python" -m zipfile -e "$wheel" .)
  PYTHONPATH=$repo_root "$TOOLCHAIN/bin/python" -W ignore -m tests.helpers.real_schemas record \
    "$name" "$folder/site" "$facts" "$repo_root/tests/unit/data/real_schemas/$name.json"
}

check() {  # check NAME WHEEL: any wheel (one brought in, say) held to recipe NAME's promises
  [ $# -eq 2 ] && [ -f "$2" ] || die "usage: check NAME WHEEL (an existing wheel file)"
  recipe "$1"
  toolchain
  wheel_check "$1" "$2" "$PIN" || exit 1
}

main() {
  case ${1:-} in
    toolchain) toolchain; echo "$TOOLCHAIN" ;;
    list) list_recipes ;;
    schemas) shift; schemas "$@" ;;
    check) shift; check "$@" ;;
    ""|-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
    *) build "$@" ;;
  esac
}
# one compound command, read whole before it runs: an edit of this file during a long build
# cannot change what the running script does next. Sourced (tests: their own recipe), it
# defines the functions and runs nothing.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then main "$@"; exit $?; fi
