"""The documentation's budget and coverage (docs/development/testing.md), checked without building the site.

`make docs` is the strict MkDocs build (broken links and references fail it); these fast checks keep the
shape: a short README, no page over about 600 lines, a generated reference page for every click command,
and every page under docs/ in mkdocs.yml's nav.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from tpuctl.cli.app import COMMANDS, cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README_MAX_LINES = 210
PAGE_MAX_LINES = 600
DIRECTIVE = re.compile(r"^::: mkdocs-click\n((?:[ \t]+:\w+:.*\n)+)", re.MULTILINE)


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _directives() -> list[dict[str, str]]:
    found = []
    for page in sorted((DOCS / "reference" / "cli").glob("*.md")):
        for match in DIRECTIVE.finditer(page.read_text(encoding="utf-8")):
            options = dict(re.findall(r":(\w+):\s*(.*)", match.group(1)))
            options["page"] = page.name
            found.append(options)
    return found


def _nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def _walk(command: click.Command, ctx: click.Context, path: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every command path under ``command`` (the group's lazy commands loaded as `tpuctl` loads them)."""
    found = [path]
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, name
            found += _walk(sub, click.Context(sub, info_name=name, parent=ctx), (*path, name))
    return found


def test_readme_is_short() -> None:
    assert _lines(ROOT / "README.md") <= README_MAX_LINES, "README.md: keep it short; move detail into docs/"


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")), ids=lambda p: str(p.relative_to(DOCS)))
def test_no_page_is_over_budget(page: Path) -> None:
    assert _lines(page) <= PAGE_MAX_LINES, f"{page.relative_to(ROOT)}: over {PAGE_MAX_LINES} lines; split it"


def test_every_command_has_a_generated_reference_page() -> None:
    """Each top-level command is documented by mkdocs-click from the very object the group loads, with its
    subcommands nested (the default), and the group itself on the index page."""
    by_command = {(d["module"], d["command"]): d for d in _directives()}
    root = by_command.get(("tpuctl.cli.app", "cli"))
    assert root is not None and root.get("list_subcommands") == "true", "the group's page lists every command"
    ctx = click.Context(cli, info_name="tpuctl")
    for name in cli.list_commands(ctx):
        module, attr = COMMANDS[name][0].split(":")
        directive = by_command.get((module, attr))
        assert directive is not None, f"tpuctl {name}: no ::: mkdocs-click page for {module}:{attr} in docs/reference/cli"
        assert directive["prog_name"] == f"tpuctl {name}", directive
        assert directive.get("style") == "plain", "plain: the page shows what --help prints"
        assert "show_hidden" not in directive and directive.get("depth", "1").isdigit()
    # every command path (subcommands too) is reached from a page: its top-level command's directive nests it
    paths = _walk(cli, ctx, ("tpuctl",))
    assert len(paths) > len(COMMANDS)  # sim up/status/run/down, topology show, mesh plan
    for path in paths[1:]:
        assert path[1] in COMMANDS, path


def test_the_nav_lists_every_page() -> None:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)
    nav = _nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(set(nav)) == pages, "mkdocs.yml nav and docs/ differ"
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
