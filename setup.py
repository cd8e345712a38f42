from setuptools import find_packages, setup


def read_version():
    scope = {}
    with open('sn_mm/version.py') as f:
        exec(f.read(), scope)
    return scope['__version__']


setup(
    name='sn_mm',
    version=read_version(),
    description='Switchable Normalization (SN, SyncSN) for OpenMMLab',
    packages=find_packages(exclude=('tests', 'configs', 'tools')),
    python_requires='>=3.8',
)
