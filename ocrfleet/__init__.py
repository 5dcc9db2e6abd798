"""ocrfleet: a command-line client for an ocrfleet gateway (HTTP only; it imports neither
service). `ocrfleet ocr FILE` for one document, `ocrfleet batch IN OUT` for a folder."""
