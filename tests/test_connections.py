"""gateway/connections.py against a stand-in replica on loopback: keep-alive reuse, what is
never reused, the two transport errors, and the bounds on what is kept."""

from __future__ import annotations

import contextlib
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gateway.connections import Connections, TransportError, TransportTimeout


class Replica(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list  # (client port, path) of each request, set per server

    def do_GET(self):
        self.server.seen.append((self.client_address[1], self.path))
        if self.path.endswith("/slow"):
            self.server.release.wait(10)
        close = self.path.endswith("/close")
        self._answer(200, b"ok", close)

    def do_POST(self):
        self.server.seen.append((self.client_address[1], self.path))
        if self.path.endswith("/refuse"):  # answers before it reads the body, and hangs up
            self._answer(503, b"busy", close=True)
            return
        length = int(self.headers["Content-Length"])
        self._answer(200, b"%d" % len(self.rfile.read(length)), False)

    def _answer(self, status: int, body: bytes, close: bool) -> None:
        self.send_response(status)
        self.send_header("X-Ocr-Worker", "w1")
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def replica():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Replica)
    server.daemon_threads = True
    server.seen, server.release = [], threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()


def get(connections: Connections, url: str, path: str, **headers):
    return connections.request("GET", url, path, headers=headers, connect_s=2, read_s=2)


def test_connections_are_kept_alive_and_answers_read_whole():
    with replica() as (server, url):
        connections = Connections(per_replica=2)
        answers = [get(connections, url, "/readyz") for _ in range(3)]
        posted = connections.request("POST", url, "/ocr", headers={}, body=b"x" * 70000,
                                     connect_s=2, read_s=2)
        connections.close()
    assert [a.status for a in answers] == [200] * 3 and posted.data == b"70000"
    assert answers[0].headers.get("x-ocr-worker") == "w1"  # case-insensitive
    assert len({port for port, _ in server.seen}) == 1


def test_a_url_with_a_path_keeps_it_before_the_request_path():
    with replica() as (server, url):
        get(Connections(1), f"{url}/fleet/", "/readyz")
    assert server.seen[0][1] == "/fleet/readyz"


def test_a_connection_that_says_close_or_asked_to_is_not_used_again():
    with replica() as (server, url):
        connections = Connections(per_replica=4)
        get(connections, url, "/close")  # the replica says it closes
        get(connections, url, "/readyz", Connection="close")  # this request asked to
        get(connections, url, "/readyz")
        get(connections, url, "/readyz")
    ports = [port for port, _ in server.seen]
    assert len(set(ports[:3])) == 3 and ports[3] == ports[2]


def test_an_idle_connection_the_replica_closed_is_not_used():
    """The replica ends an idle connection without saying so (as gunicorn does after its
    keep-alive): the next request goes on a new one, not into an error."""
    listener = socket.create_server(("127.0.0.1", 0))
    ports, closed = [], [threading.Event(), threading.Event()]

    def serve():
        for done in closed:
            conn, address = listener.accept()
            ports.append(address[1])
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            done.set()

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        connections = Connections(per_replica=1)
        assert get(connections, url, "/readyz").data == b"ok"
        assert closed[0].wait(5)
        assert get(connections, url, "/readyz").data == b"ok"
    finally:
        listener.close()
    assert len(set(ports)) == 2


def test_a_replica_that_answers_before_it_reads_the_body_is_an_answer_not_an_error():
    with replica() as (_, url):
        answer = Connections(1).request("POST", url, "/refuse", headers={},
                                        body=b"x" * (8 << 20), connect_s=2, read_s=2)
    assert (answer.status, answer.data) == (503, b"busy")


def test_nothing_listening_is_a_transport_error_and_a_slow_answer_a_timeout():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(TransportError) as refused:
        get(Connections(1), f"http://127.0.0.1:{port}", "/readyz")
    assert not isinstance(refused.value, TransportTimeout)
    with pytest.raises(ValueError):  # no time left: not sent, and not the replica's fault
        Connections(1).request("GET", f"http://127.0.0.1:{port}", "/readyz", headers={},
                               connect_s=1, read_s=0)
    with replica() as (server, url):
        connections = Connections(1)
        with pytest.raises(TransportTimeout):
            connections.request("GET", url, "/slow", headers={}, connect_s=2, read_s=0.2)
        server.release.set()
        assert get(connections, url, "/readyz").status == 200  # on a new connection
    assert len({port for port, _ in server.seen}) == 2


def test_idle_connections_are_bounded_per_replica_and_in_replicas():
    with replica() as (server, url), replica() as (other, other_url):
        connections = Connections(per_replica=1, replicas=1)
        results = []
        threads = [threading.Thread(target=lambda: results.append(get(connections, url, "/slow")))
                   for _ in range(3)]
        for thread in threads:
            thread.start()
        while len(server.seen) < 3:  # all three requests are in (each on its own connection)
            threading.Event().wait(0.01)
        server.release.set()
        for thread in threads:
            thread.join(5)
        server.release.clear()
        get(connections, url, "/readyz")
        get(connections, url, "/readyz")
        get(connections, other_url, "/readyz")  # the first URL is forgotten, its socket closed
        get(connections, url, "/readyz")
    assert len(results) == 3
    ports = [port for port, _ in server.seen]
    assert len(set(ports[:3])) == 3
    assert ports[3] == ports[4] and ports[3] in ports[:3]  # one of the three was kept
    assert ports[5] not in ports[:5]
