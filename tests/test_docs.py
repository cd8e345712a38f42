"""README and docs/ point at what exists: every repository path and config
name they mention, every relative link and every anchor."""
import glob
import itertools
import os.path as osp
import re

import pytest
from tool_runner import ROOT

DOCS = ['README.md'] + sorted(
    osp.relpath(p, ROOT) for p in glob.glob(osp.join(ROOT, 'docs', '*.md')))
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
CODE = re.compile(r'`([^`\n]+)`')
TOP = ('configs/', 'tools/', 'sn_mm/', 'tests/', 'docs/', 'requirements/',
       '.ci/')
CONFIG_NAME = re.compile(r'^[\w.-]+_[\w.-]+\.py$')
# Paths the docs name that a run makes (not in the repository).
MADE = ('work_dirs/', 'data/', 'checkpoints/', 'gpu_wheels/', 'sn_mm/.mim/')


def text(doc):
    with open(osp.join(ROOT, doc)) as f:
        return f.read()


def slug(heading):
    """GitHub's anchor for a Markdown heading."""
    heading = heading.strip().lower().replace('`', '')
    heading = re.sub(r'[^\w\- ]', '', heading)
    return heading.replace(' ', '-')


def anchors(doc):
    found, counts = set(), {}
    in_code = False
    for line in text(doc).splitlines():
        if line.startswith('```'):
            in_code = not in_code
        elif not in_code and line.startswith('#'):
            base = slug(line.lstrip('#'))
            n = counts.get(base, 0)
            counts[base] = n + 1
            found.add(base if n == 0 else f'{base}-{n}')
    return found


def expand(pattern):
    """Brace alternatives ``{a,b}`` expanded, as a shell would."""
    match = re.search(r'\{([^{}]*)\}', pattern)
    if not match:
        return [pattern]
    return list(
        itertools.chain.from_iterable(
            expand(pattern[:match.start()] + alt + pattern[match.end():])
            for alt in match.group(1).split(',')))


def mentioned_paths(doc):
    for token in CODE.findall(text(doc)):
        for word in token.split():
            word = word.strip('"\'(),;:')
            if word.startswith(TOP) and not word.startswith(MADE):
                yield word.split('#')[0].rstrip('.')


def config_names(doc):
    """Bare config file names in tables and text
    (``mask-rcnn_..._coco.py``)."""
    for token in CODE.findall(text(doc)):
        if CONFIG_NAME.match(token) and '/' not in token and (token.endswith(
            ('coco.py', 'ade20k-450x450.py', 'cityscapes-713x713.py',
             'toy-seg.py', 'toy-coco.py', 'kinetics400-rgb.py',
             'toy-video.py'))):
            yield token


@pytest.mark.parametrize('doc', DOCS)
def test_mentioned_paths_exist(doc):
    missing = []
    for path in mentioned_paths(doc):
        names = expand(path)
        if not all(glob.glob(osp.join(ROOT, n)) for n in names):
            missing.append(path)
    assert not missing, missing


@pytest.mark.parametrize('doc', DOCS)
def test_mentioned_configs_exist(doc):
    configs = {
        osp.basename(p)
        for p in glob.glob(
            osp.join(ROOT, 'configs', '**', '*.py'), recursive=True)
    }
    missing = [
        name for name in config_names(doc)
        if not any(n in configs for n in expand(name))
    ]
    assert not missing, missing


@pytest.mark.parametrize('doc', DOCS)
def test_links_and_anchors_resolve(doc):
    broken = []
    for target in LINK.findall(text(doc)):
        if re.match(r'[a-z]+://', target) or target.startswith('mailto:'):
            continue
        path, _, anchor = target.partition('#')
        linked = (
            osp.normpath(osp.join(osp.dirname(doc), path)) if path else doc)
        if not osp.exists(osp.join(ROOT, linked)):
            broken.append(target)
        elif anchor and linked.endswith('.md') and anchor not in anchors(
                linked):
            broken.append(target)
    assert not broken, broken


def test_the_checks_can_fail(tmp_path):
    assert slug('The GPU check (`make gpu-check`)') == \
        'the-gpu-check-make-gpu-check'
    assert expand('a_{r50,r101}.py') == ['a_r50.py', 'a_r101.py']
    assert 'no-such-heading' not in anchors('README.md')


DATE = re.compile(r'\b20\d\d-\d\d-\d\d\b')
COMMIT = re.compile(r'\bcommits? (?=[0-9a-f]*\d)[0-9a-f]{7,40}\b|'
                    r'\bat (?=[0-9a-f]*\d)[0-9a-f]{7,40}\b')
COMMAND = re.compile(r'`(\.venv/bin/)?(python3?|make|bash) [^`]+`|'
                     r'`tools/[\w/]+\.py[^`]*`')
# A table of measurements: a header naming a unit, a measure or a ratio,
# and a decimal in its rows that is not a version (2.14.1).
MEASURED = re.compile(
    r'\b(ms|us|s|seconds|GB|MiB|accuracy|AP|mAP|mIoU|error|spread|ratio|vs)\b'
    r'|/', re.I)
FIGURE = re.compile(r'\|[^|\n]*?(?<![\d.])\d+\.\d+(?![\d.])')
THE_PAPERS = re.compile(r"the paper's|the authors'|\bTables? \d")


def tables(doc):
    """(line, table, heading): each Markdown table and the text from the
    last level-1 or level-2 heading above it to the table."""
    lines = text(doc).splitlines()
    start, in_code, i = 0, False, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith('```'):
            in_code = not in_code
        elif not in_code and re.match(r'#{1,2} ', line):
            start = i
        elif (not in_code and line.startswith('|') and i + 1 < len(lines)
              and re.match(r'\|[-| :]+\|$', lines[i + 1])):
            end = i
            while end < len(lines) and lines[end].startswith('|'):
                end += 1
            yield i + 1, '\n'.join(lines[i:end]), '\n'.join(lines[start:i])
            i = end
            continue
        i += 1


def unheaded_figures(doc):
    """Tables of figures measured here that do not say when, at which
    commit and with which command. Exempt: the paper's numbers (said so
    in the table or the paragraph above it) and summaries whose every row
    links to the table it summarises."""
    for line, table, heading in tables(doc):
        rows = table.splitlines()[2:]
        paragraph = heading.split('\n\n')[-1]
        if not (MEASURED.search(table.splitlines()[0])
                and any(FIGURE.search(row) for row in rows)):
            continue
        if THE_PAPERS.search(rows and table.splitlines()[0] + paragraph):
            continue
        if all(LINK.search(row) for row in rows):
            continue
        if not (DATE.search(heading) and COMMIT.search(heading)
                and COMMAND.search(heading)):
            yield f'{doc}:{line}'


@pytest.mark.parametrize('doc', DOCS)
def test_figures_carry_their_heading(doc):
    """Every table of figures is headed by its date, commit and the command
    that reproduces it."""
    missing = list(unheaded_figures(doc))
    assert not missing, missing


def test_the_figure_check_can_fail(tmp_path, monkeypatch):
    doc = tmp_path / 'figures.md'
    doc.write_text('## Speed\n\n2026-01-01, commit abc1234: '
                   '`python tools/x.py`\n\n| a | ms |\n|---|---|\n'
                   '| b | 1.5 |\n\n## Versions\n\n| a | v |\n|---|---|\n'
                   '| torch | 2.14.1 |\n\n## Bare\n\n| a | ms |\n'
                   '|---|---|\n| b | 2.5 |\n')
    monkeypatch.setattr(__import__(__name__), 'ROOT', str(tmp_path))
    assert list(unheaded_figures('figures.md')) == ['figures.md:17']


def test_no_development_history():
    """The text describes the product as it is, not how it got there."""
    history = re.compile(
        r'\bsessions? \d|\(session\b|since session|'
        r'final code|before the (native )?operator|'
        r'earlier (runs?|versions?)|on a day when', re.I)
    hits = [
        f'{doc}: {m.group(0)}' for doc in DOCS
        for m in history.finditer(text(doc))
    ]
    assert not hits, hits
