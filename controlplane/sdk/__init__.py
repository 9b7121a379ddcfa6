"""The Python client SDK (``GalaxyClient``): deploy, dispatch, invoke."""
