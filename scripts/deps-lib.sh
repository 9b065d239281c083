# Shared by scripts/install-deps.sh and scripts/install-bench-deps.sh (source it).

# apt_install_missing NAME PACKAGE...: installs with apt-get (through sudo
# when not root) the Debian PACKAGEs that are not installed yet; NAME starts
# each line it prints.
apt_install_missing() {
  local name=$1 p sudo=() missing=()
  shift
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "$name: installing ${missing[*]}"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  else
    echo "$name: all Debian packages present"
  fi
}

# pip_install PACKAGE...: into the python3 on PATH (it may be a pyenv or venv
# one, not Debian's); on Debian's own, past its externally-managed guard.
pip_install() {
  python3 -m pip install --quiet "$@" 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages "$@"
}
