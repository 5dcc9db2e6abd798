#!/usr/bin/env bash
# The Debian packages the fleet and its tests use, installed only where missing:
#   nginx            the load balancer of `make run` and the nginx tests
#   fonts-wqy-zenhei a CJK font: Chinese test documents and the worker's visualization
#   fonts-dejavu-core the Latin test documents
#   chromium         the web page's browser test and `make screenshots` (headless, driven by
#                    Playwright's Python package with executable_path=/usr/bin/chromium)
#   redis-server     the job store of a fleet (`make run REDIS=1`, the job tests)
#   poppler-utils    pdftotext/pdftoppm: the searchable-PDF tests check the gateway's PDFs with them
# Without apt (or root/sudo) it says what is missing and carries on: `make run` then runs
# without nginx, and the tests that need a missing package fail or skip with that reason.
set -u
need=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
[ -f /usr/share/fonts/truetype/wqy/wqy-zenhei.ttc ] || need+=(fonts-wqy-zenhei)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || need+=(redis-server)
command -v pdftotext >/dev/null 2>&1 && command -v pdftoppm >/dev/null 2>&1 || need+=(poppler-utils)
[ ${#need[@]} -eq 0 ] && exit 0

sudo_cmd=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo_cmd="sudo"
  else
    echo "note: missing Debian packages: ${need[*]} (no root or passwordless sudo to install them)" >&2
    exit 0
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "note: missing packages: ${need[*]} (no apt-get here; install them with your package manager)" >&2
  exit 0
fi
echo "installing Debian packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo_cmd apt-get update -qq && \
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null || \
  echo "note: apt-get could not install ${need[*]}" >&2
exit 0
