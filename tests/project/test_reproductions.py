"""docs/reproductions/README.md's ledger: each row's verdict is the one its figures give under the
stated rule (the paper's Δ against ours and its 95 % interval), every link leads to a section
of a page, and the counts under the ledger are the rows'."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = REPO / "docs" / "reproductions"
LEDGER = PAGES / "README.md"
VERDICTS = (
    "reproduced",
    "in direction, within noise",
    "not reproduced at this budget",
    "contradicted",
    "not run",
)
NUMBER = r"[+\-−]?\d[\d,]*(?:\.\d+)?"


def number(text: str) -> float:
    return float(text.replace("−", "-").replace(",", ""))


def ledger_rows() -> list[dict[str, str]]:
    text = LEDGER.read_text(encoding="utf-8")
    section = text.split("## The ledger", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == len(header), f"ledger row with {len(cells)} cells: {line}"
        rows.append(dict(zip(header, cells)))
    return rows


def paper_sign(figure: str) -> int | None:
    """The sign of the paper's Δ ('Δ −4.4 (...)', or 'Δ < 0' / 'Δ > 0'), or None."""
    match = re.match(rf"Δ ({NUMBER}|[<>] 0)", figure)
    if not match:
        return None
    if match.group(1) in ("< 0", "> 0"):
        return -1 if match.group(1) == "< 0" else 1
    value = number(match.group(1))
    return (value > 0) - (value < 0)


def paper_size(figure: str) -> float | None:
    match = re.match(rf"Δ ({NUMBER})", figure)
    return abs(number(match.group(1))) if match else None


def ours(cell: str) -> tuple[float, float | None, float | None]:
    """(Δ, low, high) of 'Δ +3.25 [+2.02, +4.49]; ...' or (Δ, None, None) of
    'Δ +0.08 (n 1, no interval); ...'."""
    match = re.match(rf"Δ ({NUMBER}) \[({NUMBER}), ({NUMBER})\]", cell)
    if match:
        return tuple(number(g) for g in match.groups())
    match = re.match(rf"Δ ({NUMBER}) \(n 1, no interval\)", cell)
    assert match, f"no 'Δ X [low, high]' or 'Δ X (n 1, no interval)' at the start of: {cell}"
    return number(match.group(1)), None, None


def verdict_of(sign: int, size: float | None, delta: float, low, high) -> str:
    """The ledger's rule (docs/reproductions/README.md, Verdicts)."""
    excludes_zero = low is not None and (low > 0 or high < 0)
    same_sign = delta * sign > 0
    level = size is not None and abs(delta) < size / 10
    if excludes_zero:
        return "reproduced" if same_sign else "contradicted"
    if same_sign and not level:
        return "in direction, within noise"
    return "not reproduced at this budget"


def test_the_rule_on_hand_made_rows():
    assert verdict_of(-1, 4.4, -3.3, -4.2, -2.4) == "reproduced"
    assert verdict_of(-1, 2.2, 3.25, 2.02, 4.49) == "contradicted"
    assert verdict_of(-1, 4.4, -0.05, -1.32, 1.23) == "not reproduced at this budget"
    assert verdict_of(-1, 4.4, -1.0, -3.0, 1.0) == "in direction, within noise"
    assert verdict_of(1, 0.5, -0.2, -1.0, 0.6) == "not reproduced at this budget"
    assert verdict_of(-1, None, -700.0, None, None) == "in direction, within noise"
    assert verdict_of(1, 1.0, 5.0, None, None) == "in direction, within noise"


def test_the_ledger_has_a_row_for_each_paper():
    papers = Counter(row["paper"] for row in ledger_rows())
    assert set(papers) == {"Inan 2017", "Pappas 2020", "Heo 2024", "Heo 2025"}
    assert all(count >= 5 for count in papers.values())


@pytest.mark.parametrize(
    "row", [pytest.param(row, id=f"{row['paper']}: {row['claim']}") for row in ledger_rows()]
)
def test_each_verdict_follows_from_its_figures(row):
    verdict = row["verdict"]
    assert verdict in VERDICTS, f"not one of the ledger's verdicts: {verdict}"
    cell = row["ours: Δ [95 % CI]; mean ± sd, n"]
    if verdict == "not run":
        assert cell == "–" and row["budget"] == "–"
        return
    figure = row["paper's figure"]
    sign = paper_sign(figure)
    assert sign, f"the paper's figure gives no signed Δ: {figure}"
    delta, low, high = ours(cell)
    if low is not None:
        assert low <= delta <= high, f"Δ outside its own interval: {cell}"
    expected = verdict_of(sign, paper_size(figure), delta, low, high)
    assert verdict == expected, f"{row['claim']}: the figures give '{expected}', not '{verdict}'"


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_each_ledger_link_leads_to_a_section_of_a_page():
    for row in ledger_rows():
        (target,) = re.findall(r"\]\(([^)]+)\)", row["claim"])
        page, _, anchor = target.partition("#")
        assert (PAGES / page).is_file(), f"{row['claim']}: no page {page}"
        assert anchor in anchors(PAGES / page), f"{row['claim']}: no section #{anchor} in {page}"


def test_the_counts_under_the_ledger_are_the_rows():
    counts = Counter(row["verdict"] for row in ledger_rows())
    text = " ".join(LEDGER.read_text(encoding="utf-8").split())
    stated = (
        f"Counts: {counts['reproduced']} reproduced, {counts['in direction, within noise']} in "
        f"direction within noise, {counts['not reproduced at this budget']} not reproduced at "
        f"this budget, {counts['contradicted']} contradicted, {counts['not run']} not run "
        f"({sum(counts.values())} rows)."
    )
    assert stated in text


def test_each_page_states_its_verdicts_in_the_ledgers_words():
    for page in ("inan2017.md", "pappas2020.md", "heo2024.md", "heo2025.md"):
        text = (PAGES / page).read_text(encoding="utf-8")
        for line in text.splitlines():
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if line.startswith("|") and len(cells) == 5 and cells[0] not in ("claim", "---"):
                if cells[4].startswith("-"):
                    continue
                word = re.sub(r" \(.*\)$", "", cells[4])
                assert word in VERDICTS or cells[4] == "verdict", f"{page}: {line}"
