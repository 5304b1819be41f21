#!/usr/bin/env bash
# A wheelhouse for a GPU machine with no package index, made on a machine that has one.
#
#   bash launchers/wheelhouse.sh make DIR [--part-mib N]     # here: download, split into parts
#   bash launchers/wheelhouse.sh pack WHEELS DIR PART_MIB    # (make's second half, on any wheels)
#   bash launchers/wheelhouse.sh stage PART_DIR [STAGE]      # there: keep one carried part
#   eval "$(bash launchers/wheelhouse.sh install [STAGE] [TARGET])"   # there: join, install
#
#   bash launchers/wheelhouse.sh build NAME [--src DIR]      # here: build a kernel's wheel
#   bash launchers/wheelhouse.sh built WHEELS                # (make's step: the built wheels)
#
# `make` downloads, for the GPU machine's Python and platform (LCAB_WHEEL_PYTHON, default 3.12,
# manylinux x86-64), each wheel with --no-deps: lcab's runtime requirements that a CUDA image
# with torch usually lacks (Hydra, OmegaConf, its antlr runtime built here from the sdist, the
# submitit launcher, plotly) and the GPU extras that ship as wheels (LCAB_WHEEL_EXTRAS, default "fa4";
# also known: "flashinfer", "vsa", and "cudnn", the frontend, which no lcab kernel calls: the
# `cudnn` kernel is TransformerEngine's), and adds the newest cached wheel of every kernel built
# here by `build` (launchers/kernel_build.sh: FA3 and the other source builds; LCAB_WHEEL_BUILT
# names some, "" none). It packs them into DIR/part-1, part-2, ... of at most
# N MiB each (default 56: a 64 MiB transfer less the repository), cutting
# a wheel larger than a part (FA4's nvidia-cutlass-dsl-libs-cu13 is ~88 MiB) into pieces named
# WHEEL.piece-NN, and writes DIR/manifest.txt (sha256 of every whole wheel). lcab's own
# requirements (Hydra, OmegaConf, antlr, submitit; <1 MiB) go into every part, so any part staged
# alone on a fresh machine installs and runs lcab with the kernels it holds. DIR must be
# git-ignored when it is inside the checkout (`.whl` is): a device call carries every untracked
# file that is not, and the parts would push it past 64 MiB. One `make` per device call (its
# LCAB_WHEEL_BUILT and LCAB_WHEEL_EXTRAS naming that call's kernels) gives one folder per call.
#
# On the GPU machine, `stage` copies one carried part into STAGE (default /tmp/lcab-wheelhouse);
# what a machine keeps between calls lasts only while it stays warm (30 s idle), so a wheel in
# pieces across parts needs its calls back to back; each call should stage, install, import and
# run in one command. `install` joins the pieces that are all there, checks every wheel against
# the manifest and installs those that are whole with pip --no-index --no-deps into TARGET
# (default /tmp/lcab-site), naming the rest, and prints the `export PYTHONPATH=...` that makes
# them importable (TARGET and what its .pth files add, which a PYTHONPATH entry alone does not
# run: FA4's CuTe DSL is found only so). No wheel here is torch, so nothing replaces the image's.
set -euo pipefail

# what lcab imports at run time and a CUDA image with torch, numpy, pandas, scipy, rich and
# matplotlib lacks; pinned to the versions launchers/setup.sh resolves today (move them with it)
RUNTIME=(hydra-core==1.3.8 omegaconf==2.3.1 hydra-submitit-launcher==1.2.0 submitit==1.5.4)
ANTLR=antlr4-python3-runtime==4.9.3 # sdist only on PyPI: built into a wheel here
REPORT=(plotly==7.1.0) # the report's page; 9 MiB, so it travels with the large wheels
# the GPU extras as pyproject.toml pins them for the CPU tests (the `upstream` extra), with the
# dependencies their import needs that such an image lacks
declare -A EXTRAS=(
  [fa4]="flash-attn-4==4.0.0b36 quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5"
  [cudnn]="nvidia-cudnn-frontend==1.32.0 apache-tvm-ffi==0.1.15.post2"
  [flashinfer]="flashinfer-python==0.7.2.post1 apache-tvm-ffi==0.1.15.post2"
  [vsa]="fastvideo-kernel==0.3.4"
)
STAGE_DEFAULT=/tmp/lcab-wheelhouse
TARGET_DEFAULT=/tmp/lcab-site

die() {
  echo "wheelhouse: $*" >&2
  exit 2
}

make_house() {
  local dir=$1 part_mib=56
  shift
  # inside the checkout, the house must be ignored: untracked files always travel with a device
  # call, and the parts would push it past its 64 MiB
  if git -C "$(dirname "$dir")" rev-parse --is-inside-work-tree >/dev/null 2>&1 &&
    ! git -C "$(dirname "$dir")" check-ignore -q "$(basename "$dir")"; then
    die "'$dir' is inside the checkout and not git-ignored: every untracked file travels with \
each device call (64 MiB in all); use .whl (ignored by .gitignore) or add it to .git/info/exclude"
  fi
  while [ $# -gt 0 ]; do
    case $1 in
      --part-mib) part_mib=$2; shift 2 ;;
      *) die "unknown option '$1' for make (valid: --part-mib N)" ;;
    esac
  done
  local py=${LCAB_WHEEL_PYTHON:-3.12} pip=(python3 -m pip)
  [ -x .venv/bin/python ] && pip=(.venv/bin/python -m pip)
  local wheels=$dir/wheels
  rm -rf "$dir" && mkdir -p "$wheels"
  local platforms=()
  for tag in manylinux_2_{17,24,27,28,31,34,35}_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$tag")
  done
  local names=("${RUNTIME[@]}" "${REPORT[@]}")
  for extra in ${LCAB_WHEEL_EXTRAS-fa4}; do
    [ -n "${EXTRAS[$extra]+x}" ] || die "unknown extra '$extra' (valid: ${!EXTRAS[*]})"
    # shellcheck disable=SC2206  # the table's entries are space-separated names
    names+=(${EXTRAS[$extra]})
  done
  mapfile -t names < <(printf '%s\n' "${names[@]}" | sort -u)
  "${pip[@]}" download -q --no-deps --only-binary=:all: --python-version "$py" \
    --implementation cp "${platforms[@]}" -d "$wheels" "${names[@]}"
  "${pip[@]}" wheel -q --no-deps -w "$wheels" "$ANTLR"
  built "$wheels"
  pack "$wheels" "$dir" "$part_mib"
}

built() {  # built WHEELS: the newest cached wheel of each kernel built here, copied into WHEELS
  # once its checks passed (build.json's; a wheel cached without them, one brought in say, is
  # checked now: launchers/kernel_build.sh check)
  local wheels=$1 cache=${LCAB_CACHE:-$HOME/.cache/lcab} names name facts wheel
  names=${LCAB_WHEEL_BUILT-$(ls "$cache/wheels" 2>/dev/null || true)}
  mkdir -p "$wheels"
  for name in $names; do
    facts=$(ls -t "$cache/wheels/$name"/*/build.json 2>/dev/null | head -n 1 || true)
    [ -n "$facts" ] || die "no $name wheel cached in $cache/wheels: bash launchers/wheelhouse.sh \
build $name first"
    wheel=$(ls "$(dirname "$facts")"/*.whl)
    if grep -q '"passed": false' "$facts" || { ! grep -q '"passed": true' "$facts" &&
      ! bash launchers/kernel_build.sh check "$name" "$wheel" >&2; }; then
      die "the cached $name wheel fails its checks, so it is not carried: $wheel"
    fi
    cp "$wheel" "$wheels"/
    echo "wheelhouse: built here: ${wheel##*/}"
  done
}

own() {  # own WHEEL: 0 when it is one of lcab's own requirements (every part carries them)
  local req
  for req in "${RUNTIME[@]}" "$ANTLR"; do
    [ "${1%%-*}" = "$(echo "${req%%==*}" | tr '-' '_')" ] && return 0
  done
  return 1
}

pack() {  # pack WHEELS DIR PART_MIB: the wheels of WHEELS into DIR/part-N (WHEELS is emptied)
  local wheels=$1 dir=$2 part_mib=$3 whl own_bytes=0
  (cd "$wheels" && sha256sum ./*.whl | sed 's| \./| |') >"$dir/manifest.txt"
  mkdir -p "$dir/own"  # lcab's requirements, copied into every part below
  for whl in "$wheels"/*.whl; do
    if own "${whl##*/}"; then
      own_bytes=$((own_bytes + $(stat -c %s "$whl")))
      mv "$whl" "$dir/own/"
    fi
  done

  # first fit: whole wheels into parts, a wheel over a part in pieces of a part less 1 MiB;
  # each part keeps room for lcab's own requirements
  local limit=$((part_mib * 1024 * 1024 - own_bytes)) used=() n
  place() {  # place FILE SIZE: into the first part with room, a new one if none has
    for ((n = 0; n < ${#used[@]}; n++)); do
      [ $((used[n] + $2)) -le "$limit" ] && break
    done
    [ "$n" -lt "${#used[@]}" ] || used+=(0)
    mkdir -p "$dir/part-$((n + 1))"
    mv "$1" "$dir/part-$((n + 1))/${1##*/}"
    used[n]=$((used[n] + $2))
  }
  while read -r size name; do
    if [ "$size" -gt "$limit" ]; then
      mkdir -p "$dir/pieces"
      split -b "$((limit - 1048576))" -d -a 2 "$wheels/$name" "$dir/pieces/$name.piece-"
      for piece in "$dir/pieces/$name".piece-*; do
        place "$piece" "$(stat -c %s "$piece")"
      done
    else
      place "$wheels/$name" "$size"
    fi
  done < <(cd "$wheels" && for whl in ./*.whl; do
    [ -e "$whl" ] && echo "$(stat -c %s "$whl") ${whl#./}"
  done | sort -k1,1rn)  # largest first
  [ -d "$dir/part-1" ] || mkdir -p "$dir/part-1"  # lcab's requirements alone
  for part in "$dir"/part-*; do
    cp "$dir/manifest.txt" "$part/"
    if compgen -G "$dir/own/*.whl" >/dev/null; then cp "$dir"/own/*.whl "$part/"; fi
  done
  rm -rf "$wheels" "$dir/pieces" "$dir/own"
  du -sh "$dir"/part-* | sed 's/^/wheelhouse: /'
  echo "wheelhouse: each part installs alone (lcab's requirements are in every one); a wheel \
cut into pieces needs its parts staged in back-to-back calls on a machine still warm"
}

stage() {
  local part=${1:?usage: stage PART_DIR [STAGE]} stage_dir=${2:-$STAGE_DEFAULT}
  [ -d "$part" ] || die "no part folder '$part'"
  mkdir -p "$stage_dir" && cp -f "$part"/* "$stage_dir"/
  echo "wheelhouse: staged $(find "$part" -type f | wc -l) files of $part in $stage_dir"
}

install_house() {
  local stage_dir=${1:-$STAGE_DEFAULT} target=${2:-$TARGET_DEFAULT}
  [ -f "$stage_dir/manifest.txt" ] || die "no manifest.txt in '$stage_dir': stage a part first"
  local ready=() missing=() sum whl
  while read -r sum whl; do
    if [ ! -f "$stage_dir/$whl" ] && [ -f "$stage_dir/$whl.piece-00" ]; then
      cat "$stage_dir/$whl".piece-* >"$stage_dir/$whl.joined"
      if [ "$(sha256sum <"$stage_dir/$whl.joined" | cut -d' ' -f1)" = "$sum" ]; then
        mv "$stage_dir/$whl.joined" "$stage_dir/$whl" && rm -f "$stage_dir/$whl".piece-*
      else
        rm -f "$stage_dir/$whl.joined"  # a piece still to come: stage its part
      fi
    fi
    if [ -f "$stage_dir/$whl" ] && [ "$(sha256sum <"$stage_dir/$whl" | cut -d' ' -f1)" = "$sum" ]
    then
      ready+=("$stage_dir/$whl")
    else
      missing+=("$whl")
    fi
  done <"$stage_dir/manifest.txt"
  [ "${#ready[@]}" -gt 0 ] || die "no whole wheel in '$stage_dir' yet"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$target" "${ready[@]}" >&2
  echo "wheelhouse: installed ${#ready[@]} wheels in $target" >&2
  [ "${#missing[@]}" -eq 0 ] || echo "wheelhouse: not yet staged (or damaged): ${missing[*]}" >&2
  # a --target folder is no site folder: its .pth files (the CuTe DSL's puts its `cutlass`
  # package on sys.path) run only through site.addsitedir, so the path they add is printed too
  local path
  path=$(python3 -c 'import site, sys
before = list(sys.path)
site.addsitedir(sys.argv[1])
print(":".join([sys.argv[1]] + [p for p in sys.path if p not in before and p != sys.argv[1]]))
' "$target")
  echo "export PYTHONPATH=$path${PYTHONPATH:+:$PYTHONPATH}"
}

cd "$(dirname "$0")/.."
case ${1:-} in
  make) shift; [ $# -ge 1 ] || die "usage: make DIR [--part-mib N]"; make_house "$@" ;;
  pack) shift; [ $# -eq 3 ] || die "usage: pack WHEELS DIR PART_MIB"; mkdir -p "$2"; pack "$@" ;;
  stage) shift; stage "$@" ;;
  install) shift; install_house "$@" ;;
  build) shift; exec bash launchers/kernel_build.sh "$@" ;;
  built) shift; [ $# -eq 1 ] || die "usage: built WHEELS"; built "$1" ;;
  *) die "unknown command '${1:-}' (valid: make, pack, stage, install, build, built)" ;;
esac
