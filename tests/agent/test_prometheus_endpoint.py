"""The agent's Prometheus endpoint (``gpuprobe.agent.prometheus.serve``) over real loopback sockets."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from gpuprobe.agent.prometheus import CONTENT_TYPE, PageServer, serve

PAGE = b'# TYPE a gauge\na{gpu="0"} 1\n' * 5000  # 140 KB: more than one send on loopback, mostly


@pytest.fixture
def server() -> Iterator[PageServer]:
    pages = [lambda: PAGE, lambda: b"b 2\n"]
    s = serve("127.0.0.1", 0, pages)
    yield s
    s.shutdown()
    s.server_close()


def url(s: PageServer, path: str = "/metrics") -> str:
    return f"http://127.0.0.1:{s.server_address[1]}{path}"


def raw(s: PageServer, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", s.server_address[1]), timeout=10) as c:
        c.sendall(request)
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    return out


def test_get_answers_the_pages_concatenated(server: PageServer) -> None:
    for path in ("/metrics", "/", "/metrics?x=1"):
        with urllib.request.urlopen(url(server, path), timeout=10) as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == CONTENT_TYPE
            body = r.read()
            assert int(r.headers["Content-Length"]) == len(body)
        assert body == PAGE + b"b 2\n"


def test_as_prometheus_asks_and_with_bare_line_feeds(server: PageServer) -> None:
    request = (
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nUser-Agent: Prometheus/2.42.0\r\nAccept: text/plain;version=0.0.4\r\n"
        b"Accept-Encoding: gzip\r\nX-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n"
    )
    for r in (request, request.replace(b"\r\n", b"\n")):
        answer = raw(server, r)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200 OK\r\n")
        assert b"Connection: close" in head
        assert body == PAGE + b"b 2\n"


def test_other_paths_methods_and_requests_are_refused(server: PageServer) -> None:
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url(server, "/other"), timeout=10)
    assert e.value.code == 404
    assert raw(server, b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.0 501 ")
    assert raw(server, b"nonsense\r\n\r\n").startswith(b"HTTP/1.0 400 ")
    # one byte over the limit, all of it read before the answer (unread input would reset the connection)
    head = b"GET /metrics HTTP/1.1\r\nX: "
    assert raw(server, head + b"y" * (PageServer.MAX_REQUEST_BYTES + 1 - len(head))).startswith(b"HTTP/1.0 431 ")


def test_a_client_that_sends_nothing_delays_no_other_scrape(server: PageServer) -> None:
    """One thread serves every connection: a silent one (or a half request) must not hold it."""
    port = server.server_address[1]
    with socket.create_connection(("127.0.0.1", port)), socket.create_connection(("127.0.0.1", port)) as half:
        half.sendall(b"GET /metr")
        for _ in range(3):
            with urllib.request.urlopen(url(server), timeout=5) as r:
                assert r.read() == PAGE + b"b 2\n"
        half.sendall(b"ics HTTP/1.1\r\n\r\n")
        assert half.recv(64).startswith(b"HTTP/1.0 200 OK")


def test_a_page_that_fails_answers_500_and_the_next_scrape_works() -> None:
    calls: list[int] = []

    def page() -> bytes:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return b"ok 1\n"

    s = serve("127.0.0.1", 0, [page])
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url(s), timeout=10)
        assert e.value.code == 500
        with urllib.request.urlopen(url(s), timeout=10) as r:
            assert r.read() == b"ok 1\n"
    finally:
        s.shutdown()
        s.server_close()


def test_shutdown_closes_the_port() -> None:
    s = serve("127.0.0.1", 0, [lambda: b"x 1\n"])
    port = s.server_address[1]
    s.shutdown()
    s.server_close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_ipv6() -> None:
    try:
        s = serve("::1", 0, [lambda: b"x 1\n"])
    except OSError:
        pytest.skip("no IPv6 loopback here")
    try:
        with urllib.request.urlopen(f"http://[::1]:{s.server_address[1]}/metrics", timeout=10) as r:
            assert r.read() == b"x 1\n"
    finally:
        s.shutdown()
        s.server_close()
