"""The HTTP API (FastAPI). Imports models, storage and trainer.spec; never torch."""
