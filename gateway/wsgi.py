"""gunicorn's entry point: `gateway.wsgi:app`."""

from services.ocr_api.logs import configure_json_logging

from .app import create_app
from .config import GatewayConfig

config = GatewayConfig.from_env()
configure_json_logging("gateway", config.log_level)
app = create_app(config)
