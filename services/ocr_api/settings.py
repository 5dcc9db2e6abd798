"""Reading typed configuration from environment variables, failing at start-up with a message
that names the variable, what it holds and what was expected.

Each service owns one prefix (OCR_ for the worker, GATEWAY_ for the gateway). Env records every
name it was asked for, and `check_prefix` then refuses a variable with the service's prefix
that nobody read: OCR_MAX_PAGE=5 is a typo that would otherwise leave the limit at its default
without a word."""

from __future__ import annotations

import difflib
import os
import re
from typing import Iterable, Mapping, Sequence


MIN_SECRET_CHARS, MAX_SECRET_CHARS = 16, 512


class ConfigError(ValueError):
    """A configuration variable holds a value the service cannot run with."""


class Env:
    """Typed reads from one environment mapping (os.environ by default)."""

    def __init__(self, environ: Mapping[str, str] | None = None):
        self.environ = os.environ if environ is None else environ
        self.read: set[str] = set()  # every name asked for, set or not

    def _raw(self, name: str) -> str | None:
        self.read.add(name)
        value = self.environ.get(name)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def str(self, name: str, default: str) -> str:
        value = self._raw(name)
        return default if value is None else value

    def optional_str(self, name: str) -> str | None:
        return self._raw(name)

    def choice(self, name: str, default: str, choices: Sequence[str]) -> str:
        value = self.str(name, default)
        if value not in choices:
            raise ConfigError(f"{name}={value!r}: expected one of {', '.join(choices)}")
        return value

    def int(self, name: str, default: int, minimum: int | None = None,
            maximum: int | None = None) -> int:
        value = self._raw(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(f"{name}={value!r}: expected an integer") from None
        _check_range(name, number, minimum, maximum)
        return number

    def float(self, name: str, default: float, minimum: float | None = None,
              maximum: float | None = None) -> float:
        value = self._raw(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{name}={value!r}: expected a number") from None
        _check_range(name, number, minimum, maximum)
        return number

    def bool(self, name: str, default: bool) -> bool:
        value = self._raw(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}={value!r}: expected true or false")

    def list(self, name: str) -> list[str]:
        value = self._raw(name)
        if value is None:
            return []
        return [item.strip() for item in value.split(",") if item.strip()]

    def secrets(self, name: str, file_name: str) -> tuple[str, ...]:
        """Secrets (API keys, tokens) from `name` (comma-separated) and from the file that
        `file_name` names (a mounted Secret: one per line or comma-separated; lines starting
        with `#` are ignored). Messages name the variable, never the secret."""
        items = self.list(name)
        path = self._raw(file_name)
        if path is not None:
            try:
                with open(path, encoding="utf-8") as file:
                    text = file.read(1024 * 1024)
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{file_name}={path!r}: cannot read it "
                                  f"({type(exc).__name__})") from None
            for line in text.splitlines():
                if line.strip().startswith("#"):
                    continue
                items += [item.strip() for item in line.split(",") if item.strip()]
        for item in items:
            if not MIN_SECRET_CHARS <= len(item) <= MAX_SECRET_CHARS:
                raise ConfigError(f"{name}/{file_name}: a value of {len(item)} characters; "
                                  f"expected {MIN_SECRET_CHARS} to {MAX_SECRET_CHARS}")
            if not all("!" <= char <= "~" for char in item):
                raise ConfigError(f"{name}/{file_name}: a value with spaces or characters "
                                  "outside printable ASCII")
        return tuple(dict.fromkeys(items))

    def check_prefix(self, prefix: str, also_known: Iterable[str] = ()) -> None:
        """ConfigError naming the first variable that starts with `prefix` but was neither read
        through this Env nor listed in `also_known` (names with the prefix that other code
        reads: gunicorn settings, scripts), with the closest known name as a suggestion.
        Kubernetes service-link variables (a Service named ocr-... injects OCR_..._SERVICE_HOST
        and the like when enableServiceLinks is on) are not ours and pass."""
        known = self.read | set(also_known)
        unknown = sorted(name for name, value in self.environ.items()
                         if name.startswith(prefix) and name not in known
                         and not is_service_link(name, value))
        if not unknown:
            return
        name = unknown[0]
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        hint = f": did you mean {close[0]}?" if close else (
            f": the variables starting with {prefix} that this service reads are listed in "
            "docs/configuration.md")
        others = f" (and {len(unknown) - 1} more: {', '.join(unknown[1:4])})" \
            if len(unknown) > 1 else ""
        raise ConfigError(f"{name} is not a setting of this service{hint}{others}")


# What the kubelet injects for each Service in the namespace (docker-links style):
# FOO_SERVICE_HOST, FOO_SERVICE_PORT, FOO_SERVICE_PORT_<NAME>, FOO_PORT=tcp://...,
# FOO_PORT_<n>_<PROTO>, and that with _PROTO, _PORT or _ADDR appended.
_SERVICE_LINK = re.compile(r"[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|"
                           r"PORT_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)")
_LINK_URL = re.compile(r"(tcp|udp|sctp)://[0-9A-Fa-f.:\[\]]+:[0-9]+")


def is_service_link(name: str, value: str) -> bool:
    if _SERVICE_LINK.fullmatch(name):
        return True
    return name.endswith("_PORT") and _LINK_URL.fullmatch(value) is not None


def _check_range(name, number, minimum, maximum) -> None:
    if minimum is not None and number < minimum:
        raise ConfigError(f"{name}={number}: must be >= {minimum}")
    if maximum is not None and number > maximum:
        raise ConfigError(f"{name}={number}: must be <= {maximum}")
