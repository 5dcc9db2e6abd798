"""Document layout parsing for `POST /layout-parsing` (PP-StructureV3's serving schema):
layout regions (regions.py), table structure (tables.py), OCR lines assigned to regions and
reading order (order.py), Markdown (markdown.py), the page's result (page.py), the models on
onnxruntime (models.py). Pure functions on numpy arrays and dicts, except models.py."""
