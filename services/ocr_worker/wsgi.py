"""gunicorn's entry point: `services.ocr_worker.wsgi:app`. Imported in each worker process
after fork, so the engine is created there, never in the master."""

from services.ocr_api.logs import configure_json_logging

from .app import create_app
from .config import WorkerConfig

config = WorkerConfig.from_env()
configure_json_logging("ocr_worker", config.log_level)
app = create_app(config)
