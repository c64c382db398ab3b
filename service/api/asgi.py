"""ASGI entry point for uvicorn/gunicorn: `uvicorn service.api.asgi:app`."""

from service.api.app import create_app

app = create_app()
