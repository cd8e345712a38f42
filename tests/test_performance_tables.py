"""tools/analysis_tools/performance_tables.py runs the commands behind
docs/performance.md's tables: every command the document gives is in its
list, and each listed command's options are its tool's."""
import os.path as osp
import re
import sys

import pytest
from helpers import load_tool
from tool_runner import ROOT

tables = load_tool('analysis_tools', 'performance_tables.py')


def listed():
    return {' '.join(cmd) for _, _, _, cmd in tables.COMMANDS}


def test_every_command_of_the_document_is_listed():
    with open(osp.join(ROOT, 'docs', 'performance.md')) as f:
        text = f.read()
    documented = re.findall(r'`python (tools/analysis_tools/[^`]+)`', text)
    assert documented
    missing = [cmd for cmd in documented if cmd not in listed()]
    assert not missing, missing


@pytest.mark.parametrize('script',
                         sorted({cmd[0]
                                 for _, _, _, cmd in tables.COMMANDS}))
def test_listed_options_are_the_tools_own(script):
    tool = load_tool(*script.split('/')[1:])
    for _, _, _, cmd in tables.COMMANDS:
        if cmd[0] == script:
            tool.parse_args(cmd[1:])  # argparse exits on an unknown option


def test_list_names_each_command(capsys):
    tables.main(['--list'])
    out = capsys.readouterr().out.splitlines()
    assert [line.split(':')[0]
            for line in out] == [name for name, *_ in tables.COMMANDS]


def test_a_commands_output_is_printed_as_it_comes_and_kept(tmp_path, capsys):
    path = tmp_path / 'out.txt'
    # The second line waits for the first to be read back from the file,
    # which only a streamed run has written by then.
    code = ('import os, sys, time\n'
            'print("first")\n'
            f'path = {str(path)!r}\n'
            'for _ in range(300):\n'
            '    if "first" in open(path).read():\n'
            '        break\n'
            '    time.sleep(0.1)\n'
            'else:\n'
            '    sys.exit("the first line was not streamed")\n'
            'print("second")\n')
    returncode, _ = tables.run_streamed([sys.executable, '-c', code],
                                        str(path), 'header\n', 'probe')
    assert returncode == 0
    assert capsys.readouterr().out == 'probe| first\nprobe| second\n'
    text = path.read_text()
    assert text.startswith('header\nfirst\nsecond\n') and 'exit: 0' in text
