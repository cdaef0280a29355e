"""The code snippets of README.md, and the machinery tests/test_readme.py runs them with.

What counts as a snippet:

- every fenced code block (```python: Python; no language, or sh/bash/shell/console: shell commands, one a
  line, ``#`` comments allowed; a shell block whose lines show optional arguments in brackets
  (``nczmap search URL [PREFIX]``) is the command *synopsis*, checked against ``nczmap --help``). A block in
  any other language is an error until this module learns to run it;
- inline code that is a complete command or call, so that a grant example in the prose cannot drift either:
  ``nczmap <subcommand> ...`` with at least one path or URL and no metavariable (``SRC``, ``URL``, ``...``),
  and a Python call of a public ``nczmap`` function whose names are all ``nczmap``'s or ``url`` (the prose's
  name for the dataset, bound by the test) and whose arguments are not elided (``virtualize(..., x=1)`` is the
  prose's shorthand for an option; an elided *value*, ``{"endpoint": ...}``, is a placeholder and makes the
  snippet fail until the README gives a value).

:func:`localize` moves a snippet's example locations into the test's sandbox; :func:`instrument` compiles a
Python snippet with hooks after the statements whose README lines the test checks (an expression statement's
value is passed to its hook, so that ``zmap.search("/")  # ['.zattrs', ...]`` can be compared with its
comment); line numbers are README.md's, so a traceback names the README line.
"""

from __future__ import annotations

import ast
import io
import re
import shlex
import tokenize
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
HOOK = "__readme_after__"

_FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)\s*$")
_SHELL_LANGUAGES = ("", "sh", "bash", "shell", "console")
_SYNOPSIS = re.compile(r"\[-|\[[A-Z]")  # optional arguments in brackets: [-h], [PREFIX]
_INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
_METAVARIABLE = re.compile(r"\b[A-Z][A-Z_]+\b|\.\.\.")


@dataclass(frozen=True)
class Snippet:
    kind: str  # "python", "shell", "synopsis" or, for a block this module cannot run, "unknown:<language>"
    line: int  # README line of the snippet's first line of code
    code: str
    inline: bool = False

    @property
    def id(self) -> str:
        return f"L{self.line}-{self.kind}" + ("-inline" if self.inline else "")

    def lines(self) -> list[tuple[int, str]]:
        """(README line, text) of each line of code."""
        return [(self.line + n, text) for n, text in enumerate(self.code.split("\n"))]

    def commands(self) -> list[tuple[int, list[str]]]:
        """A shell snippet's commands: (README line, argv), comments dropped, ``\\`` continuations joined."""
        if self.inline:  # a line break in inline code is a space
            return [(self.line, shlex.split(self.code.replace("\n", " ")))]
        found: list[tuple[int, list[str]]] = []
        pending, start = "", 0
        for number, text in self.lines():
            if not pending:
                start = number
            if text.rstrip().endswith("\\"):
                pending += text.rstrip()[:-1] + " "
                continue
            argv = shlex.split(_uncommented(pending + text))
            pending = ""
            if argv:
                found.append((start, argv))
        return found


def _uncommented(line: str) -> str:
    """``line`` without its comment: a ``#`` starting a word outside quotes, as the shell reads it
    (``#mode=`` inside a URL is no comment; shlex's ``comments=True`` would cut it)."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index]
    return line


def snippets(text: str | None = None) -> list[Snippet]:
    """Every snippet of the README (fenced blocks and runnable inline code), in README order."""
    text = README.read_text() if text is None else text
    return sorted([*fenced(text), *inline(text)], key=lambda s: s.line)


def fenced(text: str) -> list[Snippet]:
    found: list[Snippet] = []
    lines = text.split("\n")
    opened: tuple[str, str, int] | None = None  # fence, language, first line of code
    body: list[str] = []
    for number, line in enumerate(lines, 1):
        match = _FENCE.match(line)
        if opened is None:
            if match:
                opened, body = (match[1], match[2].lower(), number + 1), []
            continue
        if match and match[1].startswith(opened[0][0]) and len(match[1]) >= len(opened[0]) and not match[2]:
            found.append(_block(opened[1], opened[2], "\n".join(body)))
            opened = None
        else:
            body.append(line)
    if opened is not None:
        raise ValueError(f"README line {opened[2] - 1}: a code fence is never closed")
    return found


def _block(language: str, line: int, code: str) -> Snippet:
    if language in ("python", "py"):
        return Snippet("python", line, code)
    if language in _SHELL_LANGUAGES:
        return Snippet("synopsis" if _SYNOPSIS.search(code) else "shell", line, code)
    return Snippet(f"unknown:{language}", line, code)


def _outside_fences(text: str) -> str:
    """The text with fenced blocks blanked (line numbers kept)."""
    out, inside = [], None
    for line in text.split("\n"):
        match = _FENCE.match(line)
        if inside is None and match:
            inside = match[1]
            out.append("")
        elif inside is not None:
            if match and match[1].startswith(inside[0]) and not match[2]:
                inside = None
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def inline(text: str) -> list[Snippet]:
    import nczmap

    prose = _outside_fences(text)
    public = set(nczmap.__all__)
    found: list[Snippet] = []
    for match in _INLINE.finditer(prose):
        code, line = match[1], prose.count("\n", 0, match.start(1)) + 1
        if _is_command(code):
            found.append(Snippet("shell", line, code, inline=True))
        elif _is_call(code, public):
            found.append(Snippet("python", line, code, inline=True))
    return found


def subcommands() -> tuple[str, ...]:
    """The ``nczmap`` command's subcommands."""
    import argparse

    from nczmap.cli import build_parser

    found = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return tuple(found[0].choices)


def _is_command(code: str) -> bool:
    words = code.split()
    return (
        len(words) > 2
        and words[0] == "nczmap"
        and words[1] in subcommands()
        and not _METAVARIABLE.search(code)
        and any("/" in word for word in words[2:])
    )


def _is_call(code: str, public: set[str]) -> bool:
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError:
        return False
    call = tree.body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.func.id not in public:
        return False
    if any(isinstance(arg, ast.Constant) and arg.value is Ellipsis for arg in call.args):
        return False  # arguments elided: a shorthand for an option, not something to run
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    return names <= public | {"url"}


def comment_lines(snippet: Snippet) -> dict[int, str]:
    """README line -> the comment on it, for a Python snippet."""
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(snippet.code).readline):
        if token.type == tokenize.COMMENT:
            comments[snippet.line + token.start[0] - 1] = token.string
    return comments


def synopsis(snippet: Snippet) -> tuple[dict[str, set[str]], bool]:
    """The subcommands a synopsis names with the options it gives each, and whether it names --version.

    ``nczmap CMD ...`` lines (with their indented continuation lines) name CMD's options; an option line
    (``--allow PREFIX  # (search, dump, ...; repeatable)``) names an option of the commands listed in its
    comment.
    """
    commands: dict[str, set[str]] = {}
    version = False
    current: str | None = None
    for _, text in snippet.lines():
        code, _, comment = text.partition("#")
        words = code.split()
        if not words:
            continue
        if words[0] == "nczmap":
            if words[1:2] == ["--version"]:
                version, current = True, None
                continue
            current = words[1]
            commands.setdefault(current, set())
            options = _options(" ".join(words[2:]))
        elif words[0].startswith("-"):
            listed = re.findall(r"[a-z]+", comment.split(";")[0])
            for name in listed:
                commands.setdefault(name, set()).update(_options(code))
            current = None
            continue
        elif current is not None and text.startswith(" "):
            options = _options(code)
        else:
            raise ValueError(f"synopsis line {text!r}: neither a command, its continuation nor an option")
        if current is not None:
            commands[current] |= options
    return commands, version


def _options(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text))


# --------------------------------------------------------------------------------------------- the sandbox
EXAMPLE_BUCKET = "bucket"
EXAMPLE_S3_ENDPOINT = "http://127.0.0.1:9000"  # the README's MinIO endpoint
EXAMPLE_ROOTS = ("data", "archive")  # /data/..., /archive/...


def localize(code: str, kind: str, root: Path, endpoint: str, bucket: str) -> str:
    """``code`` with the README's example locations moved into the sandbox (line breaks kept).

    ``/data/...`` and ``/archive/...`` (bare or as ``file:///``) go under ``root``; ``s3://bucket/...`` goes
    to ``bucket`` on the S3 server at ``endpoint``: a dataset URL (with ``#mode=``) and a shell argument as
    the path-style endpoint URL the README describes, a Python grant keeps its ``s3://`` prefix and gets
    the endpoint as its option (a bare ``"s3://bucket/p/"`` grant becomes ``{"s3://.../p/": {"endpoint":
    ...}}``); the README's example endpoint ``http://127.0.0.1:9000`` is the server's.
    """
    server = f"{endpoint}/{bucket}"
    code = re.sub(rf"s3://{EXAMPLE_BUCKET}/([^\s'\"#]*)#", lambda m: f"{server}/{m[1]}#", code)
    if kind == "shell":
        code = re.sub(rf"s3://{EXAMPLE_BUCKET}/([^\s'\"#]*)", lambda m: f"{server}/{m[1]}#mode=s3", code)
    else:
        code = re.sub(
            rf'"s3://{EXAMPLE_BUCKET}/([^"#]*)"(\s*:)', lambda m: f'"s3://{bucket}/{m[1]}"{m[2]}', code
        )
        code = re.sub(
            rf'"s3://{EXAMPLE_BUCKET}/([^"#]*)"',
            lambda m: f'{{"s3://{bucket}/{m[1]}": {{"endpoint": "{endpoint}"}}}}',
            code,
        )
    code = code.replace(EXAMPLE_S3_ENDPOINT, endpoint)
    roots = "|".join(EXAMPLE_ROOTS)
    code = re.sub(rf"file:///({roots})/", lambda m: f"{root.as_uri()}/{m[1]}/", code)
    code = re.sub(rf"(?<=[\s'\"\[(=])/({roots})(?=[/'\"\s]|$)", lambda m: f"{root}/{m[1]}", code)
    code = re.sub(rf"^/({roots})(?=[/'\"\s]|$)", lambda m: f"{root}/{m[1]}", code)
    left = re.search(rf"s3://{EXAMPLE_BUCKET}/|(?<![\w.:/-])/({roots})/|example\.(org|com)", code)
    if left:
        raise ValueError(f"the sandbox does not know where to put {left[0]!r} in {code!r}")
    return code


def instrument(snippet: Snippet, code: str, hooked: set[int]) -> ast.Module:
    """``code`` (the localized snippet) parsed, with ``__readme_after__(lines, value)`` called after each
    statement on a README line in ``hooked`` (its value: that of an expression statement, else None; for
    ``with``/``for``/... the hook runs after the whole block, so a ``with`` line's hook sees it closed).
    Line numbers are README.md's."""
    tree = ast.parse(code, mode="exec" if not snippet.inline else "eval")
    if snippet.inline:
        tree = ast.Module(body=[ast.Expr(tree.body, lineno=1, col_offset=0)], type_ignores=[])
        tree.body[0].end_lineno, tree.body[0].end_col_offset = tree.body[0].value.end_lineno, 0
    ast.increment_lineno(tree, snippet.line - 1)

    def hook(lines: list[int], value: ast.expr) -> ast.Expr:
        call = ast.Call(ast.Name(HOOK, ast.Load()), [ast.Constant(tuple(lines)), value], [])
        return ast.Expr(call)

    def rewrite(body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for statement in body:
            children = [
                f for f in ("body", "orelse", "finalbody") if isinstance(getattr(statement, f, None), list)
            ]
            for field in children:
                setattr(statement, field, rewrite(getattr(statement, field)))
            for handler in getattr(statement, "handlers", []):
                handler.body = rewrite(handler.body)
            end = statement.body[0].lineno if children else statement.end_lineno + 1
            lines = sorted(set(range(statement.lineno, end)) & hooked)
            if not lines:
                out.append(statement)
            elif isinstance(statement, ast.Expr):
                out.append(ast.copy_location(hook(lines, statement.value), statement))
            else:
                out += [statement, ast.copy_location(hook(lines, ast.Constant(None)), statement)]
        return out

    tree.body = rewrite(tree.body)
    return ast.fix_missing_locations(tree)
