"""Public classes and functions of sn_mm have docstrings; every tool has a
module docstring and an argparse parser with a description (its --help)."""
import ast
import glob
import os.path as osp

from tool_runner import ROOT


def _dotted(node) -> str:
    """The dotted name an expression calls or names ('triton.jit',
    'argparse.ArgumentParser'); '' for other expressions."""
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    if isinstance(node, ast.Attribute):
        return f'{_dotted(node.value)}.{node.attr}'
    return node.id if isinstance(node, ast.Name) else ''


def _is_triton_kernel(node) -> bool:
    # Triton compiles a kernel's own source; those are documented by the
    # comment above them.
    return any('triton' in _dotted(d) for d in node.decorator_list)


def undocumented(source: str):
    """Module-level public classes and functions of ``source`` without a
    docstring."""
    return [
        node.name for node in ast.parse(source).body
        if isinstance(node, (
            ast.ClassDef, ast.FunctionDef)) and not node.name.startswith('_')
        and not ast.get_docstring(node) and not _is_triton_kernel(node)
    ]


def tool_problems(source: str):
    """What a tool's source lacks of a module docstring and a parser with a
    description."""
    tree = ast.parse(source)
    problems = [] if ast.get_docstring(tree) else ['no module docstring']
    parsers = [
        node for node in ast.walk(tree) if isinstance(node, ast.Call)
        and _dotted(node.func).endswith('ArgumentParser')
    ]
    if not any(kw.arg == 'description' for p in parsers for kw in p.keywords):
        problems.append('no ArgumentParser(description=...)')
    return problems


def problems_in(folder: str, check):
    """``check(source)`` of every Python file under ``folder``, where it
    finds something, by path."""
    found = {}
    for path in glob.glob(
            osp.join(ROOT, folder, '**', '*.py'), recursive=True):
        with open(path) as f:
            problems = check(f.read())
        if problems:
            found[osp.relpath(path, ROOT)] = problems
    return found


def test_public_classes_and_functions_have_docstrings():
    missing = problems_in('sn_mm', undocumented)
    assert not missing, missing


def test_every_tool_has_a_docstring_and_help():
    assert len(
        glob.glob(osp.join(ROOT, 'tools', '**', '*.py'), recursive=True)) > 15
    problems = problems_in('tools', tool_problems)
    assert not problems, problems


def test_the_checks_see_what_is_missing():
    assert undocumented('class A:\n    pass\n\n\ndef f():\n    pass\n') == \
        ['A', 'f']
    assert undocumented('def _f():\n    pass\n') == []
    assert undocumented('@triton.jit\ndef k(x):\n    pass\n') == []
    assert tool_problems('import argparse\nargparse.ArgumentParser()\n') == \
        ['no module docstring', 'no ArgumentParser(description=...)']
    assert tool_problems(
        '"""A tool."""\nimport argparse\n'
        'argparse.ArgumentParser(description=__doc__)\n') == []
