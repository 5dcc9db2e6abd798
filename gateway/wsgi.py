"""gunicorn's entry point: `gateway.wsgi:app`."""

from services.ocr_api.logs import configure_json_logging

from .app import create_app
from .config import GatewayConfig

config = GatewayConfig.handed_over()  # read by gunicorn's master (gunicorn.conf.py)
configure_json_logging("gateway", config.log_level)
app = create_app(config)
