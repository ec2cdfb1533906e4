#!/usr/bin/env python3
"""unit suite (no KVM): the front page and the reference stay true.

- README.md is a front page: at most 250 lines, with the tour between its markers (the e2e
  module `tour` runs it in the KVM box) and, as its Python block, the SDK example the e2e module
  `sdk` runs;
- every relative link in README.md and docs/*.md names a file that exists;
- docs/CLI.md's generated part is what this build's `cove COMMAND --help` prints
  (tools/gen-cli-doc --check).

Usage: check_docs.py BUILD_DIR. Prints one FAIL line per problem and exits 1, else 0.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
README_MAX_LINES = 250


def links(path):
    """(line number, target) of each relative markdown link in PATH."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            for m in re.finditer(r"\]\(([^)#\s]+)(#[^)]*)?\)", line):
                t = m.group(1)
                if not re.match(r"[a-z]+:", t):
                    out.append((n, t))
    return out


def main(build):
    fails = []
    readme = os.path.join(ROOT, "README.md")
    with open(readme) as f:
        text = f.read()
    n = text.count("\n")
    if n > README_MAX_LINES:
        fails.append(f"README.md has {n} lines, more than {README_MAX_LINES}: the reference "
                     f"goes in docs/")
    tour = re.search(r"<!-- tour:begin -->\n```sh\n(.*?)```\n<!-- tour:end -->", text, re.S)
    if not tour or "cove create" not in tour.group(1):
        fails.append("README.md has no tour (a ```sh block between <!-- tour:begin --> and "
                     "<!-- tour:end --> that creates a sandbox)")
    # The SDK's ten lines on the front page are the example the e2e module sdk runs.
    py = re.search(r"```python\n(.*?)```", text, re.S)
    with open(os.path.join(ROOT, "sdk", "python", "examples", "quickstart.py")) as f:
        example = f.read()
    body = example.split('"""', 2)[2].lstrip("\n") if example.startswith('"""') else example
    if not py or py.group(1) != body:
        fails.append("README.md's Python block is not sdk/python/examples/quickstart.py "
                     "(without its docstring), which the e2e module sdk runs")
    docs = os.path.join(ROOT, "docs")
    pages = [readme] + [os.path.join(docs, p) for p in sorted(os.listdir(docs))
                        if p.endswith(".md")]
    for page in pages:
        for line, target in links(page):
            if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(page),
                                                                target))):
                fails.append(f"{os.path.relpath(page, ROOT)}:{line}: link to {target}, "
                             f"which does not exist")
    p = subprocess.run([os.path.join(ROOT, "tools", "gen-cli-doc"), "--check", build],
                       capture_output=True, text=True)
    if p.returncode != 0:
        fails.append((p.stdout + p.stderr).strip().removeprefix("FAIL: "))
    for f in fails:
        print("FAIL: " + f)
    if not fails:
        print(f"README.md: {n} lines; {len(pages)} pages' links resolve; "
              + p.stdout.strip())
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else
                  os.path.join(ROOT, "build")))
