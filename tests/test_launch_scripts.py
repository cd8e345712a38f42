"""tools/dist_train.sh and dist_test.sh start their Python with torchrun:
the project's .venv where it exists, else the python on PATH, $PYTHON
over both."""
import os
import os.path as osp
import subprocess

import pytest
from tool_runner import ROOT


@pytest.mark.parametrize('script,tool', [('dist_train.sh', 'train.py'),
                                         ('dist_test.sh', 'test.py')])
def test_scripts_run_the_tool_with_the_chosen_python(script, tool):
    # `--help` in the config's place: one process prints the tool's help.
    args = ['bash', osp.join(ROOT, 'tools', script), '--help']
    if script == 'dist_test.sh':
        args.append('--help')  # (CHECKPOINT's place)
    args.append('1')
    env = dict(os.environ, PORT='29533')
    env.pop('PYTHON', None)  # the script's own choice: .venv's here
    result = subprocess.run(
        args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f'usage: {tool}' in result.stdout


def test_scripts_prefer_the_project_venv():
    for script in ('dist_train.sh', 'dist_test.sh', 'slurm_train.sh'):
        with open(osp.join(ROOT, 'tools', script)) as f:
            text = f.read()
        assert 'PYTHON="$ROOT/.venv/bin/python"' in text
        assert '"$PYTHON"' in text and 'exec python' not in text
