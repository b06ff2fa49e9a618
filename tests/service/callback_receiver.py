"""A real HTTP receiver for completion callbacks: ``http.server`` on a loopback port, in a thread, recording each
request and answering from a script (204 once the script is spent). ``hold()`` keeps the next requests waiting
unanswered until ``release()``, as a receiver that stopped answering would."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    def __init__(self, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[Received] = []
        self.answers: list[tuple[int, dict[str, str]]] = []
        self._released = threading.Event()
        self._released.set()
        self._hold_only: Callable[[bytes], bool] | None = None
        self._arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._arrived:
                    receiver.requests.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    status, headers = receiver.answers.pop(0) if receiver.answers else (204, {})
                    receiver._arrived.notify_all()
                if receiver._hold_only is None or receiver._hold_only(body):
                    receiver._released.wait(60)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, name="callback-receiver", daemon=True)
        self._thread.start()

    def url(self, host: str = "127.0.0.1", path: str = "/hook", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def answer(self, *answers: tuple[int, dict[str, str]]) -> None:
        self.answers.extend(answers)

    def hold(self, only: Callable[[bytes], bool] | None = None) -> None:
        """Answer no request until ``release``; with ``only``, just the requests whose body it picks."""
        self._hold_only = only
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.requests) >= count, timeout):
                raise AssertionError(f"{len(self.requests)} callback requests arrived, not {count}")
            return list(self.requests)

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()
