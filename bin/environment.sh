# Sourced by bin/demo and bin/test (not run on its own): `prepare_environment SCRIPT EXTRA...`
# uses the active virtual environment, or creates and activates .venv when none is active,
# then installs only what is missing there: torch as `python bin/missing.py --torch EXTRA...`
# says (torch==2.14.1 with torchvision==0.29.1 when the extras ask for torchvision, or CPU
# torch==2.13.0 when no torch imports), then what `python bin/missing.py EXTRA...` lists
# (this checkout with those extras when featpipe itself is missing; an installed featpipe is
# kept); then compiles featpipe's numba kernels into their cache (`python -m
# featpipe.compiled`: once per environment, seconds when they are cached already), so that
# no job pays for it.  Every install step that fails stops
# the script with pip's own error above one line that names the step.

# install_step SCRIPT WHAT PIP-ARGUMENT...: one `pip install`, announced, its failure named.
install_step() {
  local script=$1 what=$2
  shift 2
  echo "$script: installing $what into $(python -c 'import sys; print(sys.prefix)'): $*" >&2
  if ! python -m pip install -q "$@"; then
    echo "$script: the step that failed: installing $what (python -m pip install -q $*);" \
      "pip's error is above" >&2
    exit 1
  fi
}

prepare_environment() {
  local script=$1 python arguments
  shift
  if [ -z "${VIRTUAL_ENV:-}" ]; then
    python=$(command -v python3.11 || command -v python3) || {
      echo "$script: no python3.11 or python3 on PATH" >&2
      exit 1
    }
    if [ ! -x .venv/bin/python ] && ! "$python" -m venv .venv; then
      echo "$script: the step that failed: creating .venv with $python -m venv" \
        "(on Debian and Ubuntu: apt-get install python3-venv); its error is above" >&2
      exit 1
    fi
    # shellcheck disable=SC1091
    . .venv/bin/activate
  fi
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  # torch first: with torchvision (extras vision/all) the pair that imports together here,
  # else CPU torch (python bin/missing.py --torch says which, or nothing when it imports)
  arguments=$(python bin/missing.py --torch "$@") || {
    echo "$script: the step that failed: python bin/missing.py --torch $*" >&2
    exit 1
  }
  if [ -n "$arguments" ]; then
    mapfile -t arguments <<<"$arguments"
    install_step "$script" "torch" "${arguments[@]}"
  fi
  arguments=$(python bin/missing.py "$@") || {
    echo "$script: the step that failed: python bin/missing.py $*" >&2
    exit 1
  }
  if [ -n "$arguments" ]; then
    mapfile -t arguments <<<"$arguments"   # one pip argument per line
    install_step "$script" "what is missing" "${arguments[@]}"
  fi
  python -m featpipe.compiled ||
    echo "$script: compiling featpipe's kernels ahead failed (above); each compiles on its" \
      "first use instead" >&2
}
