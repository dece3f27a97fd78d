"""A real HTTP server on 127.0.0.1 that speaks the chat-completions protocol and fails on purpose.

Each request pops the next behaviour from a queue: ("ok", text), ("status", code), ("sleep", seconds),
("malformed", body), ("logprobs", (text, content)): the text with ``content`` as every choice's
``logprobs.content`` (a list of {"token", "logprob", "top_logprobs"} entries, or any value to test a malformed
one). When the queue is empty it answers ``default`` (("ok", "default") unless set).
``max_in_flight`` is the most requests it was ever handling at the same moment.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeOpenAIServer:
    def __init__(self):
        self.behaviours: list[tuple] = []
        self.requests: list[dict] = []
        self.authorizations: list[str | None] = []  # each request's Authorization header
        self.request_times: list[float] = []
        self.default: tuple = ("ok", "default")
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                with outer._lock:
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    code, data = self._answer()
                finally:
                    # counted out before the reply leaves, so a client's next request never overlaps it
                    with outer._lock:
                        outer.in_flight -= 1
                self._send(code, data)

            def _answer(self) -> tuple[int, bytes]:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.requests.append(body)
                    outer.authorizations.append(self.headers.get("Authorization"))
                    outer.request_times.append(time.monotonic())
                    kind, arg = outer.behaviours.pop(0) if outer.behaviours else outer.default
                if kind == "sleep":
                    time.sleep(arg)
                    kind, arg = "ok", "late"
                if kind == "status":
                    return arg, json.dumps({"error": {"message": f"status {arg}"}}).encode()
                if kind == "malformed":
                    return 200, arg.encode()
                n = body.get("n", 1)
                extra = {}
                if kind == "logprobs":
                    arg, content = arg
                    extra = {"logprobs": {"content": content, "refusal": None}}
                payload = {
                    "model": body["model"],
                    "choices": [{"index": i, "message": {"role": "assistant", "content": f"{arg}"},
                                 "finish_reason": "stop", **extra} for i in range(n)],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 3},
                }
                return 200, json.dumps(payload).encode()

            def _send(self, code, data):
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
