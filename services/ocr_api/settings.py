"""Reading typed configuration from environment variables, failing at start-up with a message
that names the variable, what it holds and what was expected.

Each setting is declared once, as a field of the service's frozen dataclass:

    queue_pages: int = setting("GATEWAY_QUEUE_PAGES", 1000, 1)  # pages admitted, per process

(variable, default, bounds; the type is the annotation; `choices`, `secret`, `file`, `single`
and `convert` where needed), and `Settings.from_env` reads every declared field through `Env`.
A field whose type is another `Settings` dataclass is a group read from the same variables
(the gateway's `jobs` and `cache`).

Why not pydantic-settings (issue 21): it would remove the same field + default + from_env
triple, but the gateway does not depend on pydantic (the worker gets it only through PaddleX:
two more packages in the gateway's hashed lock and image), and keeping today's behaviour would
need about as much code around it: its messages ("Input should be greater than or equal to 1")
translated back to `OCR_MAX_PAGES=0: must be >= 1`, a source for the `*_FILE` secrets (its
secrets_dir is one file per field, not a variable naming a mounted file), lists kept
comma-separated (it decodes them as JSON), and the typo check with its did-you-mean all the
same (it ignores unknown variables in the environment). The one generic reader below (about a
hundred lines with its docstrings) uses the parsers of `Env` as they were.

Each service owns one prefix (OCR_ for the worker, GATEWAY_ for the gateway). Env records every
name it was asked for, and `check_prefix` then refuses a variable with the service's prefix
that nobody read: OCR_MAX_PAGE=5 is a typo that would otherwise leave the limit at its default
without a word.

Read once: gunicorn's master reads the settings in gunicorn.conf.py (a bad value stops it
there, with the message) and `hand_over`s the object; the processes it forks take it with
`handed_over` instead of parsing the environment again."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar


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
            for line in _read_secret_file(file_name, path).splitlines():
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

    def secret(self, name: str, file_name: str) -> str | None:
        """One secret value (a URL with a password, a signing key) from `name`, or else read
        whole from the file that `file_name` names (a mounted Secret: one line, lines starting
        with `#` ignored). Both set is an error: which one wins would be a guess. Messages
        name the variables, never the value."""
        value, path = self._raw(name), self._raw(file_name)
        if path is None:
            return value
        if value is not None:
            raise ConfigError(f"{name} and {file_name} are both set: set one of them")
        lines = [line.strip() for line in _read_secret_file(file_name, path).splitlines()
                 if line.strip() and not line.strip().startswith("#")]
        if len(lines) != 1:
            raise ConfigError(f"{file_name}={path!r}: expected one value on one line, found "
                              f"{len(lines)} lines")
        return lines[0]

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


# ---- settings declared once, as dataclass fields --------------------------------------------

@dataclasses.dataclass(frozen=True)
class Variable:
    """How one field is read: its variable, bounds or choices, for secrets the variable that
    may name a file holding more (or, `single`, holding the one value instead), and a
    conversion of the value read."""

    name: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    file: str | None = None
    convert: Callable[[Any], Any] | None = None
    single: bool = False

    def read(self, env: Env, kind: type, default: Any) -> Any:
        """Unset (or blank): the default. `kind` is the field's type, None and generics
        taken off: bool, int, float, str or tuple (a comma-separated list)."""
        if self.file is not None and self.single:
            value = env.secret(self.name, self.file)
            value = default if value is None else value
        elif self.file is not None:
            value = env.secrets(self.name, self.file)
        elif kind is bool:
            value = env.bool(self.name, default)
        elif kind is int:
            value = env.int(self.name, default, self.minimum, self.maximum)
        elif kind is float:
            value = env.float(self.name, default, self.minimum, self.maximum)
        elif kind is tuple:
            value = tuple(env.list(self.name)) or default
        elif self.choices:
            value = env.choice(self.name, default, self.choices)
        else:
            value = env.str(self.name, default)
        return value if self.convert is None else self.convert(value)


def setting(name: str, default: Any = None, minimum: float | None = None,
            maximum: float | None = None, *, choices: Sequence[str] = (), secret: bool = False,
            file: str | None = None, convert: Callable[[Any], Any] | None = None,
            single: bool = False) -> Any:
    """A dataclass field read from the variable `name`. `secret` (implied by `file`, the
    variable naming a mounted Secret): kept out of repr, so never in a log line. `file`
    alone: a list of secrets, from both (`Env.secrets`); with `single`: one value, taken
    whole from one or the other (`Env.secret`: a URL, a signing key)."""
    variable = Variable(name, minimum, maximum, tuple(choices), file, convert, single)
    return dataclasses.field(default=default, repr=not (secret or file),
                             metadata={"variable": variable})


def group(cls: type) -> Any:
    """A dataclass field holding a group of settings (a `Settings` dataclass of its own),
    read from the same environment."""
    return dataclasses.field(default_factory=cls)


S = TypeVar("S", bound="Settings")
_HANDED_OVER: dict[type, Any] = {}


class Settings:
    """Base of a frozen dataclass whose fields are `setting(...)`s and `group(...)`s. A
    service's class sets `env_prefix`: its variables with that prefix are checked for typos."""

    env_prefix: typing.ClassVar[str | None] = None

    @classmethod
    def from_env(cls: type[S], environ: Mapping[str, str] | None = None, *,
                 check: bool = True) -> S:
        """Every declared variable read from `environ` (os.environ by default), each value
        checked on its own (type, bounds, choices); then, unless `check` is False (tools
        that want one part, the ports, without a whole configuration), the typo check and
        `validate`, the checks across fields."""
        env = Env(environ)
        config = _read(cls, env)
        if check:
            if cls.env_prefix:
                env.check_prefix(cls.env_prefix)  # a typo first: it explains more
            config.validate()
        return config

    def validate(self) -> None:
        """Checks across fields (ConfigError): the groups' here; a subclass that adds its own
        calls this first."""
        for item in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, item.name)
            if isinstance(value, Settings):
                value.validate()

    @classmethod
    def variable(cls, field_name: str) -> Variable:
        return next(item.metadata["variable"] for item in dataclasses.fields(cls)
                    if item.name == field_name)

    @classmethod
    def variables(cls) -> set[str]:
        """Every variable these settings read, the groups' and the *_FILE ones included."""
        names: set[str] = set()
        hints = typing.get_type_hints(cls)
        for item in dataclasses.fields(cls):  # type: ignore[arg-type]
            variable = item.metadata.get("variable")
            if variable is not None:
                names |= {variable.name} | ({variable.file} if variable.file else set())
            elif _is_group(_kind(hints[item.name])):
                names |= _kind(hints[item.name]).variables()
        return names

    def hand_over(self) -> None:
        """In gunicorn's master (gunicorn.conf.py): these settings are what the processes it
        forks from now on run with (see `handed_over`). A reload reads and hands over anew."""
        _HANDED_OVER[type(self)] = self

    @classmethod
    def handed_over(cls: type[S]) -> S:
        """In a process gunicorn forked: the settings its master read and handed over, the
        environment not parsed again. Elsewhere (a test, another server): read now."""
        config = _HANDED_OVER.get(cls)
        return cls.from_env() if config is None else config


def _kind(hint: Any) -> Any:
    """int from `int | None`, tuple from `tuple[str, ...]`."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return typing.get_origin(hint) or hint


def _is_group(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, Settings)


def _read(cls: type[S], env: Env) -> S:
    hints = typing.get_type_hints(cls)
    values = {}
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]
        variable, kind = item.metadata.get("variable"), _kind(hints[item.name])
        if variable is not None:
            values[item.name] = variable.read(env, kind, item.default)
        elif _is_group(kind):
            values[item.name] = _read(kind, env)
    return cls(**values)


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


def _read_secret_file(file_name: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read(1024 * 1024)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file_name}={path!r}: cannot read it "
                          f"({type(exc).__name__})") from None


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,15}://")


def shown_url(value: str) -> str:
    """A URL setting's value as a configuration error may describe it: its scheme, never the
    rest. A password may be anywhere in a URL (user-info, `?password=`), and anywhere in a
    mistyped one (`redis:/:pw@host` parses with no user-info at all)."""
    scheme = _SCHEME.match(value)
    if scheme is None:
        return "a value without a scheme:// (not shown: it may hold a password)"
    return f"a URL starting {scheme.group(0)!r} (the rest not shown: it may hold a password)"
