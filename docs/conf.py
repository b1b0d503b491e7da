"""Sphinx configuration of gpuspawner's docs site (`make docs`).

Sphinx + MyST Markdown, the traitlets reference from autodoc-traits and JupyterHub's
theme, as JupyterHub's own projects build theirs. The build runs offline (no
intersphinx inventories are fetched) and with warnings as errors (`-W -n`), so a
broken link or reference fails `make test`.
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
# the site's own small extensions (docs/_ext): the reference's trait filter, the
# catalog reference
sys.path.insert(0, str(DOCS / "_ext"))

from gpuspawner._version import __version__  # noqa: E402

project = "gpuspawner"
author = "gpuspawner contributors"
copyright = "gpuspawner contributors"
version = release = __version__

extensions = [
    "myst_parser",
    "autodoc_traits",
    "sphinx.ext.autodoc",
    "configref",
    "catalogref",
]

# the Markdown pages are the source (docs/ itself, so that links into docs/ keep
# working on GitHub); what is not a page stays out
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
# "[text](page.md#a-heading)" links, as GitHub renders them
myst_heading_anchors = 4

# offline: no inventories are fetched, so references to other projects' objects
# (traitlets' and KubeSpawner's classes in the reference's signatures) cannot resolve
intersphinx_mapping: dict = {}
nitpicky = True

# the reference: each class's settings in source order, its docstring once
autodoc_member_order = "bysource"
autoclass_content = "class"
autodoc_typehints = "none"

html_theme = "pydata_sphinx_theme"
html_title = "gpuspawner"
html_static_path: list[str] = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}

# Pygments' PromQL lexer fails on subqueries (`[7200s:60s]`) and falls back to plain
# text: the block still renders, so that is not a fault of the page
suppress_warnings = ["misc.highlighting_failure"]
