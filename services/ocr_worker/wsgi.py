"""gunicorn's entry point: `services.ocr_worker.wsgi:app`. Imported in each worker process
after fork, so the engine is created there, never in the master."""

from services.ocr_api.logs import configure_json_logging

from .app import create_app
from .config import WorkerConfig

config = WorkerConfig.handed_over()  # read by gunicorn's master (gunicorn.conf.py)
configure_json_logging("ocr_worker", config.log_level)
app = create_app(config)
