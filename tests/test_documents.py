"""The shared document module and TIFF splitting, without a server: the IFD-walking frame
counter agrees with Pillow, is bounded and refuses broken chains; TIFF chunks decode in the
worker to exactly the pixels of the frame inside the whole file; page limits apply alike."""

import io
import struct

import numpy as np
import pikepdf
from pikepdf import PdfImage
import pytest
from PIL import Image

from gateway.split import Chunk, TiffCutter, group_pages
from services.documents.pages import select_pages
from services.documents.pdf import count_pdf_pages
from services.documents.tiff import count_tiff_frames
from services.ocr_api.errors import ApiError
from services.ocr_api.request import OcrRequest
from services.ocr_api.sniff import sniff_kind
from services.ocr_worker.decode import DecodeLimits, decode_image, open_document


def frame(mode: str, size=(64, 48), seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    rgb = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    if mode == "P":
        return rgb.quantize(16)
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65536, (size[1], size[0]), dtype=np.uint16))
    return rgb.convert(mode)


def tiff_bytes(frames: list[Image.Image], **options) -> bytes:
    buffer = io.BytesIO()
    frames[0].save(buffer, format="TIFF", save_all=True, append_images=frames[1:], **options)
    return buffer.getvalue()


def pillow_frames(data: bytes) -> int:
    with Image.open(io.BytesIO(data)) as tiff:
        return tiff.n_frames


@pytest.mark.parametrize("count", [1, 2, 7])
@pytest.mark.parametrize("mode, bigtiff, magic", [
    ("L", False, b"II*\x00"),
    ("L", True, b"II+\x00"),
    ("I;16B", False, b"MM\x00*"),  # Pillow writes this mode big-endian
])
def test_frame_count_agrees_with_pillow(count, mode, bigtiff, magic):
    frames = [Image.frombytes(mode, (8, 8), bytes([i]) * 64 * (2 if "16" in mode else 1))
              for i in range(count)]
    data = tiff_bytes(frames, big_tiff=bigtiff)
    assert data[:4] == magic and sniff_kind(data) == "image"
    assert count_tiff_frames(data, limit=100) == count == pillow_frames(data)


def test_big_endian_bigtiff_chain_is_walked():
    # header: MM, 43, offset size 8, 0, first IFD at 16; IFDs of no entries: count(8) next(8)
    data = b"MM\x00+" + struct.pack(">HHQ", 8, 0, 16)
    data += struct.pack(">QQ", 0, 32) + struct.pack(">QQ", 0, 0)
    assert count_tiff_frames(data, limit=5) == 2


def chain(offsets_next: list[tuple[int, int]], size: int, first: int) -> bytes:
    """A classic little-endian TIFF skeleton: at each offset an IFD with no entries pointing
    to the given next offset."""
    data = bytearray(size)
    data[:8] = b"II*\x00" + struct.pack("<L", first)
    for offset, next_offset in offsets_next:
        data[offset:offset + 6] = struct.pack("<HL", 0, next_offset)
    return bytes(data)


def test_a_chain_that_loops_ends_where_it_loops_like_pillow():
    data = chain([(8, 20), (20, 32), (32, 20)], 64, first=8)
    assert count_tiff_frames(data, limit=100) == 3


def test_frames_past_the_limit_are_a_413_without_walking_further():
    links = [(8 + 6 * i, 8 + 6 * (i + 1)) for i in range(50_000)]
    links[-1] = (links[-1][0], 0)
    data = chain(links, 8 + 6 * 50_000 + 8, first=8)
    assert count_tiff_frames(data, limit=50_000) == 50_000
    with pytest.raises(ApiError) as caught:
        count_tiff_frames(data, limit=10)
    assert caught.value.status == 413 and "more than 10 pages" in caught.value.message


@pytest.mark.parametrize("data, words", [
    (b"II*\x00" + struct.pack("<L", 4000) + b"\0" * 16, "past the end"),
    (b"II*\x00" + struct.pack("<L", 0) + b"\0" * 16, "no image directory"),
    (b"II*\x00" + struct.pack("<L", 8) + struct.pack("<H", 500) + b"\0" * 16, "runs past"),
    (b"II*\x00\x01", "no header"),
    (b"II+\x00" + struct.pack("<HHQ", 4, 0, 16) + b"\0" * 16, "offset size"),
])
def test_broken_chains_are_a_422(data, words):
    with pytest.raises(ApiError) as caught:
        count_tiff_frames(data, limit=10)
    assert caught.value.status == 422 and words in caught.value.message


def worker_pixels(data: bytes, page_indices=None) -> list[np.ndarray]:
    """What the worker feeds the engine for these bytes (all frames or the selected ones)."""
    page_range = None if page_indices is None else ",".join(str(i + 1) for i in page_indices)
    request = OcrRequest(log_id="t", file_bytes=data, kind="image", page_range=page_range)
    document = open_document(request, DecodeLimits(max_pages=100, max_pixels=10**8,
                                                   pdf_dpi=144))
    try:
        return list(document.pages())
    finally:
        document.close()


@pytest.mark.parametrize("mode", ["1", "L", "RGB", "RGBA", "P", "CMYK", "I;16"])
@pytest.mark.parametrize("pages_per_chunk", [1, 2])
def test_tiff_chunks_give_the_worker_the_same_pixels_as_the_whole_file(mode, pages_per_chunk):
    frames = [frame(mode, seed=i) for i in range(5)]
    compression = "group4" if mode == "1" else "tiff_lzw"
    whole = tiff_bytes(frames, compression=compression)
    selected = [0, 2, 3, 4]
    expected = worker_pixels(whole, selected)
    cutter = TiffCutter(whole)
    chunks = [cutter.cut(group) for group in group_pages(selected, pages_per_chunk)]
    got = [pixels for chunk in chunks for pixels in worker_pixels(chunk.data)]
    assert [c.page_indices for c in chunks] == (
        [(0,), (2,), (3,), (4,)] if pages_per_chunk == 1 else [(0,), (2, 3), (4,)])
    assert all(isinstance(c, Chunk) and c.kind == "image" for c in chunks)
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected):
        assert mine.shape == theirs.shape and np.array_equal(mine, theirs)


def test_a_single_frame_chunk_decodes_with_opencv_like_the_frame_in_the_file():
    whole = tiff_bytes([frame("RGB", seed=1), frame("RGB", seed=2)])
    chunk = TiffCutter(whole).cut((1,))
    with Image.open(io.BytesIO(whole)) as tiff:
        tiff.seek(1)
        expected = np.asarray(tiff.convert("RGB"))[:, :, ::-1]
    assert np.array_equal(decode_image(chunk.data, 10**8), expected)


def test_a_16_bit_frame_reaches_the_engine_as_opencv_reads_it_alone():
    """A scanner's 16-bit gray TIFF: each frame, read from the whole file, from its chunk, or
    as the searchable PDF's page, is what OpenCV makes of that frame as a file of its own
    (each sample's high byte), not Pillow's conversion, which clipped it to a white page."""
    import cv2

    from gateway.outputs.pdf import searchable_pdf

    frames = [frame("I;16", seed=i) for i in range(3)]
    alone = [cv2.imdecode(np.frombuffer(tiff_bytes([f]), np.uint8), cv2.IMREAD_COLOR)
             for f in frames]
    assert all(pixels.std() > 30 for pixels in alone)  # noise, not a blank page
    whole = tiff_bytes(frames, compression="tiff_lzw")
    chunks = [TiffCutter(whole).cut((index,)) for index in range(3)]
    for got in (worker_pixels(whole), [worker_pixels(c.data)[0] for c in chunks]):
        assert all(np.array_equal(mine, theirs) for mine, theirs in zip(got, alone))
    with pikepdf.open(io.BytesIO(searchable_pdf(whole, "image", [], ()))) as document:
        shown = [np.asarray(PdfImage(next(iter(page.get_images().values()))).as_pil_image())
                 for page in document.pages]
    assert all(np.array_equal(mine, theirs[:, :, 0]) for mine, theirs in zip(shown, alone))


@pytest.mark.parametrize("image_format", ["PNG", "WEBP", "TIFF"])
def test_black_ink_on_a_transparent_background_reaches_the_engine_over_white(image_format):
    """OpenCV keeps the colour under the alpha, here black: the page would be all black. The
    worker reads it as a viewer shows it, over white, and a multi-frame TIFF's frames (and
    their chunks) the same."""
    page = Image.new("RGBA", (120, 40), (0, 0, 0, 0))
    page.paste((0, 0, 0, 255), (20, 10, 100, 30))
    buffer = io.BytesIO()
    page.save(buffer, format=image_format, **({"lossless": True} if image_format == "WEBP"
                                              else {}))
    seen = decode_image(buffer.getvalue(), 10**8)
    assert seen[5, 5].tolist() == [255, 255, 255] and seen[20, 60].tolist() == [0, 0, 0]
    if image_format == "TIFF":
        whole = tiff_bytes([page, page])
        for got in (worker_pixels(whole), worker_pixels(TiffCutter(whole).cut((1,)).data)):
            assert all(np.array_equal(pixels, seen) for pixels in got)


def test_an_alpha_that_hides_every_pixel_is_not_taken_as_a_blank_page():
    """A 32-bit image whose alpha was left at 0 (no-one's intent): its colours, as OpenCV
    reads them."""
    import cv2

    page = Image.new("RGBA", (120, 40), (255, 255, 255, 0))
    page.paste((0, 0, 0, 0), (20, 10, 100, 30))
    buffer = io.BytesIO()
    page.save(buffer, format="PNG")
    seen = decode_image(buffer.getvalue(), 10**8)
    assert np.array_equal(seen, cv2.imdecode(np.frombuffer(buffer.getvalue(), np.uint8),
                                             cv2.IMREAD_COLOR))
    assert seen[20, 60].tolist() == [0, 0, 0]


def test_a_16_bit_gray_png_with_a_transparent_grey_is_read_as_opencv_reads_it():
    """Its transparency names a 16-bit grey that no 8-bit sample equals once the frame is
    made 8-bit: nothing is hidden, and the worker reads it as OpenCV reads it."""
    import cv2

    samples = np.full((40, 120), 60000, np.uint16)
    samples[10:30, 20:100] = 5000
    buffer = io.BytesIO()
    Image.fromarray(samples).save(buffer, format="PNG", transparency=60000)
    assert np.array_equal(decode_image(buffer.getvalue(), 10**8), cv2.imdecode(
        np.frombuffer(buffer.getvalue(), np.uint8), cv2.IMREAD_COLOR))


def test_tiff_chunks_are_lazy_and_a_bad_frame_is_a_422_when_reached():
    whole = tiff_bytes([frame("L", seed=i) for i in range(3)])
    truncated = whole[: len(whole) - 40]
    cutter = TiffCutter(whole, max_pixels=64 * 48 - 1)  # opening reads no frame
    with pytest.raises(ApiError) as caught:
        cutter.cut((0,))
    assert caught.value.status == 422 and "Page 1" in caught.value.message
    with pytest.raises(ApiError):
        broken = TiffCutter(truncated)
        for index in range(3):
            broken.cut((index,))


def test_page_selection_and_limits_are_shared():
    assert select_pages("2-3", 5, 10) == [1, 2]
    with pytest.raises(ApiError) as caught:
        select_pages(None, 5, 4, what="TIFF", server="gateway")
    assert caught.value.status == 413 and "this gateway's limit of 4" in caught.value.message
    with pytest.raises(ApiError) as caught:
        select_pages(None, 0, 4)
    assert caught.value.status == 422


def test_pdf_pages_are_counted_and_damage_is_a_short_422():
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument.new()
    for _ in range(3):
        pdf.new_page(200, 200)
    buffer = io.BytesIO()
    pdf.save(buffer)
    pdf.close()
    assert count_pdf_pages(buffer.getvalue()) == 3
    with pytest.raises(ApiError) as caught:
        count_pdf_pages(b"%PDF-1.7\n" + b"x" * 100_000)
    assert caught.value.status == 422 and len(caught.value.message) < 300
