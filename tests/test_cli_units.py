"""The ocrfleet client against a scripted HTTP server on loopback (answers chosen per test,
so 429/503 with Retry-After, 5xx and failures happen exactly when wanted; the real fleet is
in test_outputs_fleet.py): retries and their waits, final errors with the envelope's reason,
the ZIP bundle for several formats, and a batch's naming, skipping, report and exit code."""

import io
import json
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ocrfleet import batch, cli
from ocrfleet.client import Client, OcrFailed, Settings
from scripts.fleet import free_port


class Scripted:
    """A loopback server answering each POST with the next scripted (status, headers, body),
    or with `default(request)` when the script is used up."""

    def __init__(self, default=None):
        self.script, self.requests, self.default = [], [], default
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.requests.append({"headers": dict(self.headers), "body": body})
                status, headers, payload = (owner.script.pop(0) if owner.script
                                            else owner.default(self.headers, body))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def envelope(status, message):
    return (status, {"Content-Type": "application/json"},
            json.dumps({"logId": "x", "errorCode": status, "errorMsg": message}).encode())


def ok(body=b'{"result": {}}', pages=1):
    return 200, {"X-Ocr-Pages": str(pages)}, body


@pytest.fixture
def server():
    scripted = Scripted(default=lambda headers, body: ok(b"%s" % headers["Accept"].encode()))
    yield scripted
    scripted.close()


@pytest.fixture
def document(tmp_path):
    path = tmp_path / "doc.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    return path


def test_busy_answers_are_waited_out_as_retry_after_says(server, document):
    server.script = [(429, {"Retry-After": "2"}, b"{}"), (503, {"Retry-After": "1"}, b"{}"),
                     ok(pages=3)]
    waits = []
    answer = Client(Settings(url=server.url, api_key="s3cret"), sleep=waits.append).ocr(
        document, ["json"])
    assert waits == [2.0, 1.0] and answer.attempts == 3 and answer.pages == 3
    assert all(r["headers"]["Authorization"] == "Bearer s3cret" for r in server.requests)
    assert server.requests[0]["headers"]["Accept"] == "application/json"
    assert b'name="visualize"\r\n\r\nfalse' in server.requests[0]["body"]


def test_a_fleet_busy_for_too_long_is_a_failure_with_its_reason(server, document):
    server.default = lambda headers, body: (503, {"Retry-After": "2"}, b'{"errorMsg": "full"}')
    waits = []
    with pytest.raises(OcrFailed) as caught:
        Client(Settings(url=server.url, max_wait_s=5), sleep=waits.append).ocr(document, ["txt"])
    assert waits == [2.0, 2.0] and caught.value.status == 503 and "full" in caught.value.reason


def test_network_errors_and_502_are_retried_with_growing_backoff(server, document):
    waits = []
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(OcrFailed) as caught:
        Client(Settings(url=closed, retries=3, backoff_s=1), sleep=waits.append).ocr(
            document, ["json"])
    assert caught.value.attempts == 4 and "network error" in caught.value.reason
    assert len(waits) == 3 and 0.5 <= waits[0] <= 1.5 and 2 <= waits[2] <= 6
    server.script = [envelope(502, "replica gone"), ok()]
    assert Client(Settings(url=server.url), sleep=waits.append).ocr(document, ["json"]) \
        .attempts == 2


def test_a_client_error_is_final_and_names_the_gateways_reason(server, document):
    server.script = [envelope(422, "The image cannot be decoded")]
    with pytest.raises(OcrFailed) as caught:
        Client(Settings(url=server.url), sleep=lambda s: None).ocr(document, ["pdf"])
    assert caught.value.attempts == 1 and caught.value.status == 422
    assert "The image cannot be decoded" in caught.value.reason


def test_several_formats_come_from_one_zip_answer(server, document):
    bundle = io.BytesIO()
    with zipfile.ZipFile(bundle, "w") as archive:
        for name, data in (("result.json", b"{}"), ("text.txt", b"hi"),
                           ("searchable.pdf", b"%PDF")):
            archive.writestr(name, data)
    server.script = [ok(bundle.getvalue(), pages=2)]
    answer = Client(Settings(url=server.url)).ocr(document, ["txt", "pdf"])
    assert answer.outputs == {"txt": b"hi", "pdf": b"%PDF"} and answer.pages == 2
    assert server.requests[0]["headers"]["Accept"] == "application/zip"


def test_output_names_mirror_the_tree_and_keep_suffixes_only_on_a_clash():
    from pathlib import Path

    names = batch.output_names([Path("a/scan.png"), Path("a/scan.jpg"), Path("b/scan.png"),
                                Path("report.pdf")], ["txt", "pdf"])
    assert names[Path("a/scan.png")]["txt"] == Path("a/scan.png.txt")
    assert names[Path("a/scan.jpg")]["pdf"] == Path("a/scan.jpg.pdf")
    assert names[Path("b/scan.png")]["txt"] == Path("b/scan.txt")
    assert names[Path("report.pdf")]["pdf"] == Path("report.pdf")


@pytest.mark.parametrize("files,collides", [
    (["x.pdf", "x.png", "x.pdf.png"], True),  # x.pdf keeps its suffix: x.pdf.txt, twice
    (["x.pdf", "x.pdf.png"], False),  # x.txt and x.pdf.txt
    (["a/x.pdf", "b/x.pdf"], False),  # the tree is mirrored
])
def test_two_inputs_never_write_one_output_the_batch_refuses_naming_both(files, collides):
    from pathlib import Path

    paths = [Path(f) for f in files]
    if collides:
        with pytest.raises(batch.OutputCollision) as caught:
            batch.output_names(paths, ["txt"])
        assert "x.pdf and x.pdf.png would both write x.pdf.txt" in str(caught.value)
        return
    written = [p for outputs in batch.output_names(paths, ["txt"]).values()
               for p in outputs.values()]
    assert len(written) == len(set(written))


def test_a_collision_is_refused_before_anything_is_sent(tmp_path, capsys):
    from ocrfleet import cli

    source = tmp_path / "in"
    source.mkdir()
    for name in ("x.pdf", "x.png", "x.pdf.png"):
        (source / name).write_bytes(b"x")
    status = cli.main(["batch", str(source), str(tmp_path / "out"), "--format", "txt",
                       "--url", "http://127.0.0.1:9"])
    assert status == 2
    err = capsys.readouterr().err
    assert "x.pdf" in err and "x.pdf.png" in err and "would both write" in err
    assert not (tmp_path / "out" / "x.pdf.txt").exists()


def test_batch_writes_each_output_once_skips_done_files_and_reports_failures(server, tmp_path):
    source, target = tmp_path / "in", tmp_path / "out"
    (source / "sub").mkdir(parents=True)
    for name in ("one.pdf", "sub/two.png", "bad.jpg", ".hidden.png", "notes.md"):
        (source / name).write_bytes(name.encode())

    def answer(headers, body):
        if b"bad.jpg" in body:
            return envelope(422, "The image cannot be decoded")
        return ok(b"%s for %s" % (headers["Accept"].encode(), body[-40:]), pages=2)

    server.default = answer
    stale = target / "sub" / f".two.txt{batch.TEMP_MARK}99-dead{batch.TEMP_SUFFIX}"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half")
    args = ["batch", str(source), str(target), "--url", server.url, "--format", "txt",
            "--no-progress", "--concurrency", "2"]
    assert cli.main(args) == 1
    written = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert written == ["ocrfleet-report.json", "one.txt", "sub/two.txt"]
    report = json.loads((target / "ocrfleet-report.json").read_text())
    assert (report["done"], report["failed"], report["pages"]) == (2, 1, 4)
    assert report["failures"][0]["file"] == "bad.jpg"
    assert "cannot be decoded" in report["failures"][0]["reason"]
    sent = len(server.requests)
    assert cli.main(args) == 1  # only the broken file is tried again
    assert len(server.requests) == sent + 1
    assert json.loads((target / "ocrfleet-report.json").read_text())[
        "skipped_already_done"] == 2


def test_ocr_command_writes_one_answer_or_exits_1_with_the_reason(server, document, tmp_path,
                                                                   capsys):
    out = tmp_path / "scan.pdf"
    assert cli.main(["ocr", str(document), "--format", "pdf", "-o", str(out),
                     "--url", server.url]) == 0
    assert out.read_bytes() == b"application/pdf"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    server.script = [envelope(413, "The file is too big")]
    assert cli.main(["ocr", str(document), "--url", server.url]) == 1
    assert "The file is too big" in capsys.readouterr().err
    assert cli.main(["ocr", str(tmp_path / "missing.png"), "--url", server.url]) == 2
    with pytest.raises(SystemExit):
        cli.main(["ocr", str(document), "--format", "txt,pdf"])


def test_batch_shows_the_share_of_pages_the_gateways_cache_answered(server, tmp_path):
    source, target = tmp_path / "in", tmp_path / "out"
    source.mkdir()
    for name in ("a.pdf", "b.pdf", "c.png"):
        (source / name).write_bytes(name.encode())

    def answer(headers, body):  # b.pdf: 3 of its 4 pages from the cache, a.pdf 0 of 4
        cached = {b"a.pdf": "0", b"b.pdf": "3"}
        name = next((n for n in cached if n in body), None)
        extra = {"X-Ocr-Cached-Pages": cached[name]} if name else {}  # c.png: cache off
        return 200, {"X-Ocr-Pages": "4" if name else "1", **extra}, b"text"

    server.default = answer
    assert Client(Settings(url=server.url)).ocr(source / "b.pdf", ["txt"]).cached == 3
    assert Client(Settings(url=server.url)).ocr(source / "c.png", ["txt"]).cached is None
    assert batch.cached_share(batch.Tally(pages=9, cached=3)) == {"cached": "3 (33%)"}
    assert batch.cached_share(batch.Tally(pages=9)) == {}  # the gateway never said
    options = batch.BatchOptions(source, target, ["txt"], progress=False)
    out = io.StringIO()
    assert batch.run(Client(Settings(url=server.url)), options, out=out) == 0
    report = json.loads((target / "ocrfleet-report.json").read_text())
    assert (report["pages"], report["cached_pages"]) == (9, 3)
    assert "(9 pages in" in out.getvalue() and "3 of them from the cache)" in out.getvalue()
    (target / "b.txt").unlink()
    server.default = lambda headers, body: (200, {"X-Ocr-Pages": "4"}, b"text")
    out = io.StringIO()  # a gateway whose cache is off: no count, nothing shown
    assert batch.run(Client(Settings(url=server.url)), options, out=out) == 0
    assert json.loads((target / "ocrfleet-report.json").read_text())["cached_pages"] is None
    assert "(4 pages in" in out.getvalue() and "from the cache" not in out.getvalue()


def test_the_progress_bar_carries_the_cached_share(server, tmp_path, monkeypatch):
    source, target = tmp_path / "in", tmp_path / "out"
    source.mkdir()
    (source / "a.pdf").write_bytes(b"a")
    server.default = lambda headers, body: (200, {"X-Ocr-Pages": "4",
                                                  "X-Ocr-Cached-Pages": "4"}, b"text")
    postfixes = []
    real = batch.tqdm

    class Recording(real):
        def set_postfix(self, *args, **kwargs):
            postfixes.append(kwargs)
            return super().set_postfix(*args, **kwargs)

    monkeypatch.setattr(batch, "tqdm", Recording)
    out = io.StringIO()
    options = batch.BatchOptions(source, target, ["txt"], progress=False)
    assert batch.run(Client(Settings(url=server.url)), options, out=out) == 0
    assert postfixes[-1]["cached"] == "4 (100%)"
    assert "4 pages in" in out.getvalue() and "4 of them from the cache" in out.getvalue()
