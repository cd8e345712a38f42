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
             'toy-seg.py', 'toy-coco.py'))):
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
