"""What decides a page's result, as one cache key: the page's content, the engine that read
it (the replica says which: `X-Ocr-Engine`, services/ocr_worker/identity.py), the request's
OCR parameters, and the scope (whose entry it is). Pure.

The page's content is the exact document the replica is sent (a chunk cut by gateway.split,
or the whole file), with one exception: a PDF chunk that pdfium wrote carries a random
trailer /ID and an /Info dictionary with the time it was written, and its objects are
numbered in the order the source file numbered them, so the same page cut twice, or cut
from another file, is never the same bytes (measured: docs/cache.md). Its digest is
therefore taken over its object graph from /Root: each object once, its text with every
reference replaced by the target's place in a walk from /Root, stream data as it is stored.
/Info and /ID are not reachable from /Root and do not change what a replica renders; every
byte that does (content streams, resources, fonts, images, boxes, rotation) is in the graph."""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

VERSION = b"ocrfleet-page-cache-2"

# Request fields that never change a page's result: where it goes, how it is named or
# split, whether partial results are wanted. Everything else the worker reads is in the key.
NOT_IN_KEY = frozenset({"logId", "pageRange", "returnPartialResults", "file", "fileType",
                        "callbackUrl"})

_OBJ = re.compile(rb"(\d+)\s+(\d+)\s+obj\b")
_REF = re.compile(rb"(?<![\d.])(\d+)\s+(\d+)\s+R\b")
_LENGTH = re.compile(rb"/Length\s+(\d+)(?!\s+\d+\s+R)")
_ROOT = re.compile(rb"/Root\s+(\d+)\s+(\d+)\s+R")
_STREAM = re.compile(rb"stream\r?\n")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pdf_chunk_digest(data: bytes) -> str:
    """The digest of a PDF chunk written by pdfium (classic xref, no object streams) over
    its object graph from /Root; the whole file's sha256 when it cannot be read that way
    (correct still: only the same bytes then share an entry)."""
    try:
        objects = _objects(data)
        trailer = data.rfind(b"trailer")
        root = _ROOT.search(data, trailer if trailer >= 0 else 0)
        if not objects or root is None:
            raise ValueError("no objects or no /Root")
        root_ref = (int(root.group(1)), int(root.group(2)))
        if root_ref not in objects:
            raise ValueError("no /Root object")
        return "pdfgraph:" + _graph_digest(objects, root_ref)
    except ValueError:
        return "bytes:" + sha256(data)


_WHITESPACE = b" \t\r\n\f\0"


def _objects(data: bytes) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    """(number, generation) -> (the object's text before any stream, the stream's bytes).
    Every byte between the header and the xref table must belong to an object (whitespace
    aside), or this is not a file pdfium wrote and ValueError says so: nothing that could
    change a page is ever left out of its digest."""
    if not data.startswith(b"%PDF-") or b"/ObjStm" in data or b"/XRefStm" in data:
        raise ValueError("not a plain PDF")
    first = _OBJ.search(data)
    if first is None or first.start() > 64:
        raise ValueError("no object after the header")
    objects: dict[tuple[int, int], tuple[bytes, bytes]] = {}
    position = first.start()
    while True:
        while position < len(data) and data[position] in _WHITESPACE:
            position += 1
        if data.startswith(b"xref", position):
            return objects
        match = _OBJ.match(data, position)
        if match is None:
            raise ValueError("bytes outside any object")
        ref = (int(match.group(1)), int(match.group(2)))
        if ref in objects:
            raise ValueError("an object defined twice")
        start = match.end()
        end = data.find(b"endobj", start)
        if end < 0:
            raise ValueError("an object without endobj")
        stream_at = data.find(b"stream", start, end)
        if stream_at >= 0:
            head = data[start:stream_at]
            opening = _STREAM.match(data, stream_at)
            length = _LENGTH.search(head)
            if opening is None or length is None:
                raise ValueError("a stream without a direct /Length")
            body_start = opening.end()
            body_end = body_start + int(length.group(1))
            tail = data[body_end:body_end + 16].lstrip(_WHITESPACE)
            if not tail.startswith(b"endstream"):
                raise ValueError("a stream's /Length does not end at endstream")
            objects[ref] = (head, data[body_start:body_end])
            end = data.find(b"endobj", body_end)
            if end < 0 or data[body_end:end].strip(_WHITESPACE) != b"endstream":
                raise ValueError("a stream object without endobj")
        else:
            objects[ref] = (data[start:end], b"")
        position = end + len(b"endobj")


def _graph_digest(objects, root: tuple[int, int]) -> str:
    """sha256 over the objects reachable from `root`, each once, in the order a walk from
    the root first meets them (breadth first, references in the order they are written):
    every reference is written as the target's place in that order, so the digest does not
    depend on how the file numbers its objects, and an object reached from many places (a
    page's /Parent, an annotation's /P, a shared font) is read once. The work is linear in
    the chunk's bytes, whatever its references do."""
    places = {root: 0}
    order = [root]
    digest = hashlib.sha256()
    for ref in order:  # grows as new objects are met
        head, stream = objects[ref]
        position = 0
        for match in _REF.finditer(head):
            target = (int(match.group(1)), int(match.group(2)))
            place = places.get(target)
            if place is None:
                if target not in objects:  # not in a file pdfium wrote: read it as bytes
                    raise ValueError("a reference to an object that is not there")
                place = places[target] = len(order)
                order.append(target)
            segment = head[position:match.start()]
            digest.update(b"%d:" % len(segment) + segment + b"R%d;" % place)
            position = match.end()
        segment = head[position:]
        digest.update(b"%d:" % len(segment) + segment + b"S" + hashlib.sha256(stream).digest())
    return digest.hexdigest()


def content_digest(data: bytes, kind: str) -> str:
    """The digest of what a replica is sent for one chunk: a PDF's object graph, other
    files (images, a TIFF's frames) their bytes."""
    if kind == "pdf":
        return pdf_chunk_digest(data)
    return "bytes:" + sha256(data)


def _normal(value: Any) -> Any:
    """Numbers as the worker reads them (1 and 1.0 are one threshold)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return value


def params_digest(api_params: dict[str, Any], visualize: bool | None,
                  page_range: str | None, kind: str, endpoint: str = "/ocr") -> str:
    """Every request field that can change a page's result, normalised. `page_range` counts
    only when the worker applies it (a document sent whole); `kind` is what it is sent as;
    `endpoint`: a /layout-parsing answer is not an /ocr one (its layout fields are among
    `api_params`). /ocr's keys are those from before there was another endpoint."""
    fields = {name: _normal(value) for name, value in api_params.items()
              if name not in NOT_IN_KEY}
    fields["visualize"] = visualize  # None: the worker's default (part of its identity)
    fields["@pageRange"] = page_range
    fields["@kind"] = kind
    if endpoint != "/ocr":
        fields["@endpoint"] = endpoint
    return sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode())


def cache_key(scope: str, engine: str, params: str, content: str) -> str:
    parts = b"\0".join(part.encode() for part in (scope, engine, params, content))
    return sha256(VERSION + b"\0" + parts)
