# Sourced by bin/demo and bin/test (not run on its own): `prepare_environment SCRIPT EXTRA...`
# uses the active virtual environment, or creates and activates .venv when none is active,
# then installs only what is missing there: torch as `python bin/missing.py --torch EXTRA...`
# says (torch==2.14.1 with torchvision==0.29.1 when the extras ask for torchvision, or CPU
# torch==2.13.0 when no torch imports), then what `python bin/missing.py EXTRA...` lists
# (this checkout with those extras when featpipe itself is missing; an installed featpipe is
# kept); then compiles featpipe's numba kernels into their cache (`python -m
# featpipe.compiled`: once per environment, seconds when they are cached already), so that
# no job pays for it.  Before installing into its own .venv it brings that .venv's pip to a
# current release (`current_pip`): the pip a distribution's Python gives new environments
# (Debian 12's python3.11: pip 23.0.1) spent over 12 minutes of CPU in its resolver on
# `--editable .[all]` where a current pip takes under a minute in all.  pip shows what it
# does (a line per package, download progress on a terminal).  Every install step that fails
# stops the script with pip's own error above one line that names the step.

#: the oldest pip the scripts install with in their own .venv
MIN_PIP=24.1

# install_step SCRIPT WHAT PIP-ARGUMENT...: one `pip install`, announced, its failure named.
install_step() {
  local script=$1 what=$2
  shift 2
  echo "$script: installing $what into $(python -c 'import sys; print(sys.prefix)'): $*" >&2
  if ! python -m pip install "$@"; then
    echo "$script: the step that failed: installing $what (python -m pip install $*);" \
      "pip's error is above" >&2
    exit 1
  fi
}

# pip_is_current: whether the environment's pip is MIN_PIP or newer.
pip_is_current() {
  python - "$MIN_PIP" <<'PY'
import re
import sys
from importlib import metadata


def release(text):
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


try:
    sys.exit(0 if release(metadata.version("pip")) >= release(sys.argv[1]) else 1)
except metadata.PackageNotFoundError:
    sys.exit(1)
PY
}

# current_pip SCRIPT: bring the scripts' own .venv's pip to MIN_PIP or newer before
# anything is installed (an environment the user activated keeps its pip).
current_pip() {
  local script=$1 version
  pip_is_current && return 0
  version=$(python -c 'from importlib import metadata; print(metadata.version("pip"))' \
    2>/dev/null || echo "none")
  install_step "$script" "a current pip (this .venv has pip $version)" --upgrade \
    "pip>=$MIN_PIP"
}

prepare_environment() {
  local script=$1 python arguments own=0
  shift
  if [ -z "${VIRTUAL_ENV:-}" ]; then
    own=1
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
  if [ "$own" = 1 ]; then
    current_pip "$script"
  fi
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
