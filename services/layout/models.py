"""The layout and table-structure models on onnxruntime (CPU), from the files
scripts/fetch_layout_models.py lays out under <OCR_MODEL_DIR>/layout/, each checked against
its SHA-256 at load. Sessions are created once per process; onnxruntime's `run` is
thread-safe, so request threads share them."""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

import numpy as np

from . import tables

LAYOUT_FILE = "layout_cdla.onnx"
TABLE_FILE = "slanet-plus.onnx"
RULED_FILE = "cycle_center_net_v2.onnx"  # ruled tables' lines (services/layout/ruled.py)
# as scripts/fetch_layout_models.py records them (the images' model stage runs it without
# services/; tests/test_fetch_models.py checks the two agree)
SHA256 = {
    LAYOUT_FILE: "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
    TABLE_FILE: "d57a942af6a2f57d6a4a0372573c696a2379bf5857c45e2ac69993f3b334514b",
    RULED_FILE: "0ea48d3a17e35ef5c2e498a5e799566073234d39b1079ca21d9f4fafe73c6d20",
}


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class LayoutModels:
    """PicoDet-CDLA, SLANet_plus and the ruled-table line model's sessions, loaded on first
    use."""

    def __init__(self, model_dir: str, threads: int = 1):
        self.directory = os.path.join(model_dir, "layout")
        self.threads = threads
        self._lock = threading.Lock()
        self._layout = self._table = self._ruled = None
        self.table_vocab: list[str] = []

    def missing(self) -> str | None:
        """Why the models cannot be loaded, or None."""
        for name in SHA256:
            if not os.path.isfile(os.path.join(self.directory, name)):
                return (f"layout model {os.path.join(self.directory, name)} is missing: run "
                        "`make models` (scripts/fetch_layout_models.py)")
        return None

    def load(self) -> None:
        with self._lock:
            if self._layout is not None:
                return
            reason = self.missing()
            if reason:
                raise FileNotFoundError(reason)
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
            options.log_severity_level = 3
            sessions = []
            for name, expected in SHA256.items():
                path = os.path.join(self.directory, name)
                actual = _sha256(path)
                if actual != expected:
                    raise RuntimeError(f"{path}: SHA-256 {actual} is not the expected "
                                       f"{expected}: run `make models` again")
                sessions.append(ort.InferenceSession(path, options,
                                                     providers=["CPUExecutionProvider"]))
            layout, table, ruled = sessions
            self.table_vocab = tables.vocabulary(
                table.get_modelmeta().custom_metadata_map["character"])
            self._table, self._ruled, self._layout = table, ruled, layout

    def detect(self, tensor: np.ndarray) -> list[np.ndarray]:
        self.load()
        return self._layout.run(None, {self._layout.get_inputs()[0].name: tensor})

    def table_structure(self, tensor: np.ndarray) -> tuple[Any, Any]:
        self.load()
        loc, probs = self._table.run(None, {self._table.get_inputs()[0].name: tensor})
        return loc, probs

    def ruled_lines(self, tensor: np.ndarray) -> np.ndarray:
        """The ruled-table model's line mask (h × w: 0 background, 1 horizontal, 2 vertical)
        for ruled.preprocess()'s tensor."""
        self.load()
        return self._ruled.run(None, {self._ruled.get_inputs()[0].name: tensor})[0][0][0]
