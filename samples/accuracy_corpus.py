"""The accuracy corpus: pages with ground truth, for choosing an engine setting on evidence
(`make bench-accuracy`, loadtest/bench_accuracy.py). Provenance: samples/corpus/PROVENANCE.md.

1. Born-digital PDFs made here with reportlab (English prose in three fonts and sizes, a ruled
   invoice table, Chinese prose and a Chinese table). The truth is each page's text layer as
   pypdfium2 extracts it, so nothing is typed twice.
2. Real scans from a permissively licensed PyPI package: OCRmyPDF's source distribution
   (pinned, SHA-256 checked, fetched with `pip download`, cached under bench/corpus/) ships
   test scans; two are used, with transcriptions made for this project in samples/corpus/.

3. Synthetic scans (samples/scans.py's `scanned`: skew, blur, tint, noise, 8-bit gray) of
   pages drawn here at a given resolution, whose drawn text is the truth: a 7-point table, a
   page with 6.5-point footnotes, an 8-point receipt, Chinese prose, a dense A4 letter. At
   300 dpi they are part of the engine-setting comparison (their own kind); at 150, 200, 300
   and 400 dpi, each sent as an image and as an image-only PDF holding exactly the same
   pixels (`image_only_pdf`, Flate, checked by `is_pixel_exact`), they are bench_accuracy's
   scan-PDF part (issue 26).

Every page is rendered by the worker's own decoder (services/ocr_worker/decode.py: born-digital
PDFs at 144 DPI, a scanned PDF page at its image's resolution), so the engine sees the pixels
it sees in production."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import random
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from samples import documents
from scripts.fleet import REPO_ROOT

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
CACHE_DIR = REPO_ROOT / "bench" / "corpus"

SCAN_PACKAGE = "ocrmypdf==17.13.0"
SCAN_SDIST = "ocrmypdf-17.13.0.tar.gz"
SCAN_SDIST_SHA256 = "151c35d810eb628fbc5cb9bbe80b834ecf094737efa0e7a2e9e1fac3c730ed49"
# file inside the sdist -> our transcription
SCANS = {"c03-29.pdf": "huckfinn-c03-29.txt", "typewriter.png": "typewriter-linzensoep.txt"}


@dataclass
class CorpusPage:
    name: str
    image: np.ndarray  # BGR, as the worker renders it
    truth: list[str]  # lines in reading order
    kind: str  # "born-digital", "synthetic scan" or "scan" (a real one)


# ---- born-digital documents -----------------------------------------------------------------
_NAMES = ("Smith", "Garcia", "Okafor", "Lindqvist", "Tanaka", "Moreau", "Kowalski", "Brennan")
_THINGS = ("invoice", "contract", "purchase order", "delivery note", "budget review",
           "maintenance report", "shipping manifest", "payment reminder", "audit summary")
_VERBS = ("approved", "received", "signed", "returned", "updated", "archived", "disputed")
_PLACES = ("Rotterdam", "Leeds", "Osaka", "Lyon", "Gdansk", "Toronto", "Nairobi", "Porto")


def english_sentences(count: int, seed: int) -> list[str]:
    """Business prose with what OCR gets wrong: initials, figures, dates, codes, punctuation."""
    rng = random.Random(seed)
    made = []
    for _ in range(count):
        name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
        amount = f"{rng.randint(100, 99999):,}.{rng.randint(0, 99):02d}"
        date = f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/20{rng.randint(10, 29)}"
        made.append(rng.choice((
            f"The {thing} for {rng.choice(_PLACES)} was {rng.choice(_VERBS)} on {date} and "
            f"filed by {chr(65 + rng.randint(0, 25))}. {name}.",
            f"Total due: EUR {amount} (reference {rng.randint(1000, 9999)}-"
            f"{chr(65 + rng.randint(0, 25))}{rng.randint(10, 99)}), payable within "
            f"{rng.choice((14, 30, 60))} days.",
            f"Please contact {name.lower()}@example.org about the {thing}; the office in "
            f"{rng.choice(_PLACES)} closes at {rng.randint(4, 7)}:{rng.choice(('00', '30'))} pm.",
            f"Item {rng.randint(1, 40)} of the {thing} lists {rng.randint(2, 500)} units at "
            f"{rng.randint(1, 900)}.{rng.randint(0, 99):02d} each, {rng.randint(5, 25)}% VAT "
            f"included.",
        )))
    return made


_ZH_SUBJECTS = ("本公司", "客户", "项目组", "财务部门", "供应商", "我们", "销售经理", "董事会")
_ZH_VERBS = ("已经收到", "正在处理", "确认了", "提交了", "审核了", "修改了", "批准了")
_ZH_OBJECTS = ("上个月的发票", "合同的第二版", "付款申请", "年度预算报告", "货物清单",
               "会议纪要", "运输计划", "质量检查报告", "新的报价单")


def chinese_sentences(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    made = []
    for _ in range(count):
        head = f"{rng.choice(_ZH_SUBJECTS)}{rng.choice(_ZH_VERBS)}{rng.choice(_ZH_OBJECTS)}"
        made.append(head + rng.choice((
            f"，金额为{rng.randint(100, 99999)}元。",
            f"，日期是20{rng.randint(10, 29)}年{rng.randint(1, 12)}月{rng.randint(1, 28)}日。",
            "，请尽快回复。",
            f"，共{rng.randint(2, 60)}页，编号{rng.randint(1000, 9999)}。",
        )))
    return made


def _register_fonts() -> dict[str, str]:
    """reportlab names of the TrueType fonts the project installs (DejaVu, WenQuanYi)."""
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont

    fonts = {}
    latin = documents.find_font(documents.LATIN_FONTS)
    if latin:
        pdfmetrics.registerFont(TTFont("DejaVuSans", latin))
        fonts["latin"] = "DejaVuSans"
    cjk = documents.find_font(documents.CJK_FONTS)
    if cjk:
        pdfmetrics.registerFont(TTFont("CJK", cjk, subfontIndex=0))
        fonts["cjk"] = "CJK"
    return fonts


def _pdf(flowables) -> bytes:
    from reportlab.lib.pagesizes import A4
    from reportlab.lib.units import mm
    from reportlab.platypus import SimpleDocTemplate

    buffer = io.BytesIO()
    SimpleDocTemplate(buffer, pagesize=A4, leftMargin=20 * mm, rightMargin=20 * mm,
                      topMargin=18 * mm, bottomMargin=18 * mm,
                      invariant=1).build(flowables)
    return buffer.getvalue()


def _prose(title: str, sentences: list[str], font: str, size: float, per_paragraph: int = 4):
    from reportlab.lib.styles import ParagraphStyle
    from reportlab.platypus import Paragraph, Spacer

    body = ParagraphStyle("body", fontName=font, fontSize=size, leading=size * 1.35,
                          wordWrap="CJK" if font == "CJK" else None)
    heading = ParagraphStyle("heading", parent=body, fontSize=size * 1.6, leading=size * 2.2)
    flow = [Paragraph(title, heading), Spacer(1, size)]
    for start in range(0, len(sentences), per_paragraph):
        flow += [Paragraph(" ".join(sentences[start:start + per_paragraph])
                           if font != "CJK" else "".join(sentences[start:start + per_paragraph]),
                           body), Spacer(1, size * 0.6)]
    return flow


def _table(title: str, header: list[str], rows: list[list[str]], font: str, size: float):
    from reportlab.lib import colors
    from reportlab.lib.styles import ParagraphStyle
    from reportlab.platypus import Paragraph, Spacer, Table, TableStyle

    heading = ParagraphStyle("heading", fontName=font, fontSize=size * 1.5, leading=size * 2)
    table = Table([header] + rows, repeatRows=1)
    table.setStyle(TableStyle([("FONT", (0, 0), (-1, -1), font, size),
                               ("GRID", (0, 0), (-1, -1), 0.5, colors.black),
                               ("BACKGROUND", (0, 0), (-1, 0), colors.lightgrey),
                               ("ALIGN", (1, 1), (-1, -1), "RIGHT")]))
    return [Paragraph(title, heading), Spacer(1, size), table]


def _invoice_rows(seed: int, count: int) -> list[list[str]]:
    rng = random.Random(seed)
    rows = []
    for number in range(1, count + 1):
        quantity, price = rng.randint(1, 250), rng.randint(50, 99999) / 100
        rows.append([f"{number}", f"SKU-{rng.randint(10000, 99999)}",
                     rng.choice(documents.WORDS).capitalize() + " " + rng.choice(documents.WORDS),
                     str(quantity), f"{price:,.2f}", f"{quantity * price:,.2f}"])
    return rows


def _zh_rows(seed: int, count: int) -> list[list[str]]:
    rng = random.Random(seed)
    goods = ("办公桌", "打印纸", "显示器", "键盘", "文件柜", "投影仪", "路由器", "会议椅")
    cities = ("北京", "上海", "广州", "深圳", "杭州", "成都", "南京", "武汉")
    return [[str(n), rng.choice(goods), rng.choice(cities), str(rng.randint(1, 90)),
             f"{rng.randint(100, 9999)}.{rng.randint(0, 99):02d}"] for n in range(1, count + 1)]


def born_digital_pdfs() -> dict[str, bytes]:
    """name -> PDF bytes, deterministic (reportlab invariant mode)."""
    fonts = _register_fonts()
    made = {
        "en-prose-helvetica-10pt": _pdf(_prose("Quarterly operations summary",
                                               english_sentences(34, 1), "Helvetica", 10)),
        "en-prose-times-12pt": _pdf(_prose("Minutes of the supplier meeting",
                                           english_sentences(24, 2), "Times-Roman", 12)),
        "en-prose-courier-9pt": _pdf(_prose("Shipping log", english_sentences(30, 3),
                                            "Courier", 9)),
        "en-invoice-table": _pdf(_table("Invoice 2024-0117",
                                        ["#", "SKU", "Item", "Qty", "Unit price", "Amount"],
                                        _invoice_rows(4, 28), "Helvetica", 10)),
    }
    if "latin" in fonts:
        made["en-prose-dejavu-8pt"] = _pdf(_prose("Terms and conditions",
                                                  english_sentences(40, 5), "DejaVuSans", 8))
    if "cjk" in fonts:
        made["zh-prose"] = _pdf(_prose("年度工作报告", chinese_sentences(40, 6), "CJK", 11))
        made["zh-table"] = _pdf(_table("采购清单", ["序号", "商品", "城市", "数量", "单价"],
                                       _zh_rows(7, 22), "CJK", 11))
    return made


def text_layer(pdf: bytes) -> list[list[str]]:
    """Each page's text as pdfium extracts it, one entry per line."""
    import pypdfium2 as pdfium

    document = pdfium.PdfDocument(pdf)
    try:
        pages = []
        for page in document:
            text = page.get_textpage().get_text_range()
            pages.append([line.strip() for line in text.splitlines() if line.strip()])
        return pages
    finally:
        document.close()


# ---- real scans -----------------------------------------------------------------------------
def fetch_scan_sdist(cache_dir: Path = CACHE_DIR) -> Path:
    """OCRmyPDF's sdist from PyPI via pip (no build: --no-deps, source only for this one
    package), checked against its pinned SHA-256."""
    path = cache_dir / SCAN_SDIST
    if not (path.is_file() and _sha256(path) == SCAN_SDIST_SHA256):
        cache_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--no-binary", "ocrmypdf", SCAN_PACKAGE, "-d", str(cache_dir)],
                       check=True, timeout=600)
    digest = _sha256(path)
    if digest != SCAN_SDIST_SHA256:
        raise RuntimeError(f"{path}: SHA-256 {digest}, expected {SCAN_SDIST_SHA256}")
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def scan_files(cache_dir: Path = CACHE_DIR) -> dict[str, bytes]:
    with tarfile.open(fetch_scan_sdist(cache_dir)) as archive:
        return {name: archive.extractfile(f"ocrmypdf-17.13.0/tests/resources/{name}").read()
                for name in SCANS}


def transcription(name: str) -> list[str]:
    return [line.strip() for line in (CORPUS_DIR / name).read_text(encoding="utf-8")
            .splitlines() if line.strip()]


# ---- rendering ------------------------------------------------------------------------------
def render(data: bytes, dpi: float = 144.0) -> list[np.ndarray]:
    """Pages as the worker renders them (its decoder, its limits' defaults)."""
    from services.ocr_api.request import parse_ocr_request
    from services.ocr_worker.config import WorkerConfig
    from services.ocr_worker.decode import DecodeLimits, open_document

    config = WorkerConfig()
    request = parse_ocr_request({"file": base64.b64encode(data).decode("ascii")},
                                max_bytes=config.max_bytes)
    document = open_document(request, DecodeLimits(max_pages=config.max_pages,
                                                   max_pixels=config.max_pixels, pdf_dpi=dpi))
    try:
        return list(document.pages())
    finally:
        document.close()


def corpus(include_scans: bool = True) -> list[CorpusPage]:
    """Born-digital pages, the synthetic scans at 300 dpi (as PNG images) and, unless
    BENCH_ACCURACY_SCANS=0, the real scans: three kinds, each reported on its own."""
    pages = []
    for name, pdf in born_digital_pdfs().items():
        for number, (image, truth) in enumerate(zip(render(pdf), text_layer(pdf)), start=1):
            pages.append(CorpusPage(f"{name}/p{number}", image, truth, "born-digital"))
    for name in QUICK_SYNTHETIC:
        scan = synthetic_scan(name, 300)
        if scan is not None:
            [image] = render(documents.to_png(scan.image))
            pages.append(CorpusPage(f"synthetic-scan/{name}@300dpi", image, scan.truth,
                                    "synthetic scan"))
    if include_scans and os.environ.get("BENCH_ACCURACY_SCANS", "1") != "0":
        for name, data in scan_files().items():
            [image] = render(data)[:1]
            pages.append(CorpusPage(f"scan/{name}", image, transcription(SCANS[name]), "scan"))
    return pages


# ---- scans at 150-400 dpi, sent as images and as image-only PDFs (issue 26) ----------------
SCAN_DPIS = (150, 200, 300, 400)
MONO_FONTS = ("/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf",)


@dataclass
class ScanPage:
    """One scan: its pixels (RGB) at the resolution it was scanned at, and its text."""
    name: str
    dpi: float
    image: "Image.Image"
    truth: list[str]
    source: str  # "synthetic" (samples/scans.py's scanner over a page drawn here) or "real"


class _Sheet:
    """A paper page drawn at `dpi`: positions and sizes in points, so every resolution shows
    the same page; the text drawn is the truth, line by line in reading order."""

    def __init__(self, width_in: float, height_in: float, dpi: float):
        from PIL import Image, ImageDraw

        self.dpi = dpi
        self.image = Image.new("RGB", (round(width_in * dpi), round(height_in * dpi)), "white")
        self.draw = ImageDraw.Draw(self.image)
        self.lines: list[str] = []

    def px(self, points: float) -> int:
        return round(points * self.dpi / 72)

    def text(self, x_pt: float, y_pt: float, text: str, font: str, size_pt: float,
             right: bool = False, truth: bool = True) -> None:
        face = documents._font(font, max(6, self.px(size_pt)))
        x = self.px(x_pt) - (face.getlength(text) if right else 0)
        self.draw.text((x, self.px(y_pt)), text, fill="black", font=face)
        if truth:
            self.lines.append(text)

    def paragraph(self, x_pt: float, y_pt: float, text: str, font: str, size_pt: float,
                  width_pt: float, leading_pt: float, cjk: bool = False,
                  bottom_pt: float = float("inf")) -> float:
        """`text` wrapped to `width_pt` (`_wrap`), a line every `leading_pt` from `y_pt`, none
        below `bottom_pt`; returns where the next line would go."""
        for line in _wrap(text, font, size_pt, width_pt, cjk):
            if y_pt > bottom_pt:
                break
            self.text(x_pt, y_pt, line, font, size_pt)
            y_pt += leading_pt
        return y_pt

    def rule(self, x0_pt: float, y0_pt: float, x1_pt: float, y1_pt: float,
             width_pt: float = 0.5) -> None:
        self.draw.line([(self.px(x0_pt), self.px(y0_pt)), (self.px(x1_pt), self.px(y1_pt))],
                       fill="black", width=max(1, self.px(width_pt)))


def _wrap(text: str, font: str, size_pt: float, width_pt: float, cjk: bool = False
          ) -> list[str]:
    """Greedy line breaks measured at a fixed reference size, so they are the same at every
    resolution (hinting would otherwise move a word from one line to the next)."""
    face = documents._font(font, 200)
    limit = width_pt * 200 / size_pt
    tokens = list(text) if cjk else text.split(" ")
    lines, current = [], ""
    for token in tokens:
        candidate = token if not current else current + ("" if cjk else " ") + token
        if current and face.getlength(candidate) > limit:
            lines.append(current)
            current = token
        else:
            current = candidate
    return lines + ([current] if current else [])


def _latin() -> str:
    return documents.find_font(documents.LATIN_FONTS)


def table_small_print(dpi: float, seed: int = 11) -> _Sheet:
    """A statement printed in 7-point type: a ruled table of 16 rows over half an A4 page
    (landscape A5), a 6-point note under it."""
    rng = random.Random(seed)
    sheet, font = _Sheet(8.27, 5.83, dpi), _latin()
    sheet.text(36, 30, f"Statement of account {rng.randint(1000, 9999)}-Q3", font, 11)
    sheet.text(36, 50, "All amounts in EUR excluding VAT; balances as of the last business "
               "day of the quarter.", font, 7)
    columns = [36, 96, 160, 380, 430, 490, 559]  # left edges, the last is the table's end
    header = ["Date", "Ref", "Description", "Qty", "Unit", "Amount"]
    rows = [header]
    for _ in range(16):
        quantity, price = rng.randint(1, 250), rng.randint(50, 99999) / 100
        rows.append([f"{rng.randint(1, 28):02d}/{rng.randint(7, 9):02d}/2024",
                     f"{chr(65 + rng.randint(0, 25))}{rng.randint(1000, 9999)}",
                     f"{rng.choice(documents.WORDS).capitalize()} {rng.choice(documents.WORDS)}"
                     f" {rng.choice(documents.WORDS)}",
                     str(quantity), f"{price:,.2f}", f"{quantity * price:,.2f}"])
    top, row_h = 66, 15
    for index, row in enumerate(rows):
        y = top + index * row_h
        sheet.rule(columns[0], y, columns[-1], y)
        for column, cell in enumerate(row):
            numeric = column >= 3
            x = columns[column + 1] - 4 if numeric else columns[column] + 4
            sheet.text(x, y + 4, cell, font, 7, right=numeric, truth=False)
        sheet.lines.append(" ".join(row))
    bottom = top + len(rows) * row_h
    sheet.rule(columns[0], bottom, columns[-1], bottom)
    for x in columns:
        sheet.rule(x, top, x, bottom)
    phone = f"{rng.randint(100, 999)} {rng.randint(1000, 9999)} {rng.randint(100, 999)}"
    note = (f"Questions about this statement: call {phone} or write to accounts@example.org "
            "quoting your reference.")
    sheet.text(36, bottom + 10, note, font, 6)
    return sheet


def footnotes(dpi: float, seed: int = 12) -> _Sheet:
    """A report page: 10-point prose, a rule, and footnotes in 6.5-point type."""
    sheet, font = _Sheet(8.27, 5.83, dpi), _latin()
    sheet.text(36, 28, "Annual review of the supplier network", font, 12)
    y = sheet.paragraph(36, 52, " ".join(english_sentences(13, seed)), font, 10, 523, 13.5)
    y += 8
    sheet.rule(36, y, 200, y)
    y += 6
    for number, sentence in enumerate(english_sentences(9, seed + 100), start=1):
        y = sheet.paragraph(36, y, f"{number} {sentence}", font, 6.5, 523, 8.5)
    return sheet


def receipt(dpi: float, seed: int = 13) -> _Sheet:
    """A till receipt, 80 mm wide, in 8-point monospaced type."""
    rng = random.Random(seed)
    font = documents.find_font(MONO_FONTS) or _latin()
    items = [(f"{rng.choice(documents.WORDS).upper()} {rng.randint(1, 99)}",
              f"{rng.randint(50, 9999) / 100:.2f}") for _ in range(22)]
    sheet = _Sheet(3.15, (60 + (len(items) + 7) * 11) / 72, dpi)
    sheet.text(12, 12, f"SUPERMARKET No. {rng.randint(100, 999)}", font, 10)
    sheet.text(12, 28, f"{rng.randint(1, 28):02d}.{rng.randint(1, 12):02d}.2024 "
               f"{rng.randint(7, 21):02d}:{rng.randint(0, 59):02d} till {rng.randint(1, 9)}",
               font, 8)
    y = 48
    for name, price in items:
        sheet.text(12, y, name, font, 8, truth=False)
        sheet.text(214, y, price, font, 8, right=True, truth=False)
        sheet.lines.append(f"{name} {price}")
        y += 11
    total = sum(float(price) for _, price in items)
    sheet.text(12, y + 6, "TOTAL", font, 9, truth=False)
    sheet.text(214, y + 6, f"{total:.2f}", font, 9, right=True, truth=False)
    sheet.lines.append(f"TOTAL {total:.2f}")
    sheet.text(12, y + 24, f"VAT included {total * 0.19 / 1.19:.2f}", font, 7)
    return sheet


def chinese(dpi: float, seed: int = 14) -> _Sheet | None:
    """Chinese prose in 10-point type over half an A4 page (None without a CJK font)."""
    font = documents.find_font(documents.CJK_FONTS)
    if font is None:
        return None
    sheet = _Sheet(8.27, 5.83, dpi)
    sheet.text(36, 28, "第三季度工作总结", font, 13)
    sheet.paragraph(36, 54, "".join(chinese_sentences(22, seed)), font, 10, 523, 15, cjk=True)
    return sheet


def dense_letter(dpi: float, seed: int = 15) -> _Sheet:
    """A full A4 page of 10-point prose (about 50 lines)."""
    sheet, font = _Sheet(8.27, 11.69, dpi), _latin()
    sheet.text(50, 40, "Minutes of the operations committee", font, 13)
    sheet.paragraph(50, 68, " ".join(english_sentences(40, seed)), font, 10, 495, 14,
                    bottom_pt=800)
    return sheet


SYNTHETIC = {"table-small-print": table_small_print, "footnotes-6.5pt": footnotes,
             "receipt-8pt": receipt, "zh-prose": chinese, "dense-a4": dense_letter}
QUICK_SYNTHETIC = ("table-small-print", "footnotes-6.5pt", "receipt-8pt", "zh-prose")


def synthetic_scan(name: str, dpi: float) -> ScanPage | None:
    from samples import scans

    sheet = SYNTHETIC[name](dpi)
    if sheet is None:
        return None
    index = sorted(SYNTHETIC).index(name)
    skew = random.Random(index).uniform(-0.25, 0.25)  # the same sheet on the glass at every dpi
    return ScanPage(name, dpi, scans.scanned(sheet.image, dpi, index * 1000 + int(dpi), skew),
                    sheet.lines, "synthetic")


def real_scans() -> list[ScanPage]:
    """OCRmyPDF's two scans as pixels: the Huckleberry Finn page's JPEG as decoded (150 dpi,
    its PDF's own) and the typewriter PNG (no resolution recorded: 400 dpi assumed)."""
    from PIL import Image

    files = scan_files()
    [book] = render(files["c03-29.pdf"])  # 770 x 995 px, its image's own pixels
    typewriter = Image.open(io.BytesIO(files["typewriter.png"])).convert("RGB")
    return [ScanPage("real/huckfinn-c03-29", 150, Image.fromarray(book[:, :, ::-1].copy()),
                     transcription(SCANS["c03-29.pdf"]), "real"),
            ScanPage("real/typewriter", 400, typewriter,
                     transcription(SCANS["typewriter.png"]), "real")]


def image_only_pdf(image: "Image.Image", dpi: float) -> bytes:
    """One page holding only this image, drawn at `dpi` (the page size a scanner writes),
    stored losslessly (Flate, gray or RGB as the image is), so the PDF holds exactly the
    image's pixels, as img2pdf would embed a PNG. Pillow's PDF writer is not used: it stores
    gray and RGB as JPEG."""
    import zlib

    import pikepdf

    from samples import scans

    image = image if image.mode in ("L", "RGB") else image.convert("RGB")
    document = pikepdf.new()
    scans.add_image_page(document, zlib.compress(image.tobytes(), 6), image.size,
                         image.mode == "L", dpi, "FlateDecode")
    buffer = io.BytesIO()
    document.save(buffer, static_id=True)
    return buffer.getvalue()


def embedded_image(pdf: bytes) -> tuple[list[str], np.ndarray]:
    """The filters and the decoded pixels of the one image on the PDF's first page."""
    import pikepdf

    with pikepdf.open(io.BytesIO(pdf)) as document:
        [image] = document.pages[0].get_images().values()
        filters = image.get("/Filter")
        names = [str(f) for f in filters] if isinstance(filters, pikepdf.Array) else \
            [str(filters)] if filters is not None else []
        pixels = np.asarray(pikepdf.PdfImage(image).as_pil_image())
    return names, pixels


def decoded_difference(pdf: bytes, image: "Image.Image") -> dict[str, Any]:
    """How the worker's decoder renders this one-page PDF against the image it holds: the
    rendered size, and whether every pixel is the image's (else the share of pixels that
    differ and the mean absolute difference, from pdfium resampling)."""
    [page] = render(pdf)
    expected = np.asarray(image.convert("RGB"))[:, :, ::-1]
    made: dict[str, Any] = {"size": [page.shape[1], page.shape[0]]}
    if page.shape != expected.shape:
        return {**made, "identical": False}
    difference = np.abs(page.astype(np.int16) - expected.astype(np.int16))
    return {**made, "identical": not difference.any(),
            "differing_share": round(float(np.mean(difference.max(axis=2) > 0)), 4),
            "mean_abs_difference": round(float(difference.mean()), 3)}


def is_pixel_exact(pdf: bytes, image: "Image.Image") -> bool:
    """The PDF's image is stored without loss and holds exactly these pixels."""
    filters, pixels = embedded_image(pdf)
    return not {"/DCTDecode", "/JPXDecode", "/JBIG2Decode"} & set(filters) and \
        np.array_equal(pixels, np.asarray(image))
