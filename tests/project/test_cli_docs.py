"""docs/cli.md against the ``targetlm`` parser, and README's "What it found" against the pages
it links, so neither can drift from what they describe.

docs/cli.md has one ``## `targetlm CMD` `` section per subcommand of ``build_parser()``. A flag
counts as named for a command where the command names it: on a ``targetlm CMD ...`` line of a
code block (with its continuation lines), in an inline code span that starts with the command
(``targetlm eval --file PATH``, ``eval --file PATH``, ``analyze tsne|freq-bins --out``), or,
in a command's section, in a code span that is the flag alone (`` `--segment` ``). Each such flag
must be an option of that command's parser (for ``analyze``, of the analysis named, or of any).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from targetlm.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
CLI_DOC = REPO / "docs" / "cli.md"
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


COMMANDS = subparsers(build_parser())


def command_options(command: str, words: list[str]) -> set[str]:
    """The options of ``command``, narrowed to the analysis (``a|b`` names several) that the
    first of ``words`` names, where the command has analyses."""
    parser = COMMANDS[command]
    nested = subparsers(parser)
    if not nested:
        return options(parser)
    named = [nested[name] for name in (words[0] if words else "").split("|") if name in nested]
    return set().union(options(parser), *(options(p) for p in named or nested.values()))


def named_flags(words: list[str]) -> list[str]:
    return [flag for word in words for flag in FLAG.findall(word)]


def invocation(text: str) -> tuple[str, list[str]] | None:
    """(command, the words after it) of text holding ``targetlm CMD ...``, or of a code span
    starting with ``CMD``; None if it names no command."""
    match = re.search(r"(?:^|[\s/])targetlm\s+(\S+)(.*)", text) or re.match(r"(\S+)(.*)", text)
    if not match or match.group(1) not in COMMANDS:
        return None
    return match.group(1), match.group(2).split()


def doc_sections() -> dict[str | None, str]:
    """The text of docs/cli.md per ``## `targetlm CMD` `` section (None: before the first)."""
    text = CLI_DOC.read_text(encoding="utf-8")
    sections: dict[str | None, str] = {}
    current = None
    for part in re.split(r"^(## .*)$", text, flags=re.M):
        heading = re.fullmatch(r"## `targetlm ([\w-]+)`", part.strip())
        if heading:
            current = heading.group(1)
        elif not part.startswith("## "):
            sections[current] = sections.get(current, "") + part
    return sections


def code_block_commands(text: str) -> list[str]:
    """Each command of the fenced code blocks of ``text``, its continuation lines (after a
    backslash, or indented under it) joined and its comments dropped."""
    commands: list[str] = []
    for block in re.findall(r"^```\w*\n(.*?)^```", text, flags=re.M | re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            code = re.sub(r"(^|\s)#.*", "", line)
            if not code.strip():
                continue
            if line[:1].isspace() and commands:
                commands[-1] += " " + code
            else:
                commands.append(code)
    return commands


def prose(text: str) -> str:
    return re.sub(r"^```\w*\n.*?^```", "", text, flags=re.M | re.S)


def flag_uses() -> list[tuple[str, str, str]]:
    """(command, flag, where) for every flag docs/cli.md names for a command."""
    uses = []
    for section, text in doc_sections().items():
        for line in code_block_commands(text):
            found = invocation(line)
            if found:
                command, words = found
                uses += [(command, flag, line.strip()) for flag in named_flags(words)]
        for span in (" ".join(s.split()) for s in re.findall(r"`([^`]+)`", prose(text))):
            found = invocation(span)
            if found:
                command, words = found
                uses += [(command, flag, f"`{span}`") for flag in named_flags(words)]
            elif span.startswith("--") and section is not None:
                uses += [(section, flag, f"`{span}`") for flag in named_flags(span.split())]
    return uses


def test_every_subcommand_has_a_section_in_docs_cli_md():
    sections = doc_sections()
    missing = sorted(set(COMMANDS) - set(sections))
    assert not missing, f"docs/cli.md has no '## `targetlm CMD`' section for {missing}"
    unknown = sorted(name for name in sections if name is not None and name not in COMMANDS)
    assert not unknown, f"docs/cli.md has sections for commands the parser lacks: {unknown}"


def test_docs_cli_md_names_flags_for_most_commands():
    """The parsing above finds what it should: flags of nearly every command."""
    commands = {command for command, _, _ in flag_uses()}
    assert len(commands) >= len(COMMANDS) - 2, sorted(set(COMMANDS) - commands)


def test_every_flag_docs_cli_md_names_exists_in_its_commands_parser():
    wrong = []
    for command, flag, where in flag_uses():
        words = (invocation(where.strip("`")) or (command, []))[1]
        if flag not in command_options(command, words):
            wrong.append(f"targetlm {command} has no {flag} ({where})")
    assert not wrong, "docs/cli.md:\n" + "\n".join(sorted(set(wrong)))


def test_overview_flags_exist_in_some_command():
    """Flags alone in a code span before the first command's section belong to several."""
    every = set().union(*(command_options(c, []) for c in COMMANDS))
    spans = re.findall(r"`(--[^`]+)`", prose(doc_sections().get(None, "")))
    unknown = sorted({flag for span in spans for flag in named_flags(span.split())} - every)
    assert not unknown, f"docs/cli.md's overview names flags no command has: {unknown}"


# --- README's "What it found" against the pages it links --------------------------------------

NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?![\w])")


def found_lines() -> list[tuple[Path, str]]:
    """(linked page, text) for each line of README's "What it found" section; a line without a
    link of its own belongs to the page the line before linked."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## What it found", 1)[1].split("\n## ", 1)[0]
    lines, page = [], None
    for line in section.strip().splitlines():
        links = re.findall(r"\]\((docs/reproductions/[^)#]*)", line)
        if links:
            page = REPO / links[0]
        assert page is not None, f"README 'What it found': {line!r} before any link"
        text = re.sub(r"\]\([^)]*\)", "]", line)  # the link targets' digits are no claims
        lines.append((page, text))
    return lines


def test_what_it_found_links_every_paper_page():
    pages = {page.name for page, _ in found_lines()}
    assert {"README.md", "inan2017.md", "pappas2020.md", "heo2024.md", "heo2025.md"} <= pages


@pytest.mark.parametrize(
    ("page", "text"), found_lines(), ids=[f"line{i}" for i, _ in enumerate(found_lines())]
)
def test_each_number_in_what_it_found_is_on_the_page_it_links(page, text):
    assert page.is_file(), f"README links {page.relative_to(REPO)}, which does not exist"
    page_text = page.read_text(encoding="utf-8")
    on_page = set(NUMBER.findall(page_text))
    missing = [n for n in NUMBER.findall(text) if n not in on_page]
    assert not missing, f"{page.relative_to(REPO)} does not say {missing} (README: {text!r})"
