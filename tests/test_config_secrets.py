"""Secrets in the gateway's configuration: the Redis URL and the callback secret may come from
a file (a mounted Secret) instead of the environment, and no configuration error shows a
password, however the URL holding it is mistyped."""

from __future__ import annotations

import pytest

from gateway.config import GatewayConfig
from services.ocr_api.logs import redact_url
from services.ocr_api.settings import ConfigError

BASE = {"GATEWAY_REPLICAS": "http://127.0.0.1:8101"}
PASSWORD = "pa55word-4b7e1d9c3f"
SECRET = "callback-secret-8e2f6a1c4d9b7e30"


@pytest.mark.parametrize("variable, value", [
    ("GATEWAY_REDIS_URL", f"redsi://:{PASSWORD}@redis:6379/0"),  # the scheme mistyped
    ("GATEWAY_REDIS_URL", f"redis:/:{PASSWORD}@redis:6379/0"),  # no user-info once parsed
    ("GATEWAY_REDIS_URL", f"redis//:{PASSWORD}@redis"),
    ("GATEWAY_REDIS_URL", f"rdis://redis:6379/0?password={PASSWORD}"),
    ("GATEWAY_REDIS_URL", PASSWORD),  # the password alone, in the wrong variable
    ("GATEWAY_JOBS_PUBLIC_URL", f"htps://user:{PASSWORD}@ocr.example"),
    ("GATEWAY_UPSTREAM_URL", f"htp://user:{PASSWORD}@lb:8080"),
])
def test_a_mistyped_url_is_refused_without_its_password(variable, value):
    environ = {"GATEWAY_UPSTREAM_URL": "http://lb:8080", variable: value}
    with pytest.raises(ConfigError) as caught:
        GatewayConfig.from_env(environ)
    message = str(caught.value)
    assert variable in message and "expected" in message
    assert PASSWORD not in message and PASSWORD[:8] not in message


def test_the_mistyped_scheme_is_named():
    with pytest.raises(ConfigError, match="'redsi://'"):
        GatewayConfig.from_env({**BASE, "GATEWAY_REDIS_URL": f"redsi://:{PASSWORD}@r/0"})


def test_the_redis_url_and_callback_secret_come_from_mounted_files(tmp_path):
    url_file, secret_file = tmp_path / "redis-url", tmp_path / "callback-secret"
    url_file.write_text(f"# the jobs' Redis\nredis://:{PASSWORD}@redis:6379/0\n")
    secret_file.write_text(SECRET + "\n")
    config = GatewayConfig.from_env({**BASE, "GATEWAY_REDIS_URL_FILE": str(url_file),
                                     "GATEWAY_JOBS_CALLBACK_SECRET_FILE": str(secret_file)})
    assert config.jobs.redis_url == f"redis://:{PASSWORD}@redis:6379/0"
    assert config.jobs.callback_secret == SECRET
    assert PASSWORD not in repr(config) and SECRET not in repr(config)
    assert {"GATEWAY_REDIS_URL_FILE", "GATEWAY_JOBS_CALLBACK_SECRET_FILE"} \
        <= GatewayConfig.variables()


def test_a_secret_file_is_checked_like_the_variable_without_showing_it(tmp_path):
    short, two, url = tmp_path / "short", tmp_path / "two", tmp_path / "url"
    short.write_text("too-short\n")
    two.write_text(f"{SECRET}\n{SECRET}x\n")
    url.write_text(f"redsi://:{PASSWORD}@redis/0\n")
    for environ, says in [
            ({"GATEWAY_JOBS_CALLBACK_SECRET_FILE": str(short)}, "at least 16 characters"),
            ({"GATEWAY_JOBS_CALLBACK_SECRET_FILE": str(two)}, "found 2 lines"),
            ({"GATEWAY_JOBS_CALLBACK_SECRET_FILE": str(tmp_path / "none")}, "cannot read it"),
            ({"GATEWAY_REDIS_URL_FILE": str(url)}, "'redsi://'"),
            ({"GATEWAY_JOBS_CALLBACK_SECRET_FILE": str(short),
              "GATEWAY_JOBS_CALLBACK_SECRET": SECRET}, "both set")]:
        with pytest.raises(ConfigError) as caught:
            GatewayConfig.from_env({**BASE, **environ})
        message = str(caught.value)
        assert says in message, message
        assert all(secret not in message for secret in (SECRET, PASSWORD, "too-short"))


def test_a_blank_file_variable_leaves_the_setting_to_its_variable():
    config = GatewayConfig.from_env({**BASE, "GATEWAY_JOBS_CALLBACK_SECRET": SECRET,
                                     "GATEWAY_JOBS_CALLBACK_SECRET_FILE": " "})
    assert config.jobs.callback_secret == SECRET and config.jobs.redis_url is None


@pytest.mark.parametrize("url", [
    f"redis://:{PASSWORD}@redis:6379/0", f"redis://redis:6379/0?password={PASSWORD}",
    f"rediss://default:{PASSWORD}@redis/1?ssl_cert_reqs=none",
    f"unix:///run/redis.sock?db=0&password={PASSWORD}"])
def test_the_store_logs_its_redis_url_without_the_password(url):
    """What the jobs log when their store cannot be reached (`Jobs.log_store_error`)."""
    shown = redact_url(url)
    assert PASSWORD not in shown and shown.split(":", 1)[0] == url.split(":", 1)[0]
