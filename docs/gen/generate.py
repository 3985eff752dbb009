"""Pages generated at build time by mkdocs-gen-files (mkdocs.yml `plugins: gen-files`).

Each generator (one module per page, beside this file) writes one virtual page from the
sources it documents, so those pages cannot drift from the code or the data: nothing here is
committed as Markdown. Every module's `render()` returns its page; tests/docs/ calls them too.
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(HERE), str(ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

import mkdocs_gen_files  # noqa: E402

import check_page  # noqa: E402
import cli_page  # noqa: E402
import figures_page  # noqa: E402
import local_page  # noqa: E402
import published_page  # noqa: E402
import results_page  # noqa: E402

PAGES = {
    "reference/cli.md": cli_page.render,
    "reference/figures.md": figures_page.render,
    "reference/results.md": results_page.render,
    "validation/published-rows.md": published_page.render,
    "validation/local-rows.md": local_page.render,
    "validation/check-at-full-size.md": check_page.render,
}

for page, render in PAGES.items():
    with mkdocs_gen_files.open(page, "w") as f:
        f.write(render())
