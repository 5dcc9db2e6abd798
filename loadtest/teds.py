"""TEDS, Tree-Edit-Distance-based Similarity (Zhong et al., "Image-based table recognition:
data, model, and evaluation", ECCV 2020), as PubTabNet's reference implementation computes it
(ibm-aur-nlp/PubTabNet src/metric.py, Apache-2.0): 1 - APTED tree edit distance / the larger
tree's node count, on the <table> trees parsed by lxml; renaming a node costs 1 where tag,
colspan or rowspan differ, and for two cells the normalised Levenshtein distance of their
contents' character tokens. structure_only compares the trees with every cell's content
emptied. Changes: a cell's text is compared with its whitespace collapsed (OCR lines are
joined with single spaces), inner tags are not tokens, <thead>/<tbody> are dropped and <th>
is <td> (PaddleX's HTML has td only).

Also the region F1 of the layout benchmark: boxes matched one to one, greedily by IoU, at
IoU >= 0.5, within a class."""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from apted import APTED, Config
from apted.helpers import Tree
from lxml import etree, html
from rapidfuzz.distance import Levenshtein


class TableTree(Tree):
    def __init__(self, tag: str, colspan=None, rowspan=None, content=None, *children):
        self.tag, self.colspan, self.rowspan, self.content = tag, colspan, rowspan, content
        self.children = list(children)

    def bracket(self) -> str:  # for debugging, as PubTabNet's
        if self.tag == "td":
            head = f'"tag": {self.tag}, "colspan": {self.colspan}, "rowspan": {self.rowspan}, ' \
                   f'"text": {self.content}'
        else:
            head = f'"tag": {self.tag}'
        return "{" + head + "".join(child.bracket() for child in self.children) + "}"


class _Config(Config):
    def rename(self, node1: TableTree, node2: TableTree) -> float:
        if (node1.tag != node2.tag or node1.colspan != node2.colspan
                or node1.rowspan != node2.rowspan):
            return 1.0
        if node1.tag == "td" and (node1.content or node2.content):
            return Levenshtein.normalized_distance(node1.content, node2.content)
        return 0.0


def _tokens(node) -> list[str]:
    """A cell's content as character tokens (PubTabNet's; inner tags such as <b> are not
    tokens here: neither side writes any)."""
    return list(re.sub(r"\s+", " ", node.text_content()).strip())


def _tree(node, structure_only: bool) -> TableTree:
    if node.tag == "td":
        return TableTree("td", int(node.attrib.get("colspan", "1")),
                         int(node.attrib.get("rowspan", "1")),
                         [] if structure_only else _tokens(node))
    return TableTree(node.tag, None, None, None,
                     *[_tree(child, structure_only) for child in node
                       if isinstance(child.tag, str)])


def _table(markup: str):
    if not markup:
        return None
    parser = html.HTMLParser(remove_comments=True, encoding="utf-8")
    root = html.fromstring(markup.encode("utf-8"), parser=parser)
    found = root.xpath("//table")
    if not found:
        return None
    table = found[0]
    etree.strip_tags(table, "thead", "tbody", "tfoot")  # as PaddleX's HTML has none of them
    for header in table.iter("th"):
        header.tag = "td"
    return table


def teds(predicted: str, truth: str, structure_only: bool = False) -> float:
    """TEDS of two tables' HTML (any wrapper; the first <table> of each), in [0, 1]; 0 when
    either has no table."""
    pred, true = _table(predicted), _table(truth)
    if pred is None or true is None:
        return 0.0
    nodes = max(len(pred.xpath(".//*")), len(true.xpath(".//*")))
    distance = APTED(_tree(pred, structure_only), _tree(true, structure_only),
                     _Config()).compute_edit_distance()
    return max(0.0, 1.0 - float(distance) / nodes)


# ---- region F1 ----------------------------------------------------------------------------------
def iou(a: Sequence[float], b: Sequence[float]) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(0.0, w) * max(0.0, h)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def match(predicted: Iterable[Sequence[float]], truth: Iterable[Sequence[float]],
          threshold: float = 0.5) -> int:
    """True positives: pairs matched one to one, highest IoU first, at IoU >= threshold."""
    predicted, truth = list(predicted), list(truth)
    pairs = sorted(((iou(p, t), i, j) for i, p in enumerate(predicted)
                    for j, t in enumerate(truth)), reverse=True)
    used_p, used_t, hits = set(), set(), 0
    for value, i, j in pairs:
        if value < threshold:
            break
        if i not in used_p and j not in used_t:
            used_p.add(i)
            used_t.add(j)
            hits += 1
    return hits


def f1(hits: int, predicted: int, truth: int) -> dict[str, float | int]:
    precision = hits / predicted if predicted else (1.0 if not truth else 0.0)
    recall = hits / truth if truth else (1.0 if not predicted else 0.0)
    score = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"tp": hits, "predicted": predicted, "truth": truth, "precision": precision,
            "recall": recall, "f1": score}
