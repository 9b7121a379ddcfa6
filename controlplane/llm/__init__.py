"""LLM serving: an emulated OpenAI-compatible inference server (``engine``,
``server``) for fleet-scale experiments, named as an emulation everywhere."""
