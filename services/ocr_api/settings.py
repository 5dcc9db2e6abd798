"""Reading typed configuration from environment variables, failing at start-up with a message
that names the variable, what it holds and what was expected."""

from __future__ import annotations

import os
from typing import Mapping, Sequence


MIN_SECRET_CHARS, MAX_SECRET_CHARS = 16, 512


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


def _check_range(name, number, minimum, maximum) -> None:
    if minimum is not None and number < minimum:
        raise ConfigError(f"{name}={number}: must be >= {minimum}")
    if maximum is not None and number > maximum:
        raise ConfigError(f"{name}={number}: must be <= {maximum}")
