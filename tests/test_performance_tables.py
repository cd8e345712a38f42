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


kernels_ab = load_tool('analysis_tools', 'benchmark_kernels.py')


def test_a_kernels_row_over_processes_gives_median_and_range():
    case = ['8x64x24x24', 'float64', 'eval', '1', 'avx512']
    runs = [{
        'old': (1.0, 0),
        'new': (1.10, 2)
    }, {
        'old': (2.0, 0),
        'new': (1.90, 3)
    }, {
        'old': (1.0, 0),
        'new': (1.02, 2)
    }]
    assert kernels_ab.case_cells(
        case, runs,
        ['old', 'new']) == case + ['1', '1.1', '1.020 (0.950-1.100)', '3']
    assert kernels_ab.case_cells(case, runs[:1],
                                 ['old', 'new'])[-2:] == ['1.100', '2']


def test_kernels_cutoff_tables_name_their_builds():
    args = kernels_ab.parse_args(
        ['--cutoffs', 'HEAD', '--only', 'SN_SUMS', '--processes', '2'])
    [(title, specs, shapes, modes)] = kernels_ab.tables(args)
    assert 'SN_SUMS: 4' in title
    assert specs == ['base=HEAD', 'sums_2=HEAD:SN_SUMS=2']
    assert '1x2048x7x7' in shapes and modes == list(kernels_ab.MODES)


def test_kernels_builds_at_pads_add_to_a_candidates_own():
    assert kernels_ab.placed('old=c5bbb69', 0) == 'old=c5bbb69'
    assert kernels_ab.placed('old=c5bbb69', 32) == 'old_pad32=c5bbb69:pad=32'
    assert kernels_ab.placed('x=.:SN_SUMS=2,pad=16',
                             32) == 'x_pad32=.:SN_SUMS=2,pad=48'


def test_kernels_alone_needs_candidates_in_several_processes():
    for argv in (['--candidate', 'a=.', '--alone'],
                 ['--cutoffs', 'HEAD', '--processes', '2', '--alone']):
        with pytest.raises(SystemExit):
            kernels_ab.parse_args(argv)
    kernels_ab.parse_args(
        ['--candidate', 'a=.', '--processes', '2', '--alone'])
