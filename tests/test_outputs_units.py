"""The gateway's outputs without a server: Accept negotiation, lines out of a document
result, reading order, and the searchable PDF built from given lines. The PDF is checked
with poppler as a reader would: the text comes back, each word lies in its box on rotated
and cropped pages too, page count and sizes are the input's, the original content streams
are byte-identical, and a rendered page looks exactly as before."""

import io
import itertools

import pikepdf
import pypdfium2 as pdfium
import pytest
from PIL import Image

from gateway.assemble import PageOutcome
from gateway.config import DEFAULT_PDF_FONTS, GatewayConfig
from gateway.outputs import JSON, NDJSON, PDF, TEXT, ZIP, fonts, negotiate
from gateway.outputs import paddlex
from gateway.outputs.layout import Line, PageText, page_lines
from gateway.outputs.text import document_text, rows
from samples import documents
from services.ocr_api.errors import ApiError
from tests import pdfcheck


# gateway.outputs.pdf imported on first use, as the gateway does: fpdf2 takes 0.4 s to import,
# in every pytest process that collects this module, whether or not it runs these tests.
def searchable_pdf(*args):
    from gateway.outputs.pdf import searchable_pdf as build

    return build(*args)


def placement_matrix(*args):
    from gateway.outputs.pdf import placement_matrix as matrix

    return matrix(*args)


def rect(x0, y0, x1, y1):
    return (x0, y0), (x1, y0), (x1, y1), (x0, y1)


LINES = [Line("Invoice number 4711", rect(20, 20, 300, 60)),
         Line("total amount 12.50", rect(40, 100, 330, 130)),
         Line("中文测试文本", rect(40, 160, 260, 200))]


# ---- negotiation -----------------------------------------------------------------------
@pytest.mark.parametrize("accept, expected", [
    (None, JSON), ("", JSON), ("*/*", JSON), ("application/json", JSON),
    ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", JSON),
    ("application/x-ndjson", NDJSON), ("application/x-ndjson, application/json", NDJSON),
    ("application/pdf", PDF), ("text/plain", TEXT), ("text/*", TEXT),
    ("application/zip", ZIP), ("application/pdf;q=0.5, application/json", JSON),
])
def test_accept_header_chooses_the_format(accept, expected):
    assert negotiate(accept) == expected


def test_an_accept_header_nothing_matches_is_a_406():
    with pytest.raises(ApiError) as caught:
        negotiate("image/png")
    assert caught.value.status == 406 and "application/pdf" in caught.value.message


# ---- lines and text ----------------------------------------------------------------------
def test_a_pages_layout_keeps_its_index_size_and_usable_lines():
    first = PageOutcome(3, {"prunedResult": {
        "rec_texts": ["a", " ", "b"],
        "rec_polys": [rect(0, 0, 10, 10), rect(0, 0, 1, 1), rect(0, 20, 10, 30)]}},
        {"width": 100, "height": 200})
    failed = PageOutcome(7, error_code=504, error_msg="timed out")
    image = PageOutcome(0, {"prunedResult": {"rec_texts": ["x"], "rec_boxes": [[1, 2, 3, 4]]}},
                        {"width": 9, "height": 8}, doc_type="image")
    one, two, three = (paddlex.page_layout(p) for p in (first, failed, image))
    assert (one.page_index, one.width, one.height) == (3, 100, 200)
    assert [line.text for line in one.lines] == ["a", "b"]  # the blank one is left out
    assert (two.page_index, two.lines, two.error) == (7, [], "timed out")
    assert three.lines[0].box == (1, 2, 3, 4) and (three.width, three.height) == (9, 8)


def test_ocr_and_a_job_write_the_same_text_the_rows_reading_order():
    """One writer: a page's text is its rows top to bottom, left to right, whatever the
    order the engine recognised them in (a job's text was once the raw order)."""
    page = PageOutcome(0, {"prunedResult": {
        "rec_texts": ["world", "Hello", "second"],
        "rec_polys": [rect(210, 12, 300, 42), rect(10, 10, 200, 40), rect(12, 60, 250, 92)]}},
        {"width": 400, "height": 400})
    assert b"".join(paddlex.text_chunks([page, page])) == \
        b"Hello world\nsecond\n\fHello world\nsecond\n"


def test_page_lines_skip_malformed_shapes():
    pruned = {"rec_texts": ["ok", "bad", "short"], "rec_polys": [rect(0, 0, 5, 5), "x", []],
              "rec_boxes": [[0, 0, 5, 5]]}
    assert [line.text for line in page_lines(pruned)] == ["ok"]


def test_reading_order_groups_rows_and_reads_left_to_right():
    shuffled = [Line("world", rect(210, 12, 300, 42)), Line("third", rect(10, 120, 90, 150)),
                Line("Hello", rect(10, 10, 200, 40)), Line("second row", rect(12, 60, 250, 92))]
    assert [[line.text for line in row] for row in rows(shuffled)] == \
        [["Hello", "world"], ["second row"], ["third"]]
    pages = [PageText(0, 400, 400, shuffled), PageText(1, 400, 400, []),
             PageText(2, 400, 400, [Line("last", rect(0, 0, 50, 20))])]
    assert document_text(pages) == "Hello world\nsecond row\nthird\n\f\flast\n"


# ---- fonts ---------------------------------------------------------------------------
def test_font_is_the_first_that_covers_the_text():
    assert fonts.pick_font(DEFAULT_PDF_FONTS, "Invoice 12.50") == DEFAULT_PDF_FONTS[0]
    assert fonts.pick_font(DEFAULT_PDF_FONTS, "Invoice 中文") == DEFAULT_PDF_FONTS[1]
    with pytest.raises(ApiError) as caught:
        fonts.pick_font(("/nonexistent/font.ttf",), "x")
    assert caught.value.status == 503 and "GATEWAY_PDF_FONTS" in caught.value.message
    config = GatewayConfig.from_env({"GATEWAY_REPLICAS": "http://127.0.0.1:1",
                                     "GATEWAY_PDF_FONTS": "/a.ttf, /b.ttc"})
    assert config.pdf_fonts == ("/a.ttf", "/b.ttc")


# ---- placement -----------------------------------------------------------------------
@pytest.mark.parametrize("rotate", [0, 90, 180, 270])
def test_placement_maps_the_shown_corners_onto_the_visible_box(rotate):
    box = (50.0, 40.0, 350.0, 260.0)  # 300 x 220 pt
    shown = (220, 300) if rotate in (90, 270) else (300, 220)
    a, b, c, d, e, f = placement_matrix(box, rotate, shown[0] * 2, shown[1] * 2)

    def user(u, v):
        return (round(a * u + c * v + e, 6), round(b * u + d * v + f, 6))

    corners = {user(0, 0), user(shown[0] * 2, 0), user(0, shown[1] * 2),
               user(shown[0] * 2, shown[1] * 2)}
    assert corners == {(50, 40), (350, 40), (50, 260), (350, 260)}
    # the layer's top-left corner (v = height) is where a viewer shows the top-left
    top_left = {0: (50, 260), 90: (50, 40), 180: (350, 40), 270: (350, 260)}[rotate]
    assert user(0, shown[1] * 2) == top_left


# ---- the searchable PDF ----------------------------------------------------------------
def vector_pdf(rotate=0, crop=None, media=(0, 0, 400, 300), pages=1) -> bytes:
    """Pages with a filled square and a line of real (visible) text, sharing one
    /Resources dictionary as many producers write them."""
    pdf = pikepdf.new()
    font = pdf.make_indirect(pikepdf.Dictionary(Type=pikepdf.Name.Font,
                                                Subtype=pikepdf.Name.Type1,
                                                BaseFont=pikepdf.Name.Helvetica))
    resources = pdf.make_indirect(pikepdf.Dictionary(Font=pikepdf.Dictionary(F1=font)))
    for number in range(pages):
        page = pdf.add_blank_page(page_size=(400, 300))
        page.obj.MediaBox = pikepdf.Array(list(media))
        if crop:
            page.obj.CropBox = pikepdf.Array(list(crop))
        page.obj.Rotate = rotate
        page.obj.Resources = resources
        page.obj.Contents = pdf.make_stream(
            f"0 0 1 rg {media[0] + 150} {media[1] + 60} 50 50 re f "
            f"BT /F1 9 Tf {media[0] + 120} {media[1] + 80} Td (vector {number}) Tj ET".encode())
    out = io.BytesIO()
    pdf.save(out)
    return out.getvalue()


def rendered_sizes(data: bytes) -> list[tuple[int, int]]:
    """Pixel sizes as the worker renders them (pdfium, scale 2)."""
    document = pdfium.PdfDocument(data)
    try:
        sizes = []
        for index in range(len(document)):
            bitmap = document[index].render(scale=2.0)
            sizes.append((bitmap.width, bitmap.height))
            bitmap.close()
        return sizes
    finally:
        document.close()


def check_layer(pdf_in: bytes, pdf_out: bytes, pages: list[PageText]) -> None:
    """Text back, words in their boxes, sizes kept, content identical, nothing visible."""
    pdfcheck.need_poppler()
    texts, words = pdfcheck.page_texts(pdf_out), pdfcheck.page_words(pdf_out)
    sizes = pdfcheck.page_sizes(pdf_out)
    assert len(texts) == len(pdfcheck.page_texts(pdf_in))  # page count
    assert sizes == pdfcheck.page_sizes(pdf_in)
    originals = pdfcheck.page_texts(pdf_in)
    for page in pages:
        expected = "".join(line.text for line in page.lines)
        found, original = texts[page.page_index], originals[page.page_index]
        assert pdfcheck.cer(expected, found.replace(original.strip(), "", 1)) <= 0.02, found
        width_pt, height_pt = sizes[page.page_index]
        sx, sy = width_pt / page.width, height_pt / page.height
        boxes = [(x0 * sx, y0 * sy, x1 * sx, y1 * sy)
                 for x0, y0, x1, y1 in (line.box for line in page.lines)]
        scores = pdfcheck.line_ious(boxes, words[page.page_index])
        assert min(scores) >= 0.5, scores
    before, after = pdfcheck.content_streams(pdf_in), pdfcheck.content_streams(pdf_out)
    for original, now in zip(before, after):
        assert now[1:1 + len(original)] == original and len(now) == len(original) + 2
    for old, new in zip(pdfcheck.render(pdf_in), pdfcheck.render(pdf_out)):
        assert pdfcheck.differing_pixels(old, new) == 0


@pytest.mark.parametrize("rotate", [0, 90, 180, 270])
@pytest.mark.parametrize("crop", [None, (50, 40, 350, 260)], ids=["media", "cropbox"])
def test_layer_lands_on_its_boxes_on_rotated_and_cropped_pages(rotate, crop):
    data = vector_pdf(rotate, crop)
    (width, height), = rendered_sizes(data)
    pages = [PageText(0, width, height, LINES)]
    check_layer(data, searchable_pdf(data, "pdf", pages, DEFAULT_PDF_FONTS), pages)


def test_layer_on_a_page_whose_mediabox_does_not_start_at_zero():
    data = vector_pdf(90, crop=(120, 70, 480, 330), media=(100, 50, 500, 350))
    (width, height), = rendered_sizes(data)
    pages = [PageText(0, width, height, LINES)]
    check_layer(data, searchable_pdf(data, "pdf", pages, DEFAULT_PDF_FONTS), pages)


def test_only_ocrd_pages_get_a_layer_and_shared_resources_are_left_alone():
    data = vector_pdf(pages=3)
    (width, height), *_ = rendered_sizes(data)
    pages = [PageText(1, width, height, LINES[:1]), PageText(2, width, height, [])]
    out = searchable_pdf(data, "pdf", pages, DEFAULT_PDF_FONTS)
    texts = pdfcheck.page_texts(out)
    assert "Invoice" not in texts[0] and "Invoice" in texts[1] and "Invoice" not in texts[2]
    with pikepdf.open(io.BytesIO(out)) as document:
        layers = [[n for n in p.resources.get("/XObject", {}).keys() if "OcrText" in n]
                  for p in document.pages]
        assert [len(names) for names in layers] == [0, 1, 0]
        assert document.pages[0].obj.Contents.read_bytes().startswith(b"0 0 1 rg")
    assert searchable_pdf(data, "pdf", [PageText(0, width, height, [])],
                          DEFAULT_PDF_FONTS)[:5] == b"%PDF-"


def test_image_input_becomes_one_page_per_image_at_its_resolution():
    image = documents.text_image(["Scanned receipt 42"], size=30)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", dpi=(200, 200))
    pages = [PageText(0, image.width, image.height, [Line("Scanned receipt 42",
                                                          rect(30, 30, 300, 70))])]
    out = searchable_pdf(buffer.getvalue(), "image", pages, DEFAULT_PDF_FONTS)
    (width, height), = pdfcheck.page_sizes(out)
    assert (round(width, 2), round(height, 2)) == (round(image.width * 72 / 200, 2),
                                                   round(image.height * 72 / 200, 2))
    assert "Scannedreceipt42" in "".join(pdfcheck.page_texts(out)[0].split())
    tiff = documents.labelled_tiff(3)
    out = searchable_pdf(tiff, "image", [PageText(2, 500, 100, [Line("third frame",
                                                                     rect(5, 5, 200, 40))])],
                         DEFAULT_PDF_FONTS)
    texts = pdfcheck.page_texts(out)
    assert len(texts) == 3 and "third frame" in texts[2] and not texts[0].strip()


def test_a_jpeg_the_worker_turned_upright_is_turned_the_same_way():
    image = Image.new("RGB", (300, 100), "white")
    exif = image.getexif()
    exif[0x0112] = 6  # shown rotated 90 degrees clockwise: OpenCV decodes it 100 x 300
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", exif=exif, dpi=(72, 72))
    out = searchable_pdf(buffer.getvalue(), "image",
                         [PageText(0, 100, 300, [Line("up", rect(10, 10, 60, 40))])],
                         DEFAULT_PDF_FONTS)
    assert [tuple(round(v) for v in size) for size in pdfcheck.page_sizes(out)] == [(100, 300)]


@pytest.mark.parametrize("image_format", ["JPEG", "PNG", "WEBP", "TIFF"])
def test_an_image_page_is_turned_as_the_worker_decodes_it(image_format):
    """EXIF orientation 6 (shown turned 90 degrees): the PDF's page is as wide and tall as
    the pixels the worker OCR'd, OpenCV's decoding of the same bytes, whichever way OpenCV
    turns each format (it turns JPEG and PNG; WebP it did not, and its page was turned
    anyway, the layer's boxes then across the image)."""
    import cv2
    import numpy as np

    image = Image.new("RGB", (300, 100), "white")
    exif = image.getexif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, exif=exif)
    height, width = cv2.imdecode(np.frombuffer(buffer.getvalue(), np.uint8),
                                 cv2.IMREAD_COLOR).shape[:2]
    out = searchable_pdf(buffer.getvalue(), "image",
                         [PageText(0, width, height, [Line("up", rect(10, 10, 60, 40))])],
                         DEFAULT_PDF_FONTS)
    (page_width, page_height), = pdfcheck.page_sizes(out)
    assert round(page_width / page_height, 3) == round(width / height, 3)


@pytest.mark.parametrize("image_format", ["JPEG", "PNG"])
def test_every_exif_orientation_is_drawn_as_the_worker_sees_it(image_format):
    """Each of the 8 EXIF orientations: poppler's rendering of the page shows what OpenCV
    decodes (the worker's pixels, upright), the image embedded as stored (a JPEG byte for
    byte) and turned by the drawing."""
    import cv2
    import numpy as np
    import pikepdf

    pdfcheck.need_poppler()
    quadrants = Image.new("RGB", (60, 40), "red")
    for box, colour in (((30, 0, 60, 20), "lime"), ((0, 20, 30, 40), "blue"),
                        ((30, 20, 60, 40), "yellow")):
        quadrants.paste(colour, box)
    for orientation in range(1, 9):
        exif = quadrants.getexif()
        exif[0x0112] = orientation
        buffer = io.BytesIO()
        quadrants.save(buffer, format=image_format, exif=exif, dpi=(72, 72), quality=95)
        seen = cv2.imdecode(np.frombuffer(buffer.getvalue(), np.uint8), cv2.IMREAD_COLOR)
        out = searchable_pdf(buffer.getvalue(), "image", [], DEFAULT_PDF_FONTS)
        shown = np.asarray(pdfcheck.render(out, dpi=72)[0].convert("RGB"), dtype=int)
        assert shown.shape[:2] == seen.shape[:2], orientation
        height, width = seen.shape[:2]
        for y in (height // 4, 3 * height // 4):
            for x in (width // 4, 3 * width // 4):
                assert np.abs(shown[y, x] - seen[y, x, ::-1].astype(int)).max() < 48, (
                    orientation, x, y)
        with pikepdf.open(io.BytesIO(out)) as document:
            image, = document.pages[0].get_images().values()
            assert (image.Width, image.Height) == (60, 40)
            if image_format == "JPEG":
                assert image.read_raw_bytes() == buffer.getvalue()


def test_every_format_mode_and_orientation_gives_a_page_of_the_workers_shape():
    """Whatever an image is (each format Pillow writes here, each mode, each EXIF
    orientation), its PDF page has the shape of the pixels the worker OCR'd, so the layer's
    boxes land on the image."""
    from services.ocr_worker.decode import decode_image

    checked = 0
    for image_format, mode, orientation in itertools.product(
            ["JPEG", "PNG", "WEBP", "BMP", "TIFF"], ["1", "L", "LA", "P", "RGB", "RGBA"],
            range(1, 9)):
        image = Image.new("RGB", (90, 30), "white")
        image.paste((0, 0, 0), (10, 5, 40, 25))
        image = image.convert(mode)
        exif = image.getexif()
        exif[0x0112] = orientation
        buffer = io.BytesIO()
        try:
            image.save(buffer, format=image_format, exif=exif)
        except (OSError, ValueError, KeyError):
            continue  # a mode the format cannot hold
        height, width = decode_image(buffer.getvalue(), 10**8).shape[:2]
        (page_width, page_height), = pdfcheck.page_sizes(
            searchable_pdf(buffer.getvalue(), "image", [], DEFAULT_PDF_FONTS))
        assert abs(page_width / page_height - width / height) < 0.02, (
            image_format, mode, orientation)
        checked += 1
    assert checked > 150


def test_a_pdf_pikepdf_cannot_read_is_a_422():
    with pytest.raises(ApiError) as caught:
        searchable_pdf(b"%PDF-1.7 nothing else", "pdf", [], DEFAULT_PDF_FONTS)
    assert caught.value.status == 422


# ---- the builder process ---------------------------------------------------------------
def padded_pdf(megabytes: int, streams: int = 1) -> bytes:
    """A valid one-page PDF carrying `megabytes` of random bytes in `streams` streams its page
    refers to (as a scan's pages carry their images), so a rewrite copies them through."""
    import os

    with pikepdf.open(io.BytesIO(documents.labelled_pdf(1, lines_per_page=0))) as padded:
        padded.pages[0].obj.Padding = pikepdf.Array([
            pikepdf.Stream(padded, os.urandom(megabytes * 2**20 // streams))
            for _ in range(streams)])
        out = io.BytesIO()
        padded.save(out, compress_streams=False)
    return out.getvalue()


def test_a_large_document_is_rewritten_without_its_bytes_held_in_the_builder(
        tmp_path, monkeypatch):
    """150 MB in 30 streams (a scan's images) under the default 512 MB builder: the builder
    reads the input from a file and writes the PDF to one (holding the document and the PDF
    in its memory, as it once did, takes it past 512 MB). Their disk comes from the budget
    while they are needed, and nothing is left behind."""
    import tempfile

    from gateway.outputs.sandbox import PdfBuilder
    from gateway.outputs.spool import DiskBudget

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    data, budget = padded_pdf(150, streams=30), DiskBudget(1 << 30)
    width, height = pdfcheck.page_sizes(data)[0]
    pdf = PdfBuilder().build(data, "pdf", [PageText(0, width, height, LINES[:1])],
                             DEFAULT_PDF_FONTS, budget)
    try:
        assert budget.used == pdf.size > len(data)  # the input's copy given back
        built = pdf.read()
        assert len(built) == pdf.size and pdfcheck.page_sizes(built) == [(width, height)]
        assert "Invoice number 4711" in pdfcheck.page_texts(built)[0]
    finally:
        pdf.close()
    assert budget.used == 0 and not list(tmp_path.glob("ocrfleet-*"))


def test_a_build_the_disk_budget_cannot_hold_is_a_503_before_it_starts(tmp_path, monkeypatch):
    import tempfile

    from gateway.outputs.sandbox import PdfBuilder
    from gateway.outputs.spool import DiskBudget

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    data = documents.labelled_pdf(1)
    with pytest.raises(ApiError) as caught:
        PdfBuilder().build(data, "pdf", [], (), DiskBudget(len(data) + 100))
    assert caught.value.status == 503
    assert not list(tmp_path.glob("ocrfleet-*"))


def test_a_stream_the_builder_cannot_copy_is_a_422_not_a_pdf_without_it():
    """qpdf writes a stream it has no memory to copy as empty, and only warns: the builder
    answers 422 rather than a searchable PDF that lost 100 MB of the document."""
    from gateway.outputs.sandbox import PdfBuilder, SandboxLimits

    data = padded_pdf(100)
    width, height = pdfcheck.page_sizes(data)[0]
    with pytest.raises(ApiError) as caught:
        PdfBuilder(SandboxLimits(memory_mb=256)).build(
            data, "pdf", [PageText(0, width, height, LINES[:1])], DEFAULT_PDF_FONTS)
    assert caught.value.status == 422 and "memory" in caught.value.message


def noise_tiff(count: int, size: tuple[int, int]) -> tuple[list[Image.Image], bytes]:
    """`count` gray frames of noise (height, width), as a scan's LZW TIFF: what a Flate
    stream cannot make smaller."""
    import numpy as np

    rng = np.random.default_rng(0)
    frames = [Image.fromarray(rng.integers(0, 256, size, dtype=np.uint8)) for _ in range(count)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="TIFF", save_all=True, append_images=frames[1:],
                   compression="tiff_lzw")
    return frames, buffer.getvalue()


def test_a_many_frame_tiff_is_made_a_pdf_a_page_at_a_time():
    """40 scanned frames (56 MB of pixels as Flate) under a 256 MB builder: written a page
    at a time (fpdf2, which held every page until the end, ran out of memory here), every
    frame a page at its size with its pixels as they were, and the layer on its own page."""
    import pikepdf
    from pikepdf import PdfImage

    from gateway.outputs.sandbox import PdfBuilder, SandboxLimits

    frames, tiff = noise_tiff(40, (1400, 1000))
    pdf = PdfBuilder(SandboxLimits(memory_mb=256)).build(
        tiff, "image", [PageText(6, 1000, 1400, LINES[:1])], DEFAULT_PDF_FONTS)
    try:
        built = pdf.read()
    finally:
        pdf.close()
    assert pdfcheck.page_sizes(built) == [(480.0, 672.0)] * 40  # 150 dpi, none recorded
    texts = pdfcheck.page_texts(built)
    assert "Invoice number 4711" in texts[6] and not "".join(texts[:6] + texts[7:]).strip()
    with pikepdf.open(io.BytesIO(built)) as document:
        for index in (0, 39):
            image, = document.pages[index].get_images().values()
            assert PdfImage(image).as_pil_image().tobytes() == frames[index].tobytes()


def test_a_jpeg_is_embedded_as_it_is():
    import pikepdf

    page = documents.text_image(["Kept as sent"], size=30)
    for mode in ("L", "RGB"):
        buffer = io.BytesIO()
        page.convert(mode).save(buffer, format="JPEG", quality=80)
        out = searchable_pdf(buffer.getvalue(), "image", [], DEFAULT_PDF_FONTS)
        with pikepdf.open(io.BytesIO(out)) as document:
            image, = document.pages[0].get_images().values()
            assert image.Filter == "/DCTDecode"
            assert image.read_raw_bytes() == buffer.getvalue()


def test_an_image_page_keeps_its_pixels_whatever_its_mode():
    """Bilevel, gray and RGB pixels as they are; a palette as RGB; transparency over white
    (as a viewer shows it on a page)."""
    import pikepdf
    from pikepdf import PdfImage

    page = documents.text_image(["Mode check"], size=30)
    ink = Image.new("RGBA", page.size, (0, 0, 0, 0))  # black ink on clear black
    ink.paste((0, 0, 0, 255), (10, 10, 60, 30))
    on_white = Image.new("RGB", page.size, "white")
    on_white.paste((0, 0, 0), (10, 10, 60, 30))
    cases = [(page.convert("1"), page.convert("1")), (page.convert("L"), page.convert("L")),
             (page.convert("RGB"), page.convert("RGB")),
             (page.convert("P"), page.convert("P").convert("RGB")), (ink, on_white)]
    for given, shown in cases:
        buffer = io.BytesIO()
        given.save(buffer, format="PNG")
        out = searchable_pdf(buffer.getvalue(), "image", [], DEFAULT_PDF_FONTS)
        with pikepdf.open(io.BytesIO(out)) as document:
            image, = document.pages[0].get_images().values()
            assert PdfImage(image).as_pil_image().convert(shown.mode).tobytes() \
                == shown.tobytes(), given.mode


def test_an_image_too_large_for_the_builder_says_so():
    """One frame whose pixels do not fit a small builder: a 422 that names the builder's
    memory (it once said "The image cannot be turned into a PDF page ()", the MemoryError's
    empty text)."""
    from gateway.outputs.sandbox import PdfBuilder, SandboxLimits

    _, tiff = noise_tiff(1, (7000, 7000))
    with pytest.raises(ApiError) as caught:
        PdfBuilder(SandboxLimits(memory_mb=256)).build(tiff, "image", [], DEFAULT_PDF_FONTS)
    assert caught.value.status == 422 and "more memory than a builder" in caught.value.message
