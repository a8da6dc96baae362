"""The built-in HTTP task against a local server: success, 5xx retries, timeouts, allow-list."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from django_rdbtasks.http import http_request, redact_kwargs
from django_rdbtasks.models import Task
from django_rdbtasks.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)


class Handler(BaseHTTPRequestHandler):
    hits: list[str] = []
    flaky_failures = 2

    def log_message(self, *args):
        pass

    def _answer(self, status, body=b"", location=None):
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        payload = self.rfile.read(length)
        Handler.hits.append(self.path)
        if self.path == "/ok":
            self._answer(200, b'{"received": ' + payload + b"}")
        elif self.path == "/flaky":
            failures = sum(1 for hit in Handler.hits if hit == "/flaky")
            self._answer(503 if failures <= Handler.flaky_failures else 200, b"try later")
        elif self.path == "/slow":
            time.sleep(1.0)
            self._answer(200)
        elif self.path == "/redirect-out":
            self._answer(302, location="http://example.com/")
        else:
            self._answer(418, b"teapot")

    do_GET = do_POST


@pytest.fixture
def server(settings):
    Handler.hits = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    settings.RDBTASKS_HTTP_ALLOWED_HOSTS = [f"127.0.0.1:{httpd.server_port}"]
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()


def run(**kwargs):
    result = http_request.enqueue(**kwargs)
    Worker(burst=True, poll_interval=0.05).run(install_signals=False)
    return Task.objects.get(pk=result.id)


def drain_retries(result_id):
    # Retries wait a (short, in tests) backoff; keep draining until final.
    for _ in range(50):
        row = Task.objects.get(pk=result_id)
        if row.status in {"SUCCESSFUL", "FAILED"}:
            return row
        time.sleep(0.1)
        Worker(burst=True).run(install_signals=False)
    raise AssertionError("never finished")


def test_success_stores_status_and_body(server):
    row = run(url=f"{server}/ok", json_body={"event": "ping"})
    assert row.status == "SUCCESSFUL"
    assert row.return_value["status"] == 200
    assert json.loads(row.return_value["body"]) == {"received": {"event": "ping"}}


def test_5xx_is_retried_until_it_succeeds(server):
    row = drain_retries(http_request.enqueue(url=f"{server}/flaky").id)
    assert row.status == "SUCCESSFUL" and row.attempts == 3
    assert [e["outcome"] for e in row.history] == ["RETRY", "RETRY", "SUCCESSFUL"]
    assert "503" in row.history[0]["traceback"]


def test_timeout_is_retried_then_fails(server):
    result = http_request.using().enqueue(url=f"{server}/slow", timeout=0.2)
    row = drain_retries(result.id)
    assert row.status == "FAILED" and row.attempts == row.max_attempts == 5
    assert "timed out" in row.history[-1]["traceback"]


def test_unexpected_4xx_fails_without_retry(server):
    row = run(url=f"{server}/teapot")
    assert row.status == "FAILED" and row.attempts == 1
    assert row.history[-1]["exception_class_path"].endswith("UnexpectedStatus")


def test_host_not_allowed_is_never_called(server):
    row = run(url="http://example.com/hook")
    assert row.status == "FAILED" and row.attempts == 1
    assert row.history[-1]["exception_class_path"].endswith("HostNotAllowed")


def test_redirect_to_a_host_not_allowed_is_refused(server):
    row = run(url=f"{server}/redirect-out")
    assert row.status == "FAILED" and row.attempts == 1
    assert "example.com" in row.history[-1]["traceback"]
    assert Handler.hits == ["/redirect-out"]


def test_nothing_is_allowed_by_default(settings):
    settings.RDBTASKS_HTTP_ALLOWED_HOSTS = []
    row = run(url="http://127.0.0.1:9/hook")
    assert row.history[-1]["exception_class_path"].endswith("HostNotAllowed")


def test_secret_headers_are_redacted_for_display():
    shown = redact_kwargs(
        {
            "url": "https://x",
            "headers": {"Authorization": "Bearer s3cret", "X-Api-Key": "k", "Accept": "json"},
        }
    )
    assert shown["headers"] == {"Authorization": "••••••", "X-Api-Key": "••••••", "Accept": "json"}
