"""The `openai` package always sends an API key: through a `galaxy up`
gateway with tokens on, a key that is not a Galaxy token reaches a public
function as no token would, and a private one still answers 401."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.integration.test_up import up  # noqa: F401 (the shared `galaxy up` fixture)
from tests.security.test_tokens import echo, run

pytestmark = pytest.mark.integration


def test_openai_client_with_any_key_calls_a_public_function(up: Any) -> None:  # noqa: F811
    run(up, up.token, lambda c: c.deploy(echo("oa-pub", public=True)))
    run(up, up.token, lambda c: c.deploy(echo("oa-priv")))
    client = openai.OpenAI(
        base_url=f"http://{up.endpoints['gateway']}/v1", api_key="sk-not-galaxy", max_retries=0
    )
    messages: Any = [{"role": "user", "content": "hi"}]
    raw = client.chat.completions.with_raw_response.create(model="oa-pub", messages=messages)
    assert raw.status_code == 200 and '"oa-pub"' in raw.http_response.json()["echo"]
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="oa-priv", messages=messages)
    run(up, up.token, lambda c: c.delete_function("oa-pub"))
    run(up, up.token, lambda c: c.delete_function("oa-priv"))
