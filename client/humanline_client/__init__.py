"""Python SDK for the Humanline service."""
