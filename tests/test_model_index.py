"""model-index.yml and the metafiles: what OpenMMLab's tooling (mim search)
reads. Every config listed exists, and every config is listed."""
import glob
import os.path as osp

import yaml

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def load(path):
    with open(osp.join(ROOT, path)) as f:
        return yaml.safe_load(f)


def listed_models():
    models = []
    for metafile in load('model-index.yml')['Import']:
        meta = load(metafile)
        collections = {c['Name'] for c in meta['Collections']}
        for c in meta['Collections']:
            assert c['Paper']['Title'].startswith(
                ('Switchable Normalization', 'Switchable Whitening'))
        for model in meta['Models']:
            assert model['In Collection'] in collections, model['Name']
            models.append((metafile, model))
    return models


def test_every_listed_config_exists_and_is_named_after_its_file():
    models = listed_models()
    assert models
    for metafile, model in models:
        config = model['Config']
        assert osp.isfile(osp.join(ROOT, config)), (metafile, config)
        assert osp.dirname(config) == osp.dirname(metafile)
        assert model['Name'] == osp.splitext(osp.basename(config))[0]


def test_every_config_is_listed_once():
    # (configs/deploy holds mmdeploy's deploy configs, not models)
    configs = sorted(
        osp.relpath(p, ROOT)
        for p in glob.glob(osp.join(ROOT, 'configs', '*', '*.py'))
        if not any(d in p for d in ('_base_', f'configs{osp.sep}deploy')))
    listed = sorted(model['Config'] for _, model in listed_models())
    assert listed == configs


def test_results_are_marked_as_the_papers():
    """The paper's numbers stand under 'Paper Results', not 'Results'
    (which OpenMMLab's tools read as the model's own), with the split they
    were measured on; nothing has been trained here."""
    for _, model in listed_models():
        source = model['Metadata']['Results Source']
        assert 'Results' not in model, model['Name']
        if model.get('Paper Results'):
            assert source.startswith(
                ("the paper's Table", "the SW paper's")), model['Name']
            for result in model['Paper Results']:
                assert all(0 < v < 100 for v in result['Metrics'].values())
                if result['Dataset'].startswith('Cityscapes'):
                    # Table 7: the test set; Table 8: the val set
                    split = 'test' if 'Table 7' in source else 'val'
                    assert result['Dataset'] == f'Cityscapes ({split} set)'
        else:
            assert source.startswith('none'), model['Name']
