"""nginx in front of a VM fleet of workers: the config template and its renderer."""
