"""The accuracy corpus: pages with ground truth, for choosing an engine setting on evidence
(`make bench-accuracy`, loadtest/bench_accuracy.py). Provenance: loadtest/corpus/PROVENANCE.md.

1. Born-digital PDFs made here with reportlab (English prose in three fonts and sizes, a ruled
   invoice table, Chinese prose and a Chinese table). The truth is each page's text layer as
   pypdfium2 extracts it, so nothing is typed twice.
2. Real scans from a permissively licensed PyPI package: OCRmyPDF's source distribution
   (pinned, SHA-256 checked, fetched with `pip download`, cached under bench/corpus/) ships
   test scans; two are used, with transcriptions made for this project in loadtest/corpus/.

Every page is rendered by the worker's own decoder (services/ocr_worker/decode.py, 144 DPI),
so the engine sees the pixels it sees in production."""

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

import numpy as np

from loadtest import documents
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
    kind: str  # "born-digital" or "scan"


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
    pages = []
    for name, pdf in born_digital_pdfs().items():
        for number, (image, truth) in enumerate(zip(render(pdf), text_layer(pdf)), start=1):
            pages.append(CorpusPage(f"{name}/p{number}", image, truth, "born-digital"))
    if include_scans and os.environ.get("BENCH_ACCURACY_SCANS", "1") != "0":
        for name, data in scan_files().items():
            [image] = render(data)[:1]
            pages.append(CorpusPage(f"scan/{name}", image, transcription(SCANS[name]), "scan"))
    return pages
