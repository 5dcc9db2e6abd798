# Sourced by install_system_deps.sh and install_container_deps.sh (not run on its own).
#
# apt_install LEVEL PACKAGE...: install the Debian packages with apt-get, as root or with
# passwordless sudo. Where that is not possible, or apt-get fails, it says so on stderr,
# prefixed with LEVEL: "error" returns 1 (the caller cannot work without them), "note"
# returns 0 (the caller carries on, and what needs a missing package says so later).
apt_install() {
  local level=$1
  shift
  local failed=1
  [ "$level" = note ] && failed=0
  local sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo_cmd="sudo"
    else
      echo "$level: missing Debian packages: $* (no root or passwordless sudo to install them)" >&2
      return $failed
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "$level: missing packages: $* (no apt-get here; install them with your package manager)" >&2
    return $failed
  fi
  echo "installing Debian packages: $*"
  # env, not export: sudo resets the environment
  $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
    $sudo_cmd env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends "$@" >/dev/null || {
    echo "$level: apt-get could not install $*" >&2
    return $failed
  }
}
