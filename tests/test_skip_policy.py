"""The skip policy (tests/conftest.py): a skip passes only where tests/allowed_skips.txt allows
it, with pytest-xdist as `make test` runs it and without; every entry says why and still
matches a skip the suite has. The throw-away runs are subprocesses on a temporary directory
whose conftest takes the policy's hooks from tests/conftest.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests import conftest
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

THROWAWAY = '''
import pytest

def test_passes():
    pass

def test_a_listed_skip():
    pytest.skip("this CPU has no bf16")

@pytest.mark.xfail(reason="an xfail is not a skip")
def test_an_xfail():
    assert False
'''
UNLISTED = '''
import pytest

def test_needs_a_missing_tool():
    pytest.skip("throw-away: frobnicate is not installed")

@pytest.mark.skipif(True, reason="throw-away: a mark's skip")
def test_skipped_by_a_mark():
    pass
'''


def run_pytest(tmp_path, files: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import (pytest_make_collect_report, pytest_runtest_makereport,\n"
        "                            pytest_terminal_summary)  # noqa: F401\n")
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-p", "no:anyio", "-p", "no:locust", "-ra", *args, str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("processes", ["0", "2"])
def test_an_unlisted_skip_fails_the_run_and_a_listed_one_passes(tmp_path, processes):
    passing = run_pytest(tmp_path, {"test_ok.py": THROWAWAY}, "-n", processes)
    assert passing.returncode == 0, passing.stdout
    assert re.search(r"SKIPPED .*this CPU has no bf16", passing.stdout)  # the printed list
    assert "1 skipped, allowed: " in passing.stdout and "1 xfailed" in passing.stdout

    failing = run_pytest(tmp_path, {"test_unlisted.py": UNLISTED}, "-n", processes)
    assert failing.returncode == 1, failing.stdout
    out = failing.stdout
    assert "unexpected skip: throw-away: frobnicate is not installed" in out
    assert "unexpected skip: throw-away: a mark's skip" in out
    assert "WITHOUT an allow-list entry, failed: throw-away: frobnicate is not installed" in out
    # the mark's skip fails at setup (an error), pytest.skip in the test fails it; test_ok.py
    # still passes, its listed skip still skipped
    assert "1 failed, 1 passed, 1 skipped, 1 xfailed, 1 error" in out


def test_a_module_skipped_at_collection_fails_the_run(tmp_path):
    result = run_pytest(tmp_path, {"test_module.py": '''
        import pytest
        pytest.skip("throw-away: the whole module", allow_module_level=True)

        def test_never_runs():
            pass
        '''}, "-n", "0")
    assert result.returncode != 0, result.stdout
    assert "unexpected skip: throw-away: the whole module" in result.stdout


def test_every_entry_says_why_and_matches_a_skip_the_suite_has():
    entries = conftest.read_allowed_skips()
    assert entries
    sources = "\n".join(path.read_text() for path in sorted((REPO_ROOT / "tests").glob("*.py"))
                        if path.name != "test_skip_policy.py")
    literals = re.findall(r'"([^"\n]*)"', sources)
    for pattern, why in entries:
        assert len(why) > 20, pattern.pattern
        assert any(pattern.search(text) for text in literals), \
            f"no skip in tests/ has a reason matching {pattern.pattern!r}: remove the entry"


def test_an_entry_without_why_stops_the_run(tmp_path):
    path = tmp_path / "allowed.txt"
    path.write_text("# a comment\n\n^nginx is not installed$\n")
    with pytest.raises(pytest.UsageError, match="PATTERN :: WHY"):
        conftest.read_allowed_skips(path)
    path.write_text("(unclosed :: a pattern that does not compile\n")
    with pytest.raises(pytest.UsageError, match="unclosed"):
        conftest.read_allowed_skips(path)


def test_missing_system_parts_are_not_allowed():
    for reason in ("nginx is not installed (.ci/run installs it)",
                   "/usr/bin/chromium is missing: run `make install`",
                   "cannot render the overlays: neither `kubectl` nor `kustomize` is on PATH",
                   "could not import 'paddlex': No module named 'paddlex'"):
        assert conftest.allowed_skip(reason) is None, reason
    assert conftest.allowed_skip(
        "container tests: `make image-smoke` (CI) and `make image-test` run them")


def test_in_ci_only_the_gpu_images_container_test_may_skip():
    """`make image-smoke` (CI) runs every container test on the two images it builds: the GPU
    stand-in's is the one that may skip, and only for want of that image."""
    from tests import test_images

    assert test_images.GPU_STANDIN_IMAGE in test_images.GPU_STANDIN_SKIP
    assert conftest.allowed_skip(test_images.GPU_STANDIN_SKIP)
    for image in ("localhost/ocrfleet-worker-cpu:dev", "localhost/ocrfleet-gateway:dev"):
        assert conftest.allowed_skip(test_images.GPU_STANDIN_SKIP.replace(
            test_images.GPU_STANDIN_IMAGE, image)) is None, image
    for reason in ("localhost/ocrfleet-worker-gpu:standin not built (make images builds it)",
                   "container tests: `make image-test` runs them", "podman is not installed"):
        assert conftest.allowed_skip(reason) is None, reason
