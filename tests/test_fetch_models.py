"""`make models`: the layout is verified by SHA-256 and re-running it changes nothing."""

import shutil
import subprocess
import sys

from scripts import fetch_models
from tests.conftest import MODELS, REPO_ROOT


def test_layout_is_complete_and_verified():
    assert fetch_models.layout_is_complete(MODELS)
    for (model_dir, name), (_, expected) in fetch_models.FILES.items():
        assert fetch_models.sha256_of(MODELS / model_dir / name) == expected
    for model_dir in {d for d, _ in fetch_models.FILES}:
        yml = (MODELS / model_dir / "inference.yml").read_text()
        assert f"model_name: {model_dir}" in yml  # PaddleOCR's model_name must match


def test_rerun_is_idempotent_and_a_damaged_file_is_detected(tmp_path):
    dest = tmp_path / "models"
    shutil.copytree(MODELS, dest)
    run = [sys.executable, "scripts/fetch_models.py", "--dest", str(dest)]
    again = subprocess.run(run, cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert "complete and verified" in again.stdout
    assert not fetch_models.layout_is_complete(tmp_path / "empty")
    damaged = dest / "PP-OCRv6_tiny_rec" / "inference.yml"
    damaged.write_text("tampered")
    assert not fetch_models.layout_is_complete(dest)


def test_the_worker_checks_the_layout_files_the_fetch_script_verified():
    """The SHA-256 of each layout file is written twice: the images' model stage runs
    scripts/fetch_layout_models.py without services/, and the worker checks them at load
    (services/layout/models.py). They must be the same."""
    from scripts import fetch_layout_models
    from services.layout import models

    assert fetch_layout_models.FILES == models.SHA256
