"""Scriptable OpenAI-compatible loopback server for failure injection in LLM tests.

Never used for the happy path of the unit under test: that runs on the real local model.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

# ---------------------------------------------------------------------------------------
# the scriptable loopback test double
# ---------------------------------------------------------------------------------------

Action = tuple[Any, ...]


class FakeLLMServer:
    """OpenAI-compatible loopback server whose replies are scripted per request.

    ``script`` holds one action per incoming request (consumed in order); when it is
    empty the request gets a good answer ``"answer:<prompt>"``. Actions:
    ``("status", code, body[, headers])``, ``("garbage", body)``, ``("sleep", seconds)``
    (then a good answer), ``("json", obj)``.
    """

    def __init__(self, *, delay: float | Callable[[dict[str, Any]], float] = 0.0) -> None:
        self.delay = delay
        self.script: list[Action] = []
        self.received: list[dict[str, Any]] = []  # path, headers, body per request
        self.answered: list[str] = []  # prompts whose good reply was fully written
        self.active = 0
        self.max_active = 0
        self.hold_after: int | None = None  # requests after this many are held at the gate
        self.held: list[str] = []
        self.gate = threading.Event()
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {"_raw": raw.decode("utf-8", "replace")}
                with fake.lock:
                    fake.received.append(
                        {"path": self.path, "headers": dict(self.headers), "body": body}
                    )
                    n = len(fake.received)
                    action = fake.script.pop(0) if fake.script else ("ok",)
                    fake.active += 1
                    fake.max_active = max(fake.max_active, fake.active)
                    hold = fake.hold_after is not None and n > fake.hold_after
                    if hold:
                        fake.held.append(_prompt_of(body))
                try:
                    if hold:
                        fake.gate.wait(60)
                    self._act(action, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout) or was killed
                finally:
                    with fake.lock:
                        fake.active -= 1

            def _send(
                self,
                code: int,
                payload: bytes,
                headers: dict[str, str] | None = None,
                content_type: str = "application/json",
            ) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()

            def _act(self, action: Action, body: dict[str, Any]) -> None:
                kind = action[0]
                if kind == "status":
                    headers = action[3] if len(action) > 3 else None
                    self._send(action[1], action[2].encode(), headers)
                elif kind == "garbage":
                    self._send(200, action[1].encode(), content_type="text/html")
                elif kind == "json":
                    self._send(200, json.dumps(action[1]).encode())
                else:
                    if kind == "sleep":
                        time.sleep(action[1])
                    delay = fake.delay(body) if callable(fake.delay) else fake.delay
                    time.sleep(delay)
                    self._send(200, json.dumps(_good_reply(self.path, body)).encode())
                    with fake.lock:
                        fake.answered.append(_prompt_of(body))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def n_requests(self) -> int:
        with self.lock:
            return len(self.received)

    def prompts(self) -> list[str]:
        with self.lock:
            return [_prompt_of(r["body"]) for r in self.received]

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _prompt_of(body: dict[str, Any]) -> str:
    if "prompt" in body:
        return str(body["prompt"])
    if "messages" in body:
        return str(body["messages"][-1]["content"])
    return str(body.get("_raw", ""))


def _good_reply(path: str, body: dict[str, Any]) -> dict[str, Any]:
    text = "answer:" + _prompt_of(body)
    usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    if path.endswith("/chat/completions"):
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
        }
        if body.get("logprobs"):
            n = int(body.get("top_logprobs", 1))
            choice["logprobs"] = {
                "content": [
                    {
                        "token": "yes",
                        "logprob": -0.25,
                        "top_logprobs": [
                            {"token": f"t{k}", "logprob": -0.25 - k} for k in range(n)
                        ],
                    }
                ]
            }
        return {"object": "chat.completion", "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
    if body.get("logprobs"):
        n = int(body["logprobs"])
        choice["logprobs"] = {
            "tokens": ["yes"],
            "top_logprobs": [{f"t{k}": -0.5 - k for k in range(n)}],
        }
    return {"object": "text_completion", "choices": [choice], "usage": usage}


