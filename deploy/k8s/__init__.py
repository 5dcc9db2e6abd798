"""Kustomize base + overlays for the OCR fleet, and `python -m deploy.k8s.validate`, which renders
and validates them offline."""
