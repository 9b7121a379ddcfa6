"""Errors of the emulated LLM server's request handling (a module of its
own: ``python -m controlplane.llm.server`` runs that module as ``__main__``,
and a class defined there would not be the one its route modules raise)."""


class BadRequest(Exception):
    """A request field that is wrong (the message names it): HTTP 400."""
