#!/usr/bin/env bash
# The Debian packages the fleet and its tests use, installed only where missing:
#   nginx            the load balancer of `make run` and the nginx tests
#   fonts-wqy-zenhei a CJK font: Chinese test documents and the worker's visualization
#   fonts-dejavu-core the Latin test documents
#   chromium         the web page's browser test and `make screenshots` (headless, driven by
#                    Playwright's Python package with executable_path=/usr/bin/chromium)
#   redis-server     the job store of a fleet (`make run REDIS=1`, the job tests)
#   poppler-utils    pdftotext/pdftoppm: the searchable-PDF tests check the gateway's PDFs with them
#   prometheus       promtool (checks and unit-tests deploy/monitoring/rules.yaml) and the server
#                    tests/test_monitoring.py starts on loopback: only the binaries are used
# Without apt (or root/sudo), or when apt-get fails, it says what is missing and carries on
# (`make run` then runs without nginx); with --require (`make test`, the CI) it exits 1 naming
# the missing packages: the suite needs every one of them and never passes by skipping.
set -u
need=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
[ -f /usr/share/fonts/truetype/wqy/wqy-zenhei.ttc ] || need+=(fonts-wqy-zenhei)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
[ -x /usr/bin/chromium ] || need+=(chromium)
command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ] || need+=(redis-server)
command -v pdftotext >/dev/null 2>&1 && command -v pdftoppm >/dev/null 2>&1 || need+=(poppler-utils)
command -v promtool >/dev/null 2>&1 && [ -x /usr/bin/prometheus ] || {
  need+=(prometheus)
  # its postinst enables and starts a daemon on :9090 where systemd runs: stopped again on exit
  trap '[ -d /run/systemd/system ] && { systemctl disable --now prometheus ||
    sudo -n systemctl disable --now prometheus; } >/dev/null 2>&1' EXIT
}
[ ${#need[@]} -eq 0 ] && exit 0

level=note
[ "${1:-}" = --require ] && level=error
source "$(dirname "$0")/apt_install.sh"
apt_install "$level" "${need[@]}" || [ "$level" = note ]
