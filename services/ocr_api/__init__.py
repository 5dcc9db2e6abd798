"""The API contract both services speak: PaddleX-serving request parsing, response envelope,
error type and environment-config helpers. Pure Python: no Flask, no OCR engine, no numpy,
so the gateway can import it without the worker's heavy dependencies."""
