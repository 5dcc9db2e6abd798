# Sourced by install_system_deps.sh and install_container_deps.sh (not run on its own).
#
# apt_install LEVEL PACKAGE...: install the Debian packages with apt-get, as root or with
# passwordless sudo. Where that is not possible, or apt-get fails, it says so on stderr,
# prefixed with LEVEL ("error", or "note" where the caller goes on without them), and returns
# 1 whatever the level: a failed install never reads as a success. A caller that can go on
# without the packages says so itself (`apt_install note ... || true`).
apt_install() {
  local level=$1
  shift
  local sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo_cmd="sudo"
    else
      echo "$level: missing Debian packages: $* (no root or passwordless sudo to install them)" >&2
      return 1
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "$level: missing packages: $* (no apt-get here; install them with your package manager)" >&2
    return 1
  fi
  echo "installing Debian packages: $*"
  # env, not export: sudo resets the environment
  if ! { $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
         $sudo_cmd env DEBIAN_FRONTEND=noninteractive \
           apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }; then
    echo "$level: apt-get could not install $*" >&2
    return 1
  fi
}
