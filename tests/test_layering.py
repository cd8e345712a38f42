"""The code's shape: the package's layering (tools -> cli -> engine ->
models/analysis -> ops; dependencies and version below), no import cycle
between its modules (function-level imports included), private APIs of
other packages only in sn_mm/ops/_compat.py, and no function longer than
80 lines."""
import ast
import glob
import os
import os.path as osp
import re

import pytest
from tool_runner import ROOT

PACKAGE = osp.join(ROOT, 'sn_mm')
# What each part of the package may import from the package.
ALLOWED = {
    'ops': {'ops'},
    'models': {'models', 'ops'},
    'analysis': {'models', 'ops'},
    'engine': {'engine', 'analysis', 'models', 'ops'},
    'testing': {'testing', 'models', 'ops'},
    'cli': {'engine', 'analysis', 'models', 'ops', 'dependencies'},
    'video': {'engine', 'models', 'ops', 'dependencies'},
    'dependencies': {'version'},
    'version': set(),
}
PRIVATE = re.compile(r'torch\._[A-Za-z]|\._internal\b|environ\._data|'
                     r'\.packed_metadata|\._parameters\b|\._buffers\b|'
                     r'\._modules\b|\._forward\b|\b_validate_cfg\b')


def modules():
    """{module name: path} of every module of the package."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith('.py'):
                path = osp.join(folder, name)
                rel = osp.relpath(path, ROOT)[:-3].replace(os.sep, '.')
                found[rel[:-len('.__init__')] if rel.
                      endswith('__init__') else rel] = path
    return found


def imports_of(name, path, is_package):
    """The package's modules that ``name`` imports, at any depth of its
    code (function-level imports count)."""
    package = name if is_package else name.rsplit('.', 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parts = package.split('.')
                parts = parts[:len(parts) - node.level + 1]
                base = '.'.join(parts + ([base] if base else []))
            if base.startswith('sn_mm'):
                found.add(base)
                found.update(f'{base}.{a.name}' for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(
                a.name for a in node.names if a.name.startswith('sn_mm'))
    return found


def graph():
    mods = modules()
    return {
        name: {
            m
            for m in imports_of(name, path, path.endswith('__init__.py'))
            if m in mods and m != name
        }
        for name, path in mods.items()
    }


def part(module):
    parts = module.split('.')
    return parts[1] if len(parts) > 1 else None


def test_no_upward_or_sideways_import():
    wrong = []
    for name, deps in graph().items():
        allowed = ALLOWED.get(part(name))
        if allowed is None:  # sn_mm/__init__.py: the package's face
            continue
        wrong += [
            f'{name} -> {d}' for d in sorted(deps)
            if part(d) is not None and part(d) not in allowed
        ]
    assert not wrong, wrong


def find_cycle(edges):
    """One cycle of the directed graph as a list of nodes, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = 'open'
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 'open':
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 'done'
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def module_graph():
    """Edges between modules, a package's own __init__ left out of what its
    modules import (importing a sibling goes through it)."""
    edges = graph()
    return {
        name: {d
               for d in deps if not name.startswith(d + '.')}
        for name, deps in edges.items()
    }


def test_no_import_cycle():
    assert find_cycle(module_graph()) is None


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({
        'a': {'b'},
        'b': {'c'},
        'c': {'a'}
    }) == ['a', 'b', 'c', 'a']
    assert find_cycle({'a': {'b'}, 'b': {'c'}}) is None


def test_the_layering_check_sees_function_level_imports(tmp_path):
    path = tmp_path / 'mod.py'
    path.write_text('def f():\n    from ..analysis import sn_ratios\n')
    assert 'sn_mm.analysis' in imports_of('sn_mm.models.mod', str(path), False)


@pytest.mark.parametrize('folder', ['sn_mm', 'tools'])
def test_private_apis_only_in_compat(folder):
    hits = []
    for base, _, files in os.walk(osp.join(ROOT, folder)):
        for name in files:
            path = osp.join(base, name)
            if not name.endswith('.py') or path.endswith(
                    osp.join('ops', '_compat.py')):
                continue
            for i, line in enumerate(open(path), 1):
                if PRIVATE.search(line.split('#')[0]):
                    hits.append(f'{osp.relpath(path, ROOT)}:{i}')
    assert not hits, hits


def test_tools_do_not_import_the_tests():
    hits = []
    for base, _, files in os.walk(osp.join(ROOT, 'tools')):
        for name in files:
            if name.endswith('.py'):
                text = open(osp.join(base, name)).read()
                if re.search(
                        r'^\s*(from|import) (tests|helpers|sn_reference)'
                        r'\b|sys\.path.*tests', text, re.M):
                    hits.append(name)
    assert not hits, hits


MAX_FUNCTION_LINES = 80


def python_function_lengths(path):
    tree = ast.parse(open(path).read(), path)
    return [(node.name, node.end_lineno - node.lineno + 1)
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def cpp_function_lengths(text):
    """(first line, lines) of each function body: from the line that opens
    it (a line ending in ``) {``) to its closing brace."""
    found, depth, start, base = [], 0, None, 0
    for line in text.split('\n'):
        code = re.sub(r'"(\\.|[^"\\])*"', '""', re.sub(r'//.*', '', line))
        if start is None and re.search(r'\)\s*(const\s*)?\{\s*$', code) \
                and not re.match(r'\s*(\}|if|for|while|switch|else)\b',
                                 code) and '[&]' not in code:
            start, base, count = code.strip(), depth, 0
        depth += code.count('{') - code.count('}')
        if start is not None:
            count += 1
            if depth == base:
                found.append((start, count))
                start = None
    return found


def test_no_function_longer_than_80_lines():
    long = []
    for folder in ('sn_mm', 'tools'):
        for path in glob.glob(
                osp.join(ROOT, folder, '**', '*.py'), recursive=True):
            long += [(osp.relpath(path, ROOT), name, n)
                     for name, n in python_function_lengths(path)
                     if n > MAX_FUNCTION_LINES]
    for path in glob.glob(osp.join(PACKAGE, '**', '*.cpp'), recursive=True):
        long += [(osp.relpath(path, ROOT), name, n)
                 for name, n in cpp_function_lengths(open(path).read())
                 if n > MAX_FUNCTION_LINES]
    assert not long, long


def test_the_length_checks_count_lines():
    text = 'int f(int a) {\n' + '  a += 1;\n' * 90 + '  return a;\n}\n'
    assert cpp_function_lengths(text) == [('int f(int a) {', 93)]
    assert cpp_function_lengths('void g() {\n  if (x) {\n  }\n}\n') == [
        ('void g() {', 4)
    ]


@pytest.mark.parametrize('line', [
    'torch._C._foo()', 'x = self._parameters', 'b = m._buffers["x"]',
    'm._modules[name] = y', 'model._forward(x)', 'super()._validate_cfg()',
    'os.environ._data', 'compiled.packed_metadata'
])
def test_the_private_api_check_sees(line):
    assert PRIVATE.search(line)
