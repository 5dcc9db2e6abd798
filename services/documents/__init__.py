"""Opening documents and applying page limits, shared by the gateway (which counts and cuts
pages) and the worker (which renders them): PDFs through pypdfium2, multi-page TIFFs by
walking their directory chain, and the page selection every tier applies the same way.
Depends on pypdfium2 and the API contract only (no Flask, no OCR engine, no numpy)."""
