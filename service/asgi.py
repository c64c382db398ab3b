"""ASGI entry point for uvicorn/gunicorn: `uvicorn service.asgi:app`."""

from service.app import create_app
from service.config import get_settings
from service.logs import configure_logging

configure_logging(fmt=get_settings().log_format)
app = create_app()
