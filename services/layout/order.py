"""OCR lines assigned to layout regions, lines no region holds gathered into text blocks, and
the blocks put in reading order (columns left to right, top to bottom within each)."""

from __future__ import annotations

from dataclasses import dataclass, field

Box = tuple[float, float, float, float]


@dataclass
class Line:
    box: Box
    text: str


@dataclass
class Block:
    label: str
    box: Box
    lines: list[int] = field(default_factory=list)  # indexes into the page's lines
    content: str = ""


def overlap_share(inner: Box, outer: Box) -> float:
    """How much of `inner`'s area lies inside `outer` (0-1)."""
    w = min(inner[2], outer[2]) - max(inner[0], outer[0])
    h = min(inner[3], outer[3]) - max(inner[1], outer[1])
    area = max(1e-6, (inner[2] - inner[0]) * (inner[3] - inner[1]))
    return max(0.0, w) * max(0.0, h) / area


def union(boxes: list[Box]) -> Box:
    return (min(b[0] for b in boxes), min(b[1] for b in boxes),
            max(b[2] for b in boxes), max(b[3] for b in boxes))


def assign_lines(blocks: list[Block], lines: list[Line], min_share: float = 0.5) -> list[int]:
    """Each line goes to the block holding most of it (at least `min_share`), a block that
    is read (any but an image) before an image that holds more of it: an image's lines are
    not read, and the model often offers an image over text it also calls text. Returns the
    lines no block took."""
    loose = []
    for i, line in enumerate(lines):
        shares = [overlap_share(line.box, block.box) for block in blocks]
        best = max(range(len(blocks)), key=lambda j: (
            shares[j] >= min_share, blocks[j].label != "image", shares[j])) \
            if blocks else None
        if best is not None and shares[best] >= min_share:
            blocks[best].lines.append(i)
        else:
            loose.append(i)
    return loose


def group_loose_lines(loose: list[int], lines: list[Line], gap: float = 1.2) -> list[Block]:
    """Lines no region holds, as text blocks: consecutive lines (top to bottom) that overlap
    horizontally and lie within `gap` line heights of each other form one block."""
    blocks: list[Block] = []
    for i in sorted(loose, key=lambda i: (lines[i].box[1], lines[i].box[0])):
        box = lines[i].box
        height = box[3] - box[1]
        for block in blocks:
            b = block.box
            if (min(b[2], box[2]) > max(b[0], box[0])
                    and 0 <= box[1] - b[3] <= gap * height + 1e-6 or
                    overlap_share(box, b) > 0.5):
                block.lines.append(i)
                block.box = union([b, box])
                break
        else:
            blocks.append(Block("text", box, [i]))
    return blocks


def sort_lines(indexes: list[int], lines: list[Line]) -> list[int]:
    """Top to bottom, and left to right within a row (lines whose vertical centres lie within
    half a line height)."""
    ordered = sorted(indexes, key=lambda i: (lines[i].box[1], lines[i].box[0]))
    rows: list[list[int]] = []
    for i in ordered:
        box = lines[i].box
        centre = (box[1] + box[3]) / 2
        if rows:
            last = lines[rows[-1][0]].box
            if abs(centre - (last[1] + last[3]) / 2) < (last[3] - last[1]) / 2:
                rows[-1].append(i)
                continue
        rows.append([i])
    return [i for row in rows for i in sorted(row, key=lambda i: lines[i].box[0])]


def reading_order(blocks: list[Block], page_width: float) -> list[Block]:
    """XY-cut, simplified: blocks are cut into horizontal bands where nothing crosses a
    vertical gap; within a band, into columns where nothing crosses a horizontal gap; each
    piece is read top to bottom. Full-width blocks (titles, wide tables) separate bands."""
    if len(blocks) <= 1:
        return list(blocks)
    return _cut(list(blocks), vertical_first=True)


def _cut(blocks: list[Block], vertical_first: bool) -> list[Block]:
    if len(blocks) <= 1:
        return blocks
    for axis in ((1, 0) if vertical_first else (0, 1)):
        groups = _split(blocks, axis)
        if len(groups) > 1:
            return [b for group in groups for b in _cut(group, axis == 0)]
    return sorted(blocks, key=lambda b: (b.box[1], b.box[0]))


def _split(blocks: list[Block], axis: int) -> list[list[Block]]:
    """Blocks in groups separated by gaps along `axis` (1: y, top to bottom; 0: x)."""
    lo, hi = axis, axis + 2
    ordered = sorted(blocks, key=lambda b: b.box[lo])
    groups: list[list[Block]] = [[ordered[0]]]
    reach = ordered[0].box[hi]
    for block in ordered[1:]:
        if block.box[lo] >= reach - 1:
            groups.append([block])
        else:
            groups[-1].append(block)
        reach = max(reach, block.box[hi])
    return groups


def split_paragraphs(block: Block, lines: list[Line], gap: float = 0.7) -> list[Block]:
    """A text (or reference) block whose rows are parted by a gap well over its own line
    spacing, as several paragraphs (the layout model often gives adjacent paragraphs one
    region). With three gaps or more, a paragraph's gap is over twice the block's median gap
    between rows and over that median plus 0.3 line heights (and over 0.35 line heights);
    with fewer, over `gap` line heights."""
    if block.label not in ("text", "reference") or len(block.lines) < 2:
        return [block]
    ordered = sort_lines(block.lines, lines)
    heights = sorted(lines[i].box[3] - lines[i].box[1] for i in ordered)
    typical = heights[len(heights) // 2]
    rows: list[list[int]] = [[ordered[0]]]  # lines side by side make one row
    gaps: list[float] = []
    bottom = lines[ordered[0]].box[3]
    for i in ordered[1:]:
        top = lines[i].box[1]
        if top - bottom > -0.5 * typical:
            gaps.append(top - bottom)
            rows.append([])
        rows[-1].append(i)
        bottom = max(bottom, lines[i].box[3]) if len(rows[-1]) > 1 else lines[i].box[3]
    if len(gaps) >= 3:
        middle = sorted(gaps)[len(gaps) // 2]
        threshold = max(2 * middle, middle + 0.3 * typical, 0.35 * typical)
    else:
        threshold = gap * typical
    parts: list[list[int]] = [rows[0]]
    for row_gap, row in zip(gaps, rows[1:]):
        if row_gap > threshold:
            parts.append([])
        parts[-1].extend(row)
    if len(parts) == 1:
        return [block]
    return [Block(block.label, union([lines[i].box for i in part]), part) for part in parts]


def rows_of(indexes: list[int], lines: list[Line]) -> list[list[int]]:
    """The lines in rows (as sort_lines groups them: vertical centres within half a line
    height of the row's first line), each row left to right."""
    rows: list[list[int]] = []
    for i in sorted(indexes, key=lambda i: (lines[i].box[1], lines[i].box[0])):
        box = lines[i].box
        if rows:
            first = lines[rows[-1][0]].box
            if abs((box[1] + box[3]) / 2 - (first[1] + first[3]) / 2) \
                    < (first[3] - first[1]) / 2:
                rows[-1].append(i)
                continue
        rows.append([i])
    return [sorted(row, key=lambda i: lines[i].box[0]) for row in rows]


def column_gaps(indexes: list[int], lines: list[Line], min_gap: float) -> int:
    """How many vertical gaps at least `min_gap` wide run top to bottom between the lines:
    x ranges that no line covers, between the leftmost and the rightmost line."""
    spans = sorted((lines[i].box[0], lines[i].box[2]) for i in indexes)
    gaps, reach = 0, spans[0][1]
    for left, right in spans[1:]:
        if left - reach >= min_gap:
            gaps += 1
        reach = max(reach, right)
    return gaps


# a text region read as a table (is_grid): at least this many rows of two lines or more ...
GRID_MIN_ROWS = 3
GRID_ROW_SHARE = 2 / 3  # ... which are this share of its rows or more,
GRID_GAP = 1.0  # in columns parted by gaps of a line height or more running through them,
GRID_MAX_WORDS = 4  # and short cells: the median line holds at most this many words


def is_grid(indexes: list[int], lines: list[Line]) -> bool:
    """Whether these lines stand as a table's cells rather than as running text: rows of
    several lines each, in columns parted by clear vertical gaps that run through all such
    rows, the lines short (a few words: cells, not the lines of a multi-column text). The
    layout model calls a small unruled table `text` now and then, on scans above all
    (no rules, a little noise); prose, even in two columns, fails the last test."""
    if len(indexes) < 2 * GRID_MIN_ROWS:
        return False
    rows = rows_of(indexes, lines)
    several = [row for row in rows if len(row) >= 2]
    if len(several) < GRID_MIN_ROWS or len(several) < GRID_ROW_SHARE * len(rows):
        return False
    height = sorted(lines[i].box[3] - lines[i].box[1] for i in indexes)[len(indexes) // 2]
    if column_gaps([i for row in several for i in row], lines, GRID_GAP * height) < 1:
        return False
    words = sorted(len(lines[i].text.split()) for i in indexes)
    return words[len(words) // 2] <= GRID_MAX_WORDS
