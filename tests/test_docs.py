"""The README's configuration tables match the code: every environment variable a service
reads is documented, and every documented variable is read somewhere."""

import re

from tests.conftest import REPO_ROOT

CONFIG_SOURCES = ["services/ocr_worker/config.py", "gateway/config.py",
                  "services/ocr_api/server_settings.py"]
ENV_READ = re.compile(
    r'env\.(?:str|optional_str|choice|int|float|bool|list|secrets)\(\s*"([A-Z_]+)"')
SECRET_FILE_READ = re.compile(r'env\.secrets\(\s*"[A-Z_]+",\s*"([A-Z_]+)"')


def variables_read_by_code() -> set[str]:
    names = set()
    for path in CONFIG_SOURCES:
        source = (REPO_ROOT / path).read_text()
        names |= set(ENV_READ.findall(source)) | set(SECRET_FILE_READ.findall(source))
    return names


def variables_in_readme_tables() -> set[str]:
    names = set()
    for line in (REPO_ROOT / "README.md").read_text().splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names |= set(re.findall(r"`([A-Z][A-Z0-9_]+)`", first_cell))
    return names


def test_every_variable_the_code_reads_is_documented():
    missing = variables_read_by_code() - variables_in_readme_tables()
    assert not missing, f"undocumented: {sorted(missing)}"


def test_every_documented_variable_is_read_by_the_code():
    outside_config = {"PROMETHEUS_MULTIPROC_DIR", "WORKERS", "RUN_ARGS", "OCR_THREADS", "PORT"}
    unknown = variables_in_readme_tables() - variables_read_by_code() - outside_config
    assert not unknown, f"documented but never read: {sorted(unknown)}"
