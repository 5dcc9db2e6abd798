"""The docs hold: the configuration tables (docs/configuration.md) match the code, every
environment variable a service reads is documented and every documented variable is read
somewhere; the docs build as a site with MkDocs in strict mode (a broken link, a missing
anchor or a page left out of the nav fails it); and every link and repository path the
README and the docs name exists."""

import re
import subprocess
import sys

from gateway.config import GatewayConfig
from services.ocr_worker.config import WorkerConfig
from tests.conftest import REPO_ROOT


def variables_read_by_code() -> set[str]:
    """Every variable the services' settings classes declare (services/ocr_api/settings.py
    reads exactly those)."""
    return GatewayConfig.variables() | WorkerConfig.variables()


def variables_in_readme_tables() -> set[str]:
    """The variables named in the first column of docs/configuration.md's tables (they
    lived in the README's before the docs moved to docs/)."""
    names = set()
    for line in (REPO_ROOT / "docs" / "configuration.md").read_text().splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names |= set(re.findall(r"`([A-Z][A-Z0-9_]+)`", first_cell))
    return names


def test_every_variable_the_code_reads_is_documented():
    missing = variables_read_by_code() - variables_in_readme_tables()
    assert not missing, f"not in docs/configuration.md: {sorted(missing)}"


def test_every_documented_variable_is_read_by_the_code():
    outside_config = {"PROMETHEUS_MULTIPROC_DIR", "WORKERS", "RUN_ARGS", "OCR_THREADS", "PORT"}
    unknown = variables_in_readme_tables() - variables_read_by_code() - outside_config
    assert not unknown, f"in docs/configuration.md but never read: {sorted(unknown)}"


DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`([^`\s]+)`")


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub (and MkDocs, for these headings) gives a document's headings."""
    anchors, fenced = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_the_docs_build_as_a_site_in_strict_mode(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "api" / "index.html").is_file()


def test_every_relative_link_in_the_readme_resolves():
    readme = (REPO_ROOT / "README.md").read_text()
    broken = []
    for target in LINK.findall(readme):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        document = REPO_ROOT / path if path else REPO_ROOT / "README.md"
        if not document.exists():
            broken.append(target)
        elif anchor and document.suffix == ".md" and anchor not in github_anchors(
                document.read_text()):
            broken.append(target)
    assert not broken, f"README.md links to what does not exist: {broken}"


def test_every_repository_path_the_docs_name_exists():
    """A path in backticks that starts with one of the repository's top-level entries names a
    file or folder that exists (build outputs that .gitignore lists are let through)."""
    top_level = {p.name for p in REPO_ROOT.iterdir()} - {".git"}
    ignored = tuple(line.strip("/") for line in (REPO_ROOT / ".gitignore").read_text().split()
                    if not line.startswith(("#", "!")) and "*" not in line)
    missing = []
    for document in DOCUMENTS:
        for token in CODE_PATH.findall(document.read_text()):
            path = token.split("#")[0].rstrip(":,.")
            if ("/" not in path or path.split("/")[0] not in top_level
                    or re.search(r"[*<>{}|…]|\.\.\.", path) or path.startswith(ignored)):
                continue
            if not (REPO_ROOT / path).exists():
                missing.append(f"{document.relative_to(REPO_ROOT)}: {token}")
        # any Markdown file named, in code or in words (once a DESIGN.md that never existed)
        for name in re.findall(r"[\w./-]*\w\.md\b", re.sub(r"https?://\S+", "",
                                                              document.read_text())):
            if not any((base / name).exists() for base in (REPO_ROOT, REPO_ROOT / "docs")):
                missing.append(f"{document.relative_to(REPO_ROOT)}: {name}")
    assert not missing, f"paths named in the docs that do not exist: {missing}"
