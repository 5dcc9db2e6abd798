"""Dockerfiles of the fleet and the small build-time helpers they run (requirements.py,
fetch_official_models.py)."""
