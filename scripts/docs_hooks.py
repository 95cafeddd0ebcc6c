"""MkDocs hook (mkdocs.yml `hooks:`): the site's home page is README.md itself, so the two never disagree.

README.md links to the pages as `docs/<page>.md` and to repository files (bench scripts) by their path, which is what
a reader of the repository follows. On the site a page is `<page>.md`, and repository files are not part of the
site, so those links become their plain text (their link text is the path itself).
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def _site_link(match: re.Match) -> str:
    text, target = match.group(1), match.group(2)
    if target.startswith(("http://", "https://", "#")):
        return match.group(0)
    if target.startswith("docs/"):
        return f"[{text}]({target[len('docs/') :]})"
    return text  # a repository file: not on the site


def readme_for_site(readme: str) -> str:
    return LINK.sub(_site_link, readme)


def on_files(files, config):
    readme = Path(config.config_file_path).parent / "README.md"
    files.append(File.generated(config, "index.md", content=readme_for_site(readme.read_text())))
    return files
