"""The ``openai`` backend's transport (aiohttp): the environment's proxy settings, and a reply cut short on the
wire coming back as a transient error the middleware retries.

    .venv/bin/python -m pytest -q tests/llm/test_openai_transport.py
"""

import asyncio

import pytest
from yarl import URL

from components.llm.backends.openai_http import OpenAIChatModel, env_proxy
from components.llm.base import Sampling, TransientLLMError, user


def test_the_environment_proxy_is_used_unless_no_proxy_names_the_host(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                 "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert env_proxy("http://judge.internal:8000/v1/chat/completions") == (None, None)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    assert env_proxy("http://judge.internal:8000/v1/chat/completions")[0] == URL("http://proxy.internal:3128")
    assert OpenAIChatModel("m", "http://judge.internal:8000/v1").proxy == URL("http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "judge.internal")
    assert env_proxy("http://judge.internal:8000/v1/chat/completions") == (None, None)


def test_a_body_cut_short_on_the_wire_is_transient():
    async def scenario():
        async def half_reply(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 400\r\n\r\n"
                         b'{"choices": [')
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(half_reply, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        model = OpenAIChatModel("m", f"http://127.0.0.1:{port}/v1")
        try:
            with pytest.raises(TransientLLMError, match="ClientPayloadError"):
                await model._complete([user("hi")], Sampling())
        finally:
            await model.aclose()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())
