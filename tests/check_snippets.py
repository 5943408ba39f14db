#!/usr/bin/env python3
"""Fails unless every C++ snippet that documentation shows is a compiled, tested program's own lines.

Snippets are marked in the examples (examples/*), each one between two comment lines:

    // [snippet:NAME]
    ...the lines users see...
    // [end-snippet]

Checked: every ```cpp (also c++, cu, cuda) block of README.md, and every such block in the comments of the headers
in include/gdx/ and include/gdx/device/ (with the comment markers `//` / `///` and one space stripped), must equal
one marked snippet, ignoring common indentation and blank lines at either end. A header comment must not show code
outside such a block either: an indented comment line that reads like a C++ statement fails the check too, so that
no unchecked snippet can be added by accident.

Usage: check_snippets.py [REPO_ROOT]
"""
import pathlib
import re
import sys
import textwrap

FENCE_LANGS = {"cpp", "c++", "cu", "cuda"}
START = re.compile(r"^\s*//\s*\[snippet:([\w.-]+)\]\s*$")
END = re.compile(r"^\s*//\s*\[end-snippet\]\s*$")
COMMENT = re.compile(r"^\s*///?(?: |$)(.*)$")
# An indented comment line that ends like a statement ("foo(x);", "int y = 3;", "};"), has a call, an assignment,
# a scope or a brace in it, and no run of three plain words as prose has.
CODE_LIKE = re.compile(r"^ {2,}\S.*(\)|\w|\})\s*;\s*(//.*)?$")
CODE_MARK = re.compile(r"[(={}]|::")
PROSE = re.compile(r"\b[A-Za-z]+ [A-Za-z]+ [A-Za-z]+\b")


def looks_like_code(line):
    if not CODE_LIKE.match(line):
        return False
    code = line.split("//")[0]
    return bool(CODE_MARK.search(code)) and not PROSE.search(code)


def normalize(lines):
    """Drops blank lines at either end and the indentation common to all lines."""
    text = "\n".join(line.rstrip() for line in lines).strip("\n")
    return textwrap.dedent(text)


def snippets(root, errors):
    found = {}
    for path in sorted((root / "examples").iterdir()):
        if not path.is_file():
            continue
        name, body, start = None, [], 0
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(root)}:{number}"
            if START.match(line):
                if name:
                    errors.append(f"{where}: snippet '{START.match(line).group(1)}' starts inside '{name}'")
                name, body, start = START.match(line).group(1), [], number
            elif END.match(line):
                if not name:
                    errors.append(f"{where}: [end-snippet] without a [snippet:NAME] before it")
                    continue
                if name in found:
                    errors.append(f"{where}: snippet '{name}' is also marked in {found[name][0]}")
                found[name] = (f"{path.relative_to(root)}:{start}", normalize(body))
                name = None
            elif name:
                body.append(line)
        if name:
            errors.append(f"{path.relative_to(root)}:{start}: snippet '{name}' has no [end-snippet]")
    return found


def fenced_blocks(lines):
    """(first line number, lines) of every C++ fenced block in `lines` (already stripped of comment markers)."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(lines, 1):
        fence = re.match(r"^\s*```\s*([\w+]*)\s*$", line)
        if fence and current is None:
            current, start, lang = [], number, fence.group(1).lower()
        elif fence:
            if lang in FENCE_LANGS:
                blocks.append((start, current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def header_comments(text):
    """The header's lines with comment markers stripped; None for a line that is not a // comment."""
    out = []
    for line in text.splitlines():
        m = COMMENT.match(line)
        out.append(m.group(1) if m else None)
    return out


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[1])
    errors = []
    known = snippets(root, errors)
    bodies = {body: where for where, body in known.values()}

    def check(where, block):
        if normalize(block) not in bodies:
            errors.append(f"{where}: this code block is not a marked snippet of examples/ (copy the lines of one, "
                          f"between its // [snippet:NAME] and // [end-snippet], or mark the lines it shows)")

    readme = root / "README.md"
    readme_blocks = fenced_blocks(readme.read_text().splitlines())
    if not readme_blocks:
        errors.append("README.md: no ```cpp block found; the check would check nothing")
    for number, block in readme_blocks:
        check(f"README.md:{number}", block)

    headers = sorted((root / "include" / "gdx").glob("*.hpp")) + sorted((root / "include" / "gdx" / "device").rglob("*.hpp"))
    for header in headers:
        rel = header.relative_to(root)
        comments = header_comments(header.read_text())
        # Fenced blocks are taken from runs of consecutive comment lines.
        run, first = [], 0
        for number, text in enumerate(comments + [None], 1):
            if text is not None:
                if not run:
                    first = number
                run.append(text)
                continue
            inside = set()
            for start, block in fenced_blocks(run):
                check(f"{rel}:{first + start - 1}", block)
                inside.update(range(start, start + len(block) + 2))
            for offset, line in enumerate(run, 1):
                if offset not in inside and looks_like_code(line):
                    errors.append(f"{rel}:{first + offset - 1}: code in a comment outside a ```cpp block "
                                  f"(quote a marked snippet of examples/ in a ```cpp block instead): {line.strip()}")
            run = []

    for e in errors:
        print(e)
    print(f"check_snippets: {len(known)} snippets in examples/, {len(readme_blocks)} README blocks, "
          f"{len(headers)} headers: {'FAILED' if errors else 'ok'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
