// ocrfleet's web page: send a document to POST /ocr as an NDJSON stream, draw each page as it
// arrives (the page image the worker saw, the detected boxes over it, the recognised lines
// beside it), offer copies and downloads, and poll GET /fleet. Or, "Layout → Markdown": send it
// to POST /layout-parsing and show each page's Markdown rendered (headings, paragraphs, tables
// as real tables) by the small renderer below, which turns no document text into markup.
// Plain JavaScript, no build step, no library, no request leaves the gateway's origin.
"use strict";

(() => {
  const NDJSON = "application/x-ndjson";
  const KEY_STORE = "ocrfleet.apiKey";
  const SVG_NS = "http://www.w3.org/2000/svg";
  const FLEET_POLL_MS = 2000;
  const STATUS_WORDS = {
    400: "The gateway could not read the request",
    401: "The gateway needs an API key: enter it at the top of the page",
    403: "The gateway refused this API key",
    404: "The gateway has no such endpoint",
    406: "The gateway cannot answer in that format",
    413: "The document is too large for this gateway",
    415: "The gateway cannot answer in that format",
    422: "The gateway cannot process this document with these options",
    429: "The fleet is busy",
    502: "The fleet failed to process the document",
    503: "The fleet is not ready or is full",
    504: "The document took longer than the gateway allows",
  };

  const $ = (selector) => document.querySelector(selector);
  const el = {
    form: $("#ocr-form"), file: $("#file"), fileName: $("#file-name"), drop: $("#drop"),
    pageRange: $("#page-range"), detLimit: $("#det-limit"), detLimitType: $("#det-limit-type"),
    scoreThresh: $("#score-thresh"), submit: $("#submit"), submitLayout: $("#submit-layout"),
    cancel: $("#cancel"),
    status: $("#status"), message: $("#message"), progress: $("#progress"),
    progressText: $("#progress-text"), progressBlock: $("#progress-block"),
    docActions: $("#doc-actions"), pages: $("#pages"),
    apiKey: $("#api-key"), fleetSummary: $("#fleet-summary"),
    fleetBody: $("#fleet-table tbody"), fleetError: $("#fleet-error"),
    template: $("#page-template"), layoutTemplate: $("#layout-page-template"),
  };
  // what each button asks for: the route, and what the page calls its entries
  const MODES = {
    ocr: { path: "/ocr", results: "ocrResults", busy: "Reading…" },
    layout: { path: "/layout-parsing", results: "layoutParsingResults", busy: "Parsing…" },
  };

  // ---- one run: everything about the document being read --------------------------------
  let run = null;

  function newRun(file, fields, kind, mode = "ocr") {
    return {
      file, fields, kind, mode, base: file.name.replace(/\.[^.]+$/, "") || "document",
      pages: [], summary: null, logId: null, total: null, started: performance.now(),
      finished: null, controller: new AbortController(), urls: [],
    };
  }

  function auth() {
    const key = el.apiKey.value.trim();
    return key ? { Authorization: `Bearer ${key}` } : {};
  }

  // ---- options -> multipart fields ------------------------------------------------------
  // A PDF or TIFF page is drawn from the worker's inputImage (the page exactly as it was
  // read), so those ask for `visualize`; an image is drawn from the upload itself, so it
  // spares the workers the visualization.
  // Layout parsing returns no visualization images (it refuses `visualize: true`).
  function readFields(kind, mode = "ocr") {
    const fields = { returnPartialResults: "true" };
    if (mode === "ocr") fields.visualize = String(kind !== "image");
    const pageRange = el.pageRange.value.trim();
    if (pageRange) fields.pageRange = pageRange;
    if (el.detLimit.value !== "") fields.textDetLimitSideLen = el.detLimit.value;
    if (el.detLimitType.value) fields.textDetLimitType = el.detLimitType.value;
    if (el.scoreThresh.value !== "") fields.textRecScoreThresh = el.scoreThresh.value;
    return fields;
  }

  function formData(file, fields) {
    const body = new FormData();
    body.append("file", file, file.name);
    for (const [name, value] of Object.entries(fields)) body.append(name, value);
    return body;
  }

  async function sniffKind(file) {
    const head = new Uint8Array(await file.slice(0, 4).arrayBuffer());
    const text = String.fromCharCode(...head);
    if (text === "%PDF") return "pdf";
    if (text === "II*\0" || text === "MM\0*") return "tiff";
    return "image";
  }

  // ---- errors in words ------------------------------------------------------------------
  async function describeHttpError(response) {
    let detail = "";
    try {
      const body = await response.json();
      detail = body.errorMsg || "";
    } catch (_) { /* not JSON (a proxy's HTML page): the status says enough */ }
    const words = STATUS_WORDS[response.status] || "The gateway answered with an error";
    let text = `${words} (HTTP ${response.status})`;
    if (detail) text += `: ${detail}`;
    const retry = response.headers.get("Retry-After");
    if (retry && (response.status === 429 || response.status === 503)) {
      text += `. Try again in ${retry} s.`;
    }
    return text;
  }

  function showMessage(text, kind = "error") {
    el.message.textContent = text;
    el.message.className = `message ${kind}`;
    el.message.hidden = !text;
  }

  // ---- submitting and reading the stream -------------------------------------------------
  async function submit(event) {
    event.preventDefault();
    const file = el.file.files[0];
    el.status.hidden = false;
    if (!file) { showMessage("Choose a file first."); return; }
    if (!el.form.reportValidity()) return;
    if (run) run.controller.abort();
    clearRun();
    const kind = await sniffKind(file);
    const mode = event.submitter === el.submitLayout ? "layout" : "ocr";
    run = newRun(file, readFields(kind, mode), kind, mode);
    const current = run;
    setBusy(true, mode);
    try {
      const response = await fetch(MODES[mode].path, {
        method: "POST", body: formData(file, current.fields), signal: current.controller.signal,
        headers: { ...auth(), Accept: NDJSON },
      });
      if (!response.ok) {
        showMessage(await describeHttpError(response));
        return;
      }
      current.total = totalFromHeader(response) ?? (current.kind === "image" ? 1 : null);
      updateProgress(current);
      await readLines(response.body, (line) => handleLine(current, line));
      if (!current.summary && !current.stopped && current === run) {
        showMessage("The stream ended before the gateway said it was done: some pages may be "
          + "missing. Try again.");
      }
    } catch (error) {
      if (error.name === "AbortError") showMessage("Cancelled.", "info");
      else if (error instanceof SyntaxError) {
        showMessage(`The gateway's answer could not be read (${error.message}).`);
      } else showMessage(`Could not reach the gateway: ${error.message}`);
    } finally {
      if (current === run) {
        current.finished = performance.now();
        updateProgress(current);
        setBusy(false);
        showActionsFor(current.mode);
        el.docActions.hidden = !current.pages.length;
        el.progressBlock.hidden = !current.pages.length && !current.summary;
      }
    }
  }

  function totalFromHeader(response) {
    const value = parseInt(response.headers.get("X-Num-Pages") || "", 10);
    return Number.isFinite(value) && value >= 0 ? value : null;
  }

  async function readLines(stream, onLine) {
    const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let newline;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        const text = buffer.slice(0, newline).trim();
        buffer = buffer.slice(newline + 1);
        if (text) onLine(JSON.parse(text));
      }
    }
    if (buffer.trim()) onLine(JSON.parse(buffer));
  }

  function handleLine(current, line) {
    if (current !== run) return;
    current.logId = current.logId || line.logId;
    if (line.done) {
      current.summary = line;
      current.total = line.numPages;
      if (line.errorCode) showMessage(line.errorMsg, "warning");
    } else if ("pageIndex" in line) {
      if (typeof line.numPages === "number") current.total = line.numPages;
      const page = { index: line.pageIndex, ocrResult: line.ocrResult || null,
        layoutResult: line.layoutParsingResult || null, pageInfo: line.pageInfo || null, errorCode: line.errorCode || 0,
        errorMsg: line.errorMsg || "", cached: line.cached === true };
      current.pages.push(page);
      el.pages.append(renderPage(current, page));
      showActionsFor(current.mode);
      el.docActions.hidden = false;
    } else if (typeof line.numPages === "number") {
      current.total = line.numPages;  // a leading "how many pages" line, where a gateway sends one
    } else if (line.errorCode) {
      current.stopped = true;
      showMessage(`${STATUS_WORDS[line.errorCode] || "The gateway stopped"} `
        + `(${line.errorCode}): ${line.errorMsg}`);
    }
    updateProgress(current);
  }

  // ---- progress -------------------------------------------------------------------------
  function progressText(done, total, seconds, finished, cached = 0) {
    const rate = seconds > 0 ? done / seconds : 0;
    const parts = [total == null ? `${done} page${done === 1 ? "" : "s"} done`
      : `${done} of ${total} page${total === 1 ? "" : "s"}`];
    // pages the gateway answered from its page cache (the line's "cached" flag)
    if (cached > 0) parts.push(`${cached} of ${done} page${done === 1 ? "" : "s"} from the cache`);
    if (done > 0) parts.push(`${rate.toFixed(rate < 10 ? 2 : 1)} pages/s`);
    if (finished) parts.push(`finished in ${seconds.toFixed(1)} s`);
    else if (total != null && done > 0 && rate > 0) {
      parts.push(`about ${formatSeconds((total - done) / rate)} left`);
    } else if (done === 0) parts.push("waiting for the first page…");
    return parts.join(" · ");
  }

  function formatSeconds(seconds) {
    if (seconds < 60) return `${Math.ceil(seconds)} s`;
    const minutes = Math.floor(seconds / 60);
    return `${minutes} min ${Math.round(seconds - minutes * 60)} s`;
  }

  function updateProgress(current) {
    const done = current.pages.length;
    const end = current.finished ?? performance.now();
    const seconds = (end - current.started) / 1000;
    if (current.total == null) el.progress.removeAttribute("value");
    else {
      el.progress.max = Math.max(current.total, 1);
      el.progress.value = done;
    }
    const cached = current.pages.filter((page) => page.cached).length;
    el.progressText.textContent = progressText(done, current.total, seconds,
      current.finished != null, cached);
  }

  // ---- drawing a page -------------------------------------------------------------------
  function renderPage(current, page) {
    const template = current.mode === "layout" ? el.layoutTemplate : el.template;
    const node = template.content.firstElementChild.cloneNode(true);
    node.dataset.pageIndex = page.index;
    node.id = `page-${page.index + 1}`;
    node.querySelector("h3").textContent = `Page ${page.index + 1}`;
    if (page.errorCode) {
      node.classList.add("failed");
      node.querySelector(".page-meta").textContent = `failed (${page.errorCode})`;
      const body = node.querySelector(".page-body");
      body.replaceChildren();
      const text = document.createElement("p");
      text.className = "page-error";
      text.setAttribute("role", "alert");
      text.textContent = `This page could not be read: ${page.errorMsg}`;
      body.append(text);
      node.querySelector(".actions").replaceChildren(
        actionButton("JSON", () => download(`${current.base}-page-${page.index + 1}.json`,
          JSON.stringify(pageEnvelope(current, page), null, 2), "application/json")));
      return node;
    }
    if (current.mode === "layout") return renderLayoutPage(current, page, node);
    const pruned = page.ocrResult.prunedResult || {};
    const texts = pruned.rec_texts || [];
    const shapes = boxShapes(pruned);
    node.querySelector(".page-meta").textContent =
      `${texts.length} line${texts.length === 1 ? "" : "s"}`;
    drawView(current, page, node, shapes, texts);
    const list = node.querySelector(".lines");
    texts.forEach((text, i) => {
      const item = document.createElement("li");
      item.tabIndex = 0;
      item.dataset.index = i;
      item.textContent = text;
      const score = (pruned.rec_scores || [])[i];
      if (typeof score === "number") item.title = `score ${score.toFixed(3)}`;
      list.append(item);
    });
    wireHighlight(node);
    node.querySelector('[data-action="copy"]').addEventListener("click",
      (event) => copyText(event.currentTarget, pageText(page)));
    node.querySelector('[data-action="json"]').addEventListener("click", () =>
      download(`${current.base}-page-${page.index + 1}.json`,
        JSON.stringify(pageEnvelope(current, page), null, 2), "application/json"));
    node.querySelector('[data-action="text"]').addEventListener("click", () =>
      download(`${current.base}-page-${page.index + 1}.txt`, pageText(page), "text/plain"));
    return node;
  }

  // One shape per recognised line: its polygon where the result has one, else its box.
  function boxShapes(pruned) {
    const polys = pruned.rec_polys || [];
    const boxes = pruned.rec_boxes || [];
    const count = Math.max(polys.length, boxes.length);
    const shapes = [];
    for (let i = 0; i < count; i++) {
      if (polys[i] && polys[i].length >= 3) shapes.push(polys[i]);
      else if (boxes[i]) {
        const [x1, y1, x2, y2] = boxes[i];
        shapes.push([[x1, y1], [x2, y1], [x2, y2], [x1, y2]]);
      }
    }
    return shapes;
  }

  function drawView(current, page, node, shapes, texts) {
    const svg = node.querySelector("svg");
    const img = node.querySelector("img");
    const info = page.pageInfo || {};
    let width = info.width;
    let height = info.height;
    if (!(width > 0 && height > 0)) {  // no size given: the extent of the boxes
      const points = shapes.flat();
      width = Math.max(1, ...points.map((p) => p[0]));
      height = Math.max(1, ...points.map((p) => p[1]));
    }
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("aria-label", `Page ${page.index + 1} with ${shapes.length} text boxes`);
    shapes.forEach((points, i) => {
      const polygon = document.createElementNS(SVG_NS, "polygon");
      polygon.setAttribute("points", points.map((p) => `${p[0]},${p[1]}`).join(" "));
      polygon.setAttribute("class", "box");
      polygon.dataset.index = i;
      const title = document.createElementNS(SVG_NS, "title");
      title.textContent = texts[i] ?? "";
      polygon.append(title);
      svg.append(polygon);
    });
    const source = pageImageUrl(current, page);
    if (source) {
      img.addEventListener("error", () => img.remove());  // a format this browser cannot show
      img.src = source;
      img.alt = `Page ${page.index + 1} as the OCR engine saw it`;
    } else {
      img.remove();
    }
  }

  // The page image behind the boxes: the worker's inputImage (a rendered PDF page, a TIFF
  // frame), else the uploaded image itself.
  function pageImageUrl(current, page) {
    const b64 = page.ocrResult.inputImage;
    let url = null;
    if (b64) {
      const binary = atob(b64);
      const bytes = new Uint8Array(binary.length);
      for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
      url = URL.createObjectURL(new Blob([bytes], { type: "image/jpeg" }));
    } else if (current.kind === "image") {
      url = URL.createObjectURL(current.file);
    }
    if (url) current.urls.push(url);
    return url;
  }

  // Hovering (or focusing) a line lights its box, hovering a box lights its line.
  function wireHighlight(node) {
    const list = node.querySelector(".lines");
    const find = (i) => [node.querySelector(`.box[data-index="${i}"]`),
      list.querySelector(`li[data-index="${i}"]`)];
    const light = (i, on) => find(i).forEach((item) => item && item.classList.toggle("hot", on));
    const indexOf = (target) => target.closest("[data-index]")?.dataset.index;
    for (const [type, on] of [["mouseover", true], ["mouseout", false], ["focusin", true],
      ["focusout", false]]) {
      list.addEventListener(type, (event) => {
        const i = indexOf(event.target);
        if (i !== undefined) light(i, on);
      });
    }
    const svg = node.querySelector("svg");
    svg.addEventListener("mouseover", (event) => {
      const i = indexOf(event.target);
      if (i === undefined) return;
      light(i, true);
      const item = list.querySelector(`li[data-index="${i}"]`);
      if (item && list.scrollHeight > list.clientHeight) {
        list.scrollTop = item.offsetTop - list.clientHeight / 2;
      }
    });
    svg.addEventListener("mouseout", (event) => {
      const i = indexOf(event.target);
      if (i !== undefined) light(i, false);
    });
  }

  // ---- a layout page: its Markdown rendered, and its source ------------------------------
  function renderLayoutPage(current, page, node) {
    const markdown = pageMarkdown(page);
    const blocks = ((page.layoutResult || {}).prunedResult || {}).parsing_res_list || [];
    const tables = blocks.filter((block) => block.block_label === "table").length;
    node.querySelector(".page-meta").textContent =
      `${blocks.length} block${blocks.length === 1 ? "" : "s"}`
      + ` · ${tables} table${tables === 1 ? "" : "s"}`;
    node.querySelector(".markdown").append(renderMarkdown(markdown));
    node.querySelector(".md-source pre").textContent = markdown;
    const name = `${current.base}-page-${page.index + 1}`;
    node.querySelector('[data-action="copy-md"]').addEventListener("click",
      (event) => copyText(event.currentTarget, markdown));
    node.querySelector('[data-action="md"]').addEventListener("click", () =>
      download(`${name}.md`, markdown, "text/markdown"));
    node.querySelector('[data-action="json"]').addEventListener("click", () =>
      download(`${name}.json`, JSON.stringify(pageEnvelope(current, page), null, 2),
        "application/json"));
    return node;
  }

  // One page's Markdown as the gateway's text/markdown answer has it: a failed page is a
  // comment naming it, so the pages after it keep their place.
  function pageMarkdown(page) {
    if (page.errorCode) {
      return `<!-- page ${page.index + 1}: ${page.errorMsg.replaceAll("--", "- -")} -->`;
    }
    return String(((page.layoutResult || {}).markdown || {}).text || "");
  }

  // The whole document's Markdown: every page's in order, a `---` rule between pages (as
  // services/layout/markdown.document_markdown writes it).
  function documentMarkdown(current) {
    return sortedPages(current).map((page) => pageMarkdown(page).trim())
      .join("\n\n---\n\n") + "\n";
  }

  // ---- Markdown, rendered safely ---------------------------------------------------------
  // Layout parsing's Markdown is headings, paragraphs, tables as HTML (PaddleX's, cells
  // escaped), centred captions and formulas. Its text is the document's, which anyone can
  // write: nothing of it may become markup. So every block is built with createElement and
  // text nodes, never innerHTML; of the HTML only a table's structure is rebuilt (table,
  // thead, tbody, tr, th, td, with colspan and rowspan as small numbers: nothing else), and
  // every other tag (<script>, <img onerror>, <a href>, ...) is shown as the text it is.
  const TABLE_TAGS = new Set(["table", "thead", "tbody", "tr", "th", "td"]);
  const TABLE_PARENTS = { thead: ["table"], tbody: ["table"], tr: ["table", "thead", "tbody"],
    td: ["tr"], th: ["tr"] };
  const TAG = /<(\/?)([A-Za-z][A-Za-z0-9]*)\b([^<>]*)>/g;
  const SPAN = /\b(colspan|rowspan)\s*=\s*(["']?)(\d{1,4})\2/gi;
  const MAX_SPAN = 1000;
  const CENTERED = /^<div style="text-align: center;">([\s\S]*)<\/div>$/;
  const ENTITIES = { amp: "&", lt: "<", gt: ">", quot: "\"", apos: "'", nbsp: "\u00a0" };

  function renderMarkdown(text) {
    const fragment = document.createDocumentFragment();
    for (const raw of String(text || "").replace(/\r\n?/g, "\n").split(/\n[ \t]*\n/)) {
      const block = raw.trim();
      if (block) fragment.append(renderBlock(block));
    }
    return fragment;
  }

  function renderBlock(block) {
    const heading = /^(#{1,6})[ \t]+([^\n]+)$/.exec(block);
    if (heading) {
      return element(`h${heading[1].length}`, heading[2].replace(/[ \t]+#+[ \t]*$/, ""));
    }
    if (/^(?:-{3,}|\*{3,}|_{3,})$/.test(block)) return document.createElement("hr");
    const formula = /^\$\$([\s\S]+)\$\$$/.exec(block);
    if (formula) return element("pre", formula[1].trim(), "formula");
    const comment = /^<!--([\s\S]*?)-->$/.exec(block);  // a failed page's note
    if (comment) return element("p", comment[1].trim(), "note");
    const centered = CENTERED.exec(block);  // prettifyMarkdown's wrapper of tables, captions
    if (centered) return withTables(element("div", null, "center"), centered[1]);
    if (/<table\b/i.test(block)) return withTables(element("div", null, "table-block"), block);
    return element("p", block);
  }

  function element(name, text, className) {
    const node = document.createElement(name);
    if (text != null) node.textContent = text;
    if (className) node.className = className;
    return node;
  }

  // `html`'s table structure rebuilt inside `container`; its text, and every tag that is no
  // table's, as text nodes.
  function withTables(container, html) {
    const stack = [container];
    const top = () => stack[stack.length - 1];
    const text = (value) => {
      const node = top();
      const inCell = node === container || node.localName === "td" || node.localName === "th";
      if (value && (inCell || value.trim())) {
        node.append(document.createTextNode(decodeEntities(value)));
      }
    };
    let last = 0;
    for (const match of html.matchAll(TAG)) {
      text(html.slice(last, match.index));
      last = match.index + match[0].length;
      const name = match[2].toLowerCase();
      if (!TABLE_TAGS.has(name)) {
        text(match[0]);  // shown, never made
        continue;
      }
      if (match[1]) {  // a closing tag: back out of its element, when one is open
        const at = stack.map((node) => node.localName).lastIndexOf(name);
        if (at > 0) stack.length = at;
        continue;
      }
      const parents = TABLE_PARENTS[name];
      if (parents) {  // a row or cell closes the open cell or row before it, as HTML does
        const at = Math.max(...parents.map((parent) =>
          stack.map((node) => node.localName).lastIndexOf(parent)));
        if (at > 0) stack.length = at + 1;
      }
      const node = document.createElement(name);
      if (name === "td" || name === "th") {
        for (const [, attribute, , value] of match[3].matchAll(SPAN)) {
          const span = parseInt(value, 10);
          if (span >= 1 && span <= MAX_SPAN) node.setAttribute(attribute.toLowerCase(), String(span));
        }
      }
      top().append(node);
      stack.push(node);
    }
    text(html.slice(last));
    return container;
  }

  function decodeEntities(text) {
    return text.replace(/&(#x[0-9a-fA-F]{1,6}|#[0-9]{1,7}|[A-Za-z]{2,6});/g, (whole, name) => {
      if (name[0] !== "#") return ENTITIES[name.toLowerCase()] ?? whole;
      const code = name[1] === "x" ? parseInt(name.slice(2), 16) : parseInt(name.slice(1), 10);
      const valid = code > 0 && code <= 0x10ffff && !(code >= 0xd800 && code <= 0xdfff);
      return valid ? String.fromCodePoint(code) : whole;
    });
  }

  // ---- text, JSON and downloads ---------------------------------------------------------
  function pageText(page) {
    if (page.errorCode) return "";
    return ((page.ocrResult.prunedResult || {}).rec_texts || []).join("\n");
  }

  // Plain text of the document: each page's lines, pages separated by a form feed (as
  // pdftotext does), failed pages empty.
  function documentText(current) {
    return sortedPages(current).map(pageText).join("\n\f");
  }

  function sortedPages(current) {
    return [...current.pages].sort((a, b) => a.index - b.index);
  }

  // PaddleX's dataInfo (ImageInfo, or PDFInfo/TIFFInfo with pageIndices where the pages are
  // a selection) for some pages of this run.
  function dataInfo(current, pages, selection) {
    if (current.kind === "image" && pages.length === 1 && pages[0].pageInfo) {
      return { width: pages[0].pageInfo.width, height: pages[0].pageInfo.height, type: "image" };
    }
    const info = { numPages: pages.length, pages: pages.map((p) => p.pageInfo),
      type: current.kind === "image" ? "tiff" : current.kind };
    if (selection) info.pageIndices = pages.map((p) => p.index);
    return info;
  }

  function pageEntry(current, page) {
    if (current.mode === "layout") {
      if (!page.errorCode) return page.layoutResult;
      return { prunedResult: {}, markdown: { text: "", isStart: true, isEnd: true, images: {} },
        outputImages: null, inputImage: null,
        error: { errorCode: page.errorCode, errorMsg: page.errorMsg } };
    }
    if (!page.errorCode) return page.ocrResult;
    return { prunedResult: null, ocrImage: null, docPreprocessingImage: null, inputImage: null,
      error: { errorCode: page.errorCode, errorMsg: page.errorMsg } };
  }

  function pageEnvelope(current, page) {
    if (page.errorCode) {
      return { logId: current.logId, errorCode: page.errorCode, errorMsg: page.errorMsg };
    }
    return { logId: current.logId, result: { [MODES[current.mode].results]:
      [pageEntry(current, page)], dataInfo: dataInfo(current, [page], true) },
    errorCode: 0, errorMsg: "Success" };
  }

  // The PaddleX envelope the gateway's non-streamed answer would be (with
  // returnPartialResults: failed pages carry an `error`, and `failedPages` lists them).
  function documentEnvelope(current) {
    const pages = sortedPages(current);
    const read = pages.filter((p) => !p.errorCode);
    const result = { [MODES[current.mode].results]: pages.map((p) => pageEntry(current, p)),
      dataInfo: current.summary?.result?.dataInfo
        || dataInfo(current, read, Boolean(current.fields.pageRange)) };
    const failed = pages.filter((p) => p.errorCode);
    if (failed.length) {
      result.failedPages = failed.map((p) => ({ pageIndex: p.index, errorCode: p.errorCode,
        errorMsg: p.errorMsg }));
    }
    return { logId: current.logId, result, errorCode: 0, errorMsg: "Success" };
  }

  function download(name, content, type) {
    const blob = content instanceof Blob ? content : new Blob([content], { type });
    const url = URL.createObjectURL(blob);
    const link = document.createElement("a");
    link.href = url;
    link.download = name;
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  }

  async function copyText(button, text) {
    let ok = false;
    try {
      await navigator.clipboard.writeText(text);
      ok = true;
    } catch (_) {  // no clipboard API (plain http from another host): the old way
      const area = document.createElement("textarea");
      area.value = text;
      area.setAttribute("readonly", "");
      area.className = "offscreen";
      document.body.append(area);
      area.select();
      ok = document.execCommand("copy");
      area.remove();
    }
    flash(button, ok ? "Copied" : "Copy failed");
  }

  function flash(button, text) {
    const label = button.dataset.label || button.textContent;
    button.dataset.label = label;
    button.textContent = text;
    setTimeout(() => { button.textContent = label; }, 1500);
  }

  function actionButton(label, onClick) {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = label;
    button.addEventListener("click", onClick);
    return button;
  }

  // The searchable PDF: the same request again, asking for application/pdf.
  async function downloadSearchablePdf(button) {
    const current = run;
    if (!current) return;
    const fields = { ...current.fields };
    delete fields.visualize;
    delete fields.returnPartialResults;
    button.disabled = true;
    const label = button.textContent;
    button.textContent = "Making the PDF…";
    try {
      const response = await fetch("/ocr", { method: "POST",
        body: formData(current.file, fields), headers: { ...auth(), Accept: "application/pdf" } });
      const type = response.headers.get("Content-Type") || "";
      if (response.ok && type.startsWith("application/pdf")) {
        download(`${current.base}.searchable.pdf`, await response.blob());
      } else if (response.ok) {
        showMessage("This gateway does not make searchable PDFs (it answered "
          + `${type.split(";")[0] || "without a type"} instead of a PDF).`, "warning");
      } else if (response.status === 406 || response.status === 415) {
        showMessage(`No searchable PDF: ${await describeHttpError(response)}`, "warning");
      } else {
        showMessage(`No searchable PDF: ${await describeHttpError(response)}`);
      }
    } catch (error) {
      showMessage(`Could not reach the gateway: ${error.message}`);
    } finally {
      button.disabled = false;
      button.textContent = label;
    }
  }

  // ---- page state -----------------------------------------------------------------------
  function clearRun() {
    if (run) run.urls.forEach((url) => URL.revokeObjectURL(url));
    run = null;
    el.pages.replaceChildren();
    showMessage("");
    el.docActions.hidden = true;
    el.progress.value = 0;
    el.progressText.textContent = "";
    el.progressBlock.hidden = false;
  }

  function setBusy(busy, mode = "ocr") {
    for (const [button, label, own] of [[el.submit, "Read the text", "ocr"],
      [el.submitLayout, "Layout → Markdown", "layout"]]) {
      button.disabled = busy;
      button.textContent = busy && mode === own ? MODES[own].busy : label;
    }
    el.cancel.disabled = !busy;
    el.status.setAttribute("aria-busy", String(busy));
  }

  // The document's buttons for what the run asked for: text and the searchable PDF for OCR,
  // the Markdown for layout parsing; JSON for both.
  function showActionsFor(mode) {
    for (const button of el.docActions.querySelectorAll("[data-mode]")) {
      button.hidden = button.dataset.mode !== mode;
    }
  }

  function chooseFile(files) {
    if (files && files.length) {
      if (files !== el.file.files) el.file.files = files;
      const file = el.file.files[0];
      el.fileName.textContent = `${file.name} (${formatBytes(file.size)})`;
    }
  }

  function formatBytes(bytes) {
    if (bytes < 1024) return `${bytes} B`;
    if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(0)} KB`;
    return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
  }

  // ---- fleet panel ----------------------------------------------------------------------
  async function pollFleet() {
    try {
      const response = await fetch("/fleet", { headers: auth(), cache: "no-store" });
      if (response.ok) {
        renderFleet(await response.json());
        el.fleetError.textContent = "";
      } else {
        el.fleetError.textContent = await describeHttpError(response);
      }
    } catch (error) {
      el.fleetError.textContent = "The gateway does not answer.";
    }
    setTimeout(pollFleet, document.hidden ? FLEET_POLL_MS * 5 : FLEET_POLL_MS);
  }

  function renderFleet(fleet) {
    const replicas = fleet.replicas || [];
    // behind a load balancer the one replica is the balancer: the workers behind it are
    // those the fleet board tells of
    const workers = fleet.mode === "load_balancer" ? fleet.workers || [] : [];
    const ready = replicas.filter((r) => r.ready).length;
    const parts = [`${ready} of ${replicas.length} replica${replicas.length === 1 ? "" : "s"} `
      + "ready"];
    if (fleet.mode === "load_balancer") parts.push(workersText(workers));
    const rate = fleet.pagesPerSecond;
    parts.push(typeof rate === "number" ? `${rate.toFixed(2)} pages/s (last minute)`
      : "pages/s n/a");
    const queue = fleet.queue;
    if (queue) {
      const capacity = queue.capacityPages != null ? ` of ${queue.capacityPages}` : "";
      parts.push(`queue: ${queue.queuedPages ?? "?"} page(s) in `
        + `${queue.queuedDocuments ?? "?"} document(s), ${queue.inflightPages ?? "?"}`
        + `${capacity} in flight`);
    } else {
      parts.push("queue n/a");
    }
    if (fleet.mode) parts.push(`mode: ${fleet.mode.replace("_", " ")}`);
    el.fleetSummary.textContent = parts.join(" · ");
    el.fleetBody.replaceChildren(...replicas.map(fleetRow), ...workers.map(workerRow));
    el.fleetSummary.dataset.polls = Number(el.fleetSummary.dataset.polls || 0) + 1;
  }

  function workersText(workers) {
    const draining = workers.filter((w) => w.draining).length;
    return `${workers.length} worker${workers.length === 1 ? "" : "s"} behind it`
      + (draining ? ` (${draining} draining)` : "");
  }

  function fleetRow(replica) {
    const ready = replica.ready == null ? "probing" : replica.ready ? "yes" : "no";
    const inflight = replica.limit != null ? `${replica.inflight} / ${replica.limit}`
      : `${replica.inflight}`;
    const row = tableRow([[replica.url.replace(/^https?:\/\//, ""), "url"],
      [ready, `ready-${ready}`], [inflight, "num"], [String(replica.served), "num"]]);
    row.dataset.url = replica.url;
    return row;
  }

  // A worker behind the balancer: the pages it holds to stay busy are known (it says so),
  // its pages in flight and served are not (the balancer picks where each page goes).
  function workerRow(worker) {
    const ready = worker.draining ? "draining" : "yes";
    const row = tableRow([[`worker ${worker.id}`, "url"], [ready, `ready-${ready}`],
      [`– / ${worker.slots}`, "num"], ["–", "num"]]);
    row.dataset.worker = worker.id;
    row.className = "worker";
    row.title = `heard ${worker.heardSecondsAgo} s ago`;
    return row;
  }

  function tableRow(cells) {
    const row = document.createElement("tr");
    for (const [text, cls] of cells) {
      const cell = document.createElement("td");
      cell.textContent = text;
      cell.className = cls;
      row.append(cell);
    }
    return row;
  }

  // ---- wiring ---------------------------------------------------------------------------
  function start() {
    el.apiKey.value = sessionStorage.getItem(KEY_STORE) || "";
    el.apiKey.addEventListener("input", () => {
      const key = el.apiKey.value.trim();
      if (key) sessionStorage.setItem(KEY_STORE, key);
      else sessionStorage.removeItem(KEY_STORE);
    });
    $("#key-form").addEventListener("submit", (event) => event.preventDefault());
    el.form.addEventListener("submit", submit);
    el.cancel.addEventListener("click", () => run && run.controller.abort());
    el.file.addEventListener("change", () => chooseFile(el.file.files));
    for (const type of ["dragenter", "dragover"]) {
      el.drop.addEventListener(type, (event) => {
        event.preventDefault();
        el.drop.classList.add("dragging");
      });
    }
    for (const type of ["dragleave", "drop"]) {
      el.drop.addEventListener(type, () => el.drop.classList.remove("dragging"));
    }
    el.drop.addEventListener("drop", (event) => {
      event.preventDefault();
      chooseFile(event.dataTransfer.files);
    });
    $("#doc-copy").addEventListener("click", (event) =>
      run && copyText(event.currentTarget, documentText(run)));
    $("#doc-json").addEventListener("click", () => run && download(`${run.base}.json`,
      JSON.stringify(documentEnvelope(run), null, 2), "application/json"));
    $("#doc-text").addEventListener("click", () => run && download(`${run.base}.txt`,
      documentText(run), "text/plain"));
    $("#doc-pdf").addEventListener("click", (event) =>
      downloadSearchablePdf(event.currentTarget));
    $("#doc-md-copy").addEventListener("click", (event) =>
      run && copyText(event.currentTarget, documentMarkdown(run)));
    $("#doc-md").addEventListener("click", () => run && download(`${run.base}.md`,
      documentMarkdown(run), "text/markdown"));
    setInterval(() => run && !run.finished && updateProgress(run), 500);
    pollFleet();
  }

  window.ocrfleet = { progressText, boxShapes, renderMarkdown,
    documentText: () => run && documentText(run),
    documentMarkdown: () => run && documentMarkdown(run) };
  start();
})();
