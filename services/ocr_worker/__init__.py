"""The OCR worker: one PaddleOCR engine per process behind a PaddleX-compatible /ocr API."""
