"""Reading typed configuration from environment variables, failing at start-up with a message
that names the variable, what it holds and what was expected."""

from __future__ import annotations

import os
from typing import Mapping, Sequence


class ConfigError(ValueError):
    """A configuration variable holds a value the service cannot run with."""


class Env:
    """Typed reads from one environment mapping (os.environ by default)."""

    def __init__(self, environ: Mapping[str, str] | None = None):
        self.environ = os.environ if environ is None else environ

    def _raw(self, name: str) -> str | None:
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


def _check_range(name, number, minimum, maximum) -> None:
    if minimum is not None and number < minimum:
        raise ConfigError(f"{name}={number}: must be >= {minimum}")
    if maximum is not None and number > maximum:
        raise ConfigError(f"{name}={number}: must be <= {maximum}")
