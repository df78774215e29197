"""Every code name docs/architecture.md gives exists: the files and folders it names, and each
`module.name` it writes in backticks (`decide._Run.may_service_out`, `crossrun.neighbours`,
`api.run_is_live`, `orchestrator/engine/initialize.py:run_name`), so the map cannot drift from
the code it describes. The files and folders every other document names exist too.

A dotted name is checked when its first word names a module or package of orchestrator/ (by its
last component: `updaterun`, `decide`, `engine`, or in full: `orchestrator.pipeline.driver`); the
rest is looked up in the source (classes, functions, methods, fields, constants, re-exports), not
imported. Spec fields (`spec.timeouts`) and proto names (`GetPluginInfo.fleet_id`) are not code
of ours and are left alone. A first word naming a module that no longer exists fails too.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "orchestrator"
DOC = ROOT / "docs" / "architecture.md"
#: Modules that were renamed when orchestrator/ became packages: a name starting with one of
#: these is out of date, not a spec field.
RETIRED = {
    "runs": "controllers/updaterun.py",
    "controller": "controllers/manager.py",
    "gates": "controllers/approvals.py",
    "fleet": "engine/observations.py",
}
PATH = re.compile(r"^(orchestrator|tests|plugins|docs|benchmarks|devtools|manifests|scripts)/\S*$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(\(\))?$")


def spans(text: str) -> list[str]:
    """The text of every inline code span (fenced blocks left out)."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", prose)


@functools.cache
def modules() -> dict[str, list[Path]]:
    """Last component of every module and package of orchestrator/ → its source files."""
    found: dict[str, list[Path]] = {"orchestrator": [PACKAGE / "__init__.py"]}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.parent.name if path.name == "__init__.py" else path.stem
        found.setdefault(name, []).append(path)
    return found


@functools.cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def defined(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """The statement of `body` that binds `name` (class, function, assignment, import)."""
    for node in body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name == name:
                return node
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return node
        elif isinstance(node, ast.AnnAssign):
            if isinstance(node.target, ast.Name) and node.target.id == name:
                return node
        elif isinstance(node, ast.ImportFrom) and any(
            (a.asname or a.name) == name for a in node.names
        ):
            return node
    return None


def source_of(module: str) -> Path | None:
    """The file of a dotted module of ours (orchestrator.x.y), or None."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def resolve(path: Path, names: list[str]) -> bool:
    """Whether `names` (attribute after attribute) exists in the module at `path`."""
    if not names:
        return True
    if path.name == "__init__.py" and (path.parent / f"{names[0]}.py").is_file():
        return resolve(path.parent / f"{names[0]}.py", names[1:])
    if path.name == "__init__.py" and (path.parent / names[0] / "__init__.py").is_file():
        return resolve(path.parent / names[0] / "__init__.py", names[1:])
    node = defined(tree(path).body, names[0])
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        alias = next(a for a in node.names if (a.asname or a.name) == names[0])
        target = source_of(node.module)
        sub = source_of(f"{node.module}.{alias.name}")
        if sub is not None:  # from package import module
            return resolve(sub, names[1:])
        return target is not None and resolve(target, [alias.name, *names[1:]])
    if node is None:
        return False
    for name in names[1:]:
        if not isinstance(node, ast.ClassDef):
            return True  # an attribute of a value (a field's own fields): beyond the source
        node = defined(node.body, name)
        if node is None:
            return False
    return True


def check_path(span: str) -> str | None:
    """A problem with a file or folder named in the doc (`path`, `path:name`), or None."""
    where, _, name = span.partition(":")
    path = ROOT / where
    if not path.exists():
        return f"`{span}`: {where} does not exist"
    if name and not (path.suffix == ".py" and resolve(path, name.split("."))):
        return f"`{span}`: {where} defines no {name}"
    return None


def check_dotted(span: str) -> str | None:
    """A problem with a `module.name` named in the doc, or None (not a name of ours)."""
    words = span.removesuffix("()").split(".")
    if words[1:] == ["py"] and words[0].startswith("test_"):  # a test file by its name
        found_test = any((ROOT / "tests").rglob(span))
        return None if found_test else f"`{span}`: no such file in tests/"
    if words[1:] == ["py"]:  # a module by its file name: `webhook_certs.py`
        words = words[:1]
        if words[0] not in RETIRED and words[0] not in modules():
            return f"`{span}`: no such file in orchestrator/"
    if words[0] in RETIRED:
        return f"`{span}`: module {words[0]} is now orchestrator/{RETIRED[words[0]]}"
    if words[0] == "orchestrator":
        path = source_of(".".join(words[:2]))
        if path is None:
            return f"`{span}`: no module orchestrator.{words[1]}"
        found = resolve(path, words[2:])
    elif words[0] in modules():
        found = any(resolve(path, words[1:]) for path in modules()[words[0]])
    else:
        return None
    return None if found else f"`{span}`: not found in orchestrator/"


def problems(text: str) -> list[str]:
    out = []
    for span in (s.strip() for s in spans(text)):
        if PATH.match(span):
            out.append(check_path(span))
        elif DOTTED.match(span):
            out.append(check_dotted(span))
    return [p for p in out if p]


def test_every_code_name_in_architecture_exists() -> None:
    assert problems(DOC.read_text()) == []


@pytest.mark.parametrize(
    "doc",
    sorted(
        str(p.relative_to(ROOT))
        for p in [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("tests/**/*.md")]
    ),
)
def test_every_path_in_the_docs_exists(doc: str) -> None:
    """Files and folders any document names (`orchestrator/adapters/provider.py`); a
    placeholder such as `plugins/<name>/` is not a path."""
    named = {s.strip() for s in spans((ROOT / doc).read_text())}
    found = [check_path(s) for s in sorted(named) if PATH.match(s) and "<" not in s]
    assert [p for p in found if p] == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("`runs._held_by`", "`runs._held_by`: module runs is now orchestrator/controllers/"),
        ("`updaterun.UpdateRunController._held_by`", "not found in orchestrator/"),
        ("`decide._Run.no_such_method`", "not found in orchestrator/"),
        ("`orchestrator/engine/nowhere.py`", "does not exist"),
        ("`orchestrator/engine/initialize.py:no_such_name`", "defines no no_such_name"),
        ("`orchestrator.pipeline.nowhere`", "not found in orchestrator/"),
        ("`orchestrator.nowhere.x`", "no module orchestrator.nowhere"),
        ("`nowhere.py`", "no such file in orchestrator/"),
        ("`test_nowhere.py`", "no such file in tests/"),
        ("`runs.py`", "module runs is now orchestrator/controllers/updaterun.py"),
    ],
)
def test_a_name_that_does_not_exist_is_found(text: str, problem: str) -> None:
    found = problems(text)
    assert len(found) == 1 and problem in found[0], found


@pytest.mark.parametrize(
    "text",
    [
        "`decide._Run.may_service_out`",
        "`updaterun.UpdateRunController._neighbours`",
        "`api.run_is_live`",
        "`api.FINISHED_PHASES`",
        "`engine.decide`",
        "`orchestrator.pipeline.driver.RunDriver.step`",
        "`orchestrator/engine/initialize.py:run_name`",
        "`webhook_certs.py`",
        "`test_lease_model.py`",
        "`api.fields._at_least`",
        "`spec.timeouts`",
        "`GetPluginInfo.fleet_id`",
    ],
)
def test_names_that_exist_and_names_not_ours_pass(text: str) -> None:
    assert problems(text) == []
